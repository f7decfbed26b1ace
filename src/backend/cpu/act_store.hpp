// Writing a CPU kernel's results into an activation at its width (kernels.hpp's Act): fp32 as computed, or each value
// rounded to bf16 (nearest, ties to even) as it is stored; and reading one back. One loop per width, so that each
// vectorizes.
#pragma once
#include <cstddef>

#include "backend/kernels.hpp"
#include "util/error.hpp"
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

// An element of an activation's storage as fp32: as it is, or bf16 bits widened (exact).
inline float value(const float* p, size_t i) { return p[i]; }
inline float value(const uint16_t* p, size_t i) { return bf16_value(p[i]); }

// f(a's storage) as a typed pointer (one loop per width).
template <typename F>
inline void with_storage(ConstAct a, F f) {
  if (a.bf16) f(a.bits());
  else f(a.f32());
}

// f(a's storage, b's storage) for two activations that `call` needs at one width (an error otherwise).
template <typename F>
inline void with_storage(const char* call, ConstAct a, ConstAct b, F f) {
  PIPER_CHECK(a.bf16 == b.bf16, call, ": inputs of different widths");
  if (a.bf16) f(a.bits(), b.bits());
  else f(a.f32(), b.f32());
}

}  // namespace piper::cpu
