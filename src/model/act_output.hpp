// Writing a segment's result into an activation held at its width (kernels.hpp's Act): fp32 in place, or computed
// in fp32 in the segment's workspace and rounded into a bf16 activation (the bits a bf16 product rounds it to).
#pragma once
#include <cstddef>

#include "backend/kernels.hpp"
#include "util/error.hpp"

namespace piper {

// Where a result for `a` is computed in fp32: `a` itself, or `room` (SegmentIO::workspace) when `a` is bf16.
inline float* fp32_room(Act a, float* room) {
  PIPER_CHECK(!a.bf16 || room, "a bf16 activation computed without a workspace");
  return a.bf16 ? room : a.f32();
}

// `a` = the n values computed at fp32_room(a, room): rounded into it when it is bf16 (else they are there).
inline void settle(Kernels& k, Act a, const float* computed, size_t n) {
  if (a.bf16) k.to_bf16(a.bits(), computed, n);
}

// y(N,OC) = x(N,C) · w(OC,C)ᵀ + b into the activation y: a bf16 y rounded as the backend writes it (`room`, the
// fp32 values where it needs them).
inline void linear_into(Kernels& k, Act y, float* room, ConstAct x, const float* w, const float* b, int N, int C,
                        int OC) {
  if (y.bf16) return k.linear_forward_to_bf16(y.bits(), x, w, b, N, C, OC, fp32_room(y, room));
  k.linear_forward(y.f32(), x, w, b, N, C, OC);
}

}  // namespace piper
