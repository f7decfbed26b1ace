// Writing a CPU kernel's results into an activation at its width (kernels.hpp's Act): fp32 as computed, or each value
// rounded to bf16 (nearest, ties to even) as it is stored. One loop per width, so that each vectorizes.
#pragma once
#include <cstddef>

#include "backend/kernels.hpp"
#include "util/precision.hpp"

namespace piper::cpu {

// y[at + i] = value(i) for i < n.
template <typename Value>
inline void store(Act y, size_t at, size_t n, Value value) {
  if (y.bf16) {
    uint16_t* __restrict out = y.bits() + at;
    for (size_t i = 0; i < n; ++i) out[i] = bf16_bits(value(i));
  } else {
    float* __restrict out = y.f32() + at;
    for (size_t i = 0; i < n; ++i) out[i] = value(i);
  }
}

}  // namespace piper::cpu
