// The CUDA backend's communicator of a one-rank group: every collective is a copy on the caller's stream
// (or nothing), so a group of one never goes through NCCL's set-up.
#pragma once
#include <mpi.h>

#include <memory>

#include "backend/backend.hpp"

namespace piper {

// Over `comm` (one member; taken over).
std::unique_ptr<Communicator> make_local_communicator(MPI_Comm comm);

}  // namespace piper
