// CPU causal multi-head self-attention of GPT-2 (the probabilities kept for the backward, fp32 or bf16), in either
// matmul precision: each (sequence, head) on one thread, its products through attention_product.hpp, or in bf16 on
// AMX tiles (attention_tiles.hpp) where the operands fit them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/amx_tiles.hpp"
#include "backend/cpu/attention_product.hpp"
#include "backend/cpu/attention_tiles.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// qkv(B,T,3C) → y(B,T,C); att(B,NH,T,T) = the causal softmax of scale · q kᵀ per head. A bf16 att (kBf16 only):
// each head's softmax in an fp32 tile of this thread, then rounded into att, which P · v reads as it is.
template <bool kBf16>
void attention_forward_in(int threads, float* y, Act att, ConstAct qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t C3 = 3 * int64_t(C);
  const bool tiles = kBf16 && attention_fits_tiles(qkv, att, T, hd);
  int nt = std::min(threads, B * NH);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    static thread_local std::vector<float> tile;  // (T,T) where att is bf16: kept for the next call
    if (att.bf16 && tile.size() < size_t(T) * T) tile.resize(size_t(T) * T);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const ConstAct q = qkv.at(int64_t(b) * T * C3 + h * hd);  // (T,hd), row stride 3C
      const ConstAct k = q.at(C);
      const ConstAct v = q.at(2 * C);
      const int64_t at = int64_t(bh) * T * T;
      float* S = att.bf16 ? tile.data() : att.f32() + at;  // (T,T)
      if (tiles) {
        attention_head_forward_tiles(y + int64_t(b) * T * C + h * hd, C, att.bits() + at, S, q.bits(), k.bits(),
                                     v.bits(), int(C3), T, hd, scale);
        continue;
      }
      // bf16: the scale applied in the softmax's pass (the same float products, a pass over S fewer)
      attention_product<kBf16>(false, true, T, T, hd, kBf16 ? 1.f : scale, q, int(C3), k, int(C3), 0.f, S, T);
      causal_softmax_rows(S, T, kBf16 ? scale : 1.f);
      ConstAct P(S);
      if (att.bf16) {
        cpu::store(att, size_t(at), size_t(T) * T, [&](size_t i) { return S[i]; });
        P = ConstAct(att.bits() + at, true);
      }
      // y = P · v (in bf16 the probabilities rounded as the product's operand; an fp32 att keeps them unrounded)
      attention_product<kBf16>(false, false, T, hd, T, 1.f, P, T, v, int(C3), 0.f, y + int64_t(b) * T * C + h * hd,
                               C);
    }
  }
}

