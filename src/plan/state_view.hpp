// What checkpoints read and write of one rank's training state: its plan, where each of its buffers lives
// on the device, the kernels that move bytes to and from there, the data file it trains on, and its world.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>

#include "backend/kernels.hpp"
#include "data/data.hpp"
#include "plan/plan.hpp"

namespace piper {

struct StateView {
  const Plan& plan;
  Kernels& kernels;                               // upload/download between host and the buffers
  std::function<float*(int32_t buf)> buffer;      // the device memory of plan buffer `buf`
  const FileIdentity& data;                       // the token file as this rank opened it
  MPI_Comm world;

  // Element `offset` of buffer `buf`.
  float* at(int32_t buf, int64_t offset) const { return buffer(buf) + offset; }
};

}  // namespace piper
