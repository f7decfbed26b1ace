// Factory of the CUDA backend's communicator: NCCL collectives over an MPI communicator's members and
// NCCL point-to-point transfers with world-rank peers (see nccl_communicator.cpp).
#pragma once
#include <mpi.h>

#include <memory>

#include "backend/backend.hpp"

namespace piper {

// Collective over the members of `comm`, which it takes ownership of; `device` is this rank's GPU. Without
// `collectives` no NCCL communicator over all members is made (point-to-point channels only, by connect).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MPI_Comm world, int device, bool collectives);

}  // namespace piper