// dqkv(B,T,3C) from dy(B,T,C), qkv and the kept probabilities; scratch: a (T,T) dP per thread. kBf16: each head's
// dy and dS rounded once into bf16 tiles of this thread, which both of their products read.
template <bool kBf16>
void attention_backward_in(int threads, float* dqkv, const float* dy, ConstAct qkv, ConstAct att,
                           float* scratch, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t C3 = 3 * int64_t(C);
  const bool tiles = kBf16 && attention_fits_tiles(qkv, att, T, hd);
  int nt = std::min(threads, B * NH);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    static thread_local std::vector<uint16_t> dy_tile, ds_tile;  // (T,hd) and (T,T), kept for the next call
    if (kBf16 && dy_tile.size() < size_t(T) * hd) dy_tile.resize(size_t(T) * hd);
    if (kBf16 && ds_tile.size() < size_t(T) * T) ds_tile.resize(size_t(T) * T);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      float* dP = scratch + int64_t(omp_get_thread_num()) * T * T;  // (T,T)
      const ConstAct q = qkv.at(int64_t(b) * T * C3 + h * hd);
      const ConstAct k = q.at(C);
      const ConstAct v = q.at(2 * C);
      float* dq = dqkv + int64_t(b) * T * C3 + h * hd;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const ConstAct P = att.at(int64_t(bh) * T * T);  // (T,T)
      const float* dY = dy + int64_t(b) * T * C + h * hd;
      if (tiles) {
        attention_head_backward_tiles(dq, dk, dv, dY, C, q.bits(), k.bits(), v.bits(), int(C3), P.bits(), dP, T, hd,
                                      scale);
        continue;
      }
      ConstAct dYp(dY);  // (T,hd), leading dimension ldy
      int ldy = C;
      if constexpr (kBf16) {
        round_rows(dy_tile.data(), hd, dY, C, T, hd);
        dYp = ConstAct(dy_tile.data(), true), ldy = hd;
      }
      // dP = dY · V^T; dV = P^T · dY
      attention_product<kBf16>(false, true, T, T, hd, 1.f, dYp, ldy, v, int(C3), 0.f, dP, T);
      attention_product<kBf16>(true, false, T, hd, T, 1.f, P, T, dYp, ldy, 0.f, dv, int(C3));
      // dS = P ⊙ (dP − Σ_j P dP), causal, with P as att holds it (a bf16 att widened); kBf16: into the bf16 tile
      for (int t = 0; t < T; ++t) {
        float* __restrict d = dP + int64_t(t) * T;
        cpu::with_storage(P.at(int64_t(t) * T), [&](const auto* __restrict p) {
          const float dot = vec::lane_sum(t + 1, [&](int j) { return cpu::value(p, j) * d[j]; });
          if constexpr (kBf16) {
            uint16_t* __restrict ds = ds_tile.data() + int64_t(t) * T;
            for (int j = 0; j <= t; ++j) ds[j] = bf16_bits(cpu::value(p, j) * (d[j] - dot));
            for (int j = t + 1; j < T; ++j) ds[j] = 0;
          } else {
            for (int j = 0; j <= t; ++j) d[j] = cpu::value(p, j) * (d[j] - dot);
            for (int j = t + 1; j < T; ++j) d[j] = 0.f;
          }
        });
      }
      const ConstAct dS = kBf16 ? ConstAct(ds_tile.data(), true) : ConstAct(dP);  // (T,T)
      // dQ = dS · K · scale; dK = dS^T · Q · scale
      attention_product<kBf16>(false, false, T, hd, T, scale, dS, T, k, int(C3), 0.f, dq, int(C3));
      attention_product<kBf16>(true, false, T, hd, T, scale, dS, T, q, int(C3), 0.f, dk, int(C3));
    }
  }
}

}  // namespace

// In bf16 matmul precision every product goes through the bf16 gemm, oneDNN where the processor has bf16
// instructions: faster than rounding the operands for cblas_sgemm on the quickstart shapes (B=16 T=128 C=256 NH=8,
// 2 threads, best of 20): forward 2.7 ms, backward 3.6 ms, against 2.9 and 4.4 ms rounded (bf16_gemm's path without
// bf16 instructions, PIPER_BF16_GEMM=rounded) and 2.8 and 4.5 ms in fp32.
void CpuKernels::attention_forward(float* y, Act att, ConstAct qkv, int B, int T, int C, int NH) {
  PIPER_CHECK((!qkv.bf16 && !att.bf16) || matmul_ == Precision::Bf16,
              "attention_forward: a bf16 qkv or att in fp32 matmul precision");
  if (matmul_ == Precision::Bf16) attention_forward_in<true>(threads_, y, att, qkv, B, T, C, NH);
  else attention_forward_in<false>(threads_, y, att, qkv, B, T, C, NH);
}

size_t CpuKernels::attention_scratch_floats(int, int T, int, int) const { return size_t(threads_) * T * T; }

void CpuKernels::attention_backward(float* dqkv, const float* dy, ConstAct qkv, ConstAct att, float* scratch,
                                    int B, int T, int C, int NH) {
  PIPER_CHECK((!qkv.bf16 && !att.bf16) || matmul_ == Precision::Bf16,
              "attention_backward: a bf16 qkv or att in fp32 matmul precision");
  if (matmul_ == Precision::Bf16) attention_backward_in<true>(threads_, dqkv, dy, qkv, att, scratch, B, T, C, NH);
  else attention_backward_in<false>(threads_, dqkv, dy, qkv, att, scratch, B, T, C, NH);
}

}  // namespace piper
