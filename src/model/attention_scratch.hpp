// The scratch of Kernels::gqa_attention_backward as the compiler estimates it without a backend: the larger of
// the CPU's and CUDA's (GPT-2's and Qwen3's attention both call it).
#pragma once
#include <algorithm>
#include <cstdint>

namespace piper {

// CPU: two (64 × T) score tiles per thread; CUDA: one float per (sequence, query head, row).
inline uint64_t attention_scratch_estimate_bytes(int samples, int heads, int T, int threads) {
  const uint64_t cpu = uint64_t(threads) * 2 * 64 * uint64_t(T);
  const uint64_t gpu = uint64_t(samples) * uint64_t(heads) * uint64_t(T);
  return std::max(cpu, gpu) * sizeof(float);
}

}  // namespace piper
