// Fallback communicator of the CUDA backend for ranks that share a GPU (NCCL needs one device per rank):
// MPI on host copies of the device data. See host_staged_communicator.cpp.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "backend/backend.hpp"

namespace piper {

// The GPU's UUID as nvidia-smi prints it (its PCI bus id where the UUID cannot be read).
std::string gpu_uuid(int device);
// Whether two members of `comm` run on the same GPU (collective over `comm`), by host name and GPU UUID:
// ranks that each see one GPU as device 0 (CUDA_VISIBLE_DEVICES per rank) run on different GPUs.
bool members_share_a_gpu(MPI_Comm comm, int device);
// Collectives and point-to-point over `comm` (taken over) through host memory.
std::unique_ptr<Communicator> make_host_staged_communicator(MPI_Comm comm, MPI_Comm world);

}  // namespace piper
