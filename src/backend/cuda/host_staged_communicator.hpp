// Fallback communicator of the CUDA backend for ranks that share a GPU (NCCL needs one device per rank):
// MPI on host copies of the device data. See host_staged_communicator.cpp.
#pragma once
#include <mpi.h>

#include <memory>

#include "backend/backend.hpp"

namespace piper {

// Whether two members of `comm` run on the same GPU of the same node (collective over `comm`).
bool members_share_a_gpu(MPI_Comm comm, int device);
// Collectives and point-to-point over `comm` (taken over) through host memory.
std::unique_ptr<Communicator> make_host_staged_communicator(MPI_Comm comm, MPI_Comm world);

}  // namespace piper
