// The MPI reduction of bf16 values (util/precision.hpp's format) for gradient reductions that travel in bf16:
// each addition in fp32, its sum rounded to bf16 (nearest, ties to even), as NCCL's ncclBfloat16 sum does.
#pragma once
#include <mpi.h>

namespace piper {

// MPI_Op summing MPI_UINT16_T elements read as bf16; created once per process, on first use.
MPI_Op bf16_sum_op();

}  // namespace piper
