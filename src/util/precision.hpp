// The precision of a run (job.precision): fp32 throughout, or bf16 mixed precision (bf16 matmul operands with
// fp32 accumulation, fp32 master weights and optimizer), and bf16 rounding shared by every layer that needs it.
#pragma once
#include <cstdint>
#include <cstring>

namespace piper {

enum class Precision : uint8_t { Fp32 = 0, Bf16 = 1 };

inline const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

// x rounded to the nearest bf16, ties to even, as bits (the top half of the rounded fp32); NaN stays a (quiet) NaN.
// Without branches, so that loops over it vectorize.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// x rounded to the nearest bf16 value (ties to even), kept as an fp32.
inline float round_bf16(float x) { return bf16_value(bf16_bits(x)); }

}  // namespace piper
