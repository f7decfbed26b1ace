// The peak a rank's MFU is measured against (the step lines' "MFU"): job.peak_tflops when set; on a CPU, the
// rate of this backend's linear matmul in the model's widest shape, measured at start; on CUDA, the GPU's
// datasheet peak.
#pragma once
#include <string>

#include "backend/backend.hpp"
#include "plan/plan.hpp"

namespace piper {

struct MfuPeak {
  double flops = 0;   // FLOP/s of one rank
  std::string what;   // where the number comes from, for the start line
};

// Call on one rank with the run's matmul precision already set; on the CPU times a few linear_forward calls of the
// model's own widest shape (at most 1 GFLOP each, nine of them).
MfuPeak mfu_peak(const Plan& plan, Backend& backend);

}  // namespace piper
