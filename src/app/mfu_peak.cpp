// The MFU peak of a rank (mfu_peak.hpp): set, measured on the CPU with the run's own matmul, or a GPU's datasheet.
// Dense peaks of an H100/H200 SXM: 67 TFLOP/s fp32 without tensor cores, 989 TFLOP/s bf16 on tensor cores.
#include "app/mfu_peak.hpp"

#include <algorithm>

#include "util/error.hpp"
#include "util/timer.hpp"

namespace piper {

MfuPeak mfu_peak(const Plan& plan, Backend& backend) {
  if (plan.peak_tflops > 0) return {plan.peak_tflops * 1e12, cat(plan.peak_tflops, " TFLOP/s a rank (job.peak_tflops)")};
  const bool bf16 = plan.precision == Precision::Bf16;
  if (plan.backend == "cuda")
    return bf16 ? MfuPeak{989e12, "989 TFLOP/s a rank (an H100/H200's dense bf16; job.peak_tflops sets another)"}
                : MfuPeak{67e12, "67 TFLOP/s a rank (an H100/H200's fp32 without tensor cores; job.peak_tflops sets "
                                 "another)"};
  // y(N,OC) = x(N,C) · w(OC,C)^T in this run's shape: the width handed between segments into the widest layer, over a
  // microbatch's rows (at most 1 GFLOP a call), timed after one warm-up call; the best of eight (a shared machine's
  // calls vary by 2x)
  const ModelDims& d = plan.dims;
  const int64_t C = std::max(1, d.act_width), OC = std::max<int64_t>(C, d.d_ff > 0 && d.d_model == C ? d.d_ff : C);
  const int64_t rows = int64_t(d.rows_per_sample) * std::max(1, plan.samples_per_replica / std::max(1, plan.microbatches));
  const int64_t N = std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(1e9 / (2.0 * double(C) * double(OC)))));
  const size_t bytes = sizeof(float) * size_t(N * C + OC * C + N * OC);
  auto* x = static_cast<float*>(backend.allocate(bytes));
  float* w = x + N * C;
  float* y = w + OC * C;
  Kernels& k = backend.kernels();
  k.fill(x, 0.5f, size_t(N * C));
  k.fill(w, 0.25f, size_t(OC * C));
  double best = 1e300;
  for (int rep = 0; rep < 9; ++rep) {
    const double t0 = now_seconds();
    k.linear_forward(y, x, w, nullptr, int(N), int(C), int(OC));
    if (rep > 0) best = std::min(best, now_seconds() - t0);
  }
  backend.release(x, bytes);
  const double flops = 2.0 * double(N) * double(C) * double(OC) / std::max(best, 1e-9);
  return {flops, cat(int(flops / 1e9 + 0.5), " GFLOP/s a rank (this rank's ", bf16 ? "bf16 " : "", "matmul of the model's "
                     "shape (", N, ",", C, ")x(", C, ",", OC, "), measured at start; job.peak_tflops sets another)")};
}

}  // namespace piper
