// CPU causal grouped-query attention (and multi-head, KV = H: GPT-2's), flash style: blocks of query rows against
// the keys they may see, so only one (rows × T) score tile per thread exists at a time and the masked upper half is
// never multiplied; in bf16 on AMX tiles (gqa_attention_tiles.hpp) where the operands fit them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/attention_product.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/gqa_attention_tiles.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

constexpr int kQueryBlock = 64;  // query rows per score tile

// q(B,T,H,D), k and v (B,T,KV,D) → y(B,T,H,D) and lse(B,H,T); in bf16 the probabilities are rounded after their
// normalisation, as the operand of P · V. Row strides: qs of q, ks of k and v, ys = H·D of y.
template <bool kBf16>
void gqa_forward_in(int threads, float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T, int H,
                    int KV, int D, int qs, int ks) {
  const int G = H / KV;  // query heads per key/value head
  const float scale = 1.0f / std::sqrt(float(D));
  const int ys = H * D;
  const int pairs = B * H;
  const bool tiles = kBf16 && gqa_fits_tiles(q, k, v, T, D, kQueryBlock);
  const int nt = std::min(threads, pairs);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    std::vector<float> tile(size_t(kQueryBlock) * T);  // S, then P: (rows, i1)
#pragma omp for schedule(static)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / H, h = bh % H, kvh = h / G;
      const ConstAct qb = q.at(int64_t(b) * T * qs + int64_t(h) * D);    // (T,D), row stride qs
      const ConstAct kb = k.at(int64_t(b) * T * ks + int64_t(kvh) * D);  // (T,D), row stride ks
      const ConstAct vb = v.at(int64_t(b) * T * ks + int64_t(kvh) * D);  // (T,D), row stride ks
      float* yb = y + int64_t(b) * T * ys + int64_t(h) * D;          // (T,D), row stride ys
      float* lb = lse + int64_t(bh) * T;                             // (T)
      if (tiles) {
        gqa_head_forward_tiles(yb, ys, lb, qb.bits(), qs, kb.bits(), vb.bits(), ks, tile.data(), kQueryBlock, T,
                               D, scale);
        continue;
      }
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock), rows = i1 - i0;
        float* S = tile.data();  // (rows, i1): query rows [i0,i1) against keys [0,i1)
        attention_product<kBf16>(false, true, rows, i1, D, scale, qb.at(int64_t(i0) * qs), qs, kb, ks, 0.f, S, i1);
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          float* __restrict row = S + int64_t(r) * i1;
          const float mx = vec::lane_max(row, i + 1);
          for (int j = 0; j <= i; ++j) row[j] = vec::exp_approx(row[j] - mx);
          const float sum = vec::lane_sum(i + 1, [&](int j) { return row[j]; });
          const float inv = 1.0f / sum;
          for (int j = 0; j <= i; ++j) row[j] *= inv;
          for (int j = i + 1; j < i1; ++j) row[j] = 0.f;  // causal mask inside the diagonal block
          lb[i] = mx + std::log(sum);
        }
        // Y_blk(rows,D) = P(rows,i1) · V[0:i1](i1,D)
        attention_product<kBf16>(false, false, rows, D, i1, 1.f, S, i1, vb, ks, 0.f, yb + int64_t(i0) * ys, ys);
      }
    }
  }
}

// dq, dk, dv from dy, with P recomputed from q, k and lse. One thread owns a (sequence, key/value head): it alone
// writes that group's dk and dv rows and the dq of its query heads, in a fixed order, so there are no races and the
// bits do not depend on the thread count. Row strides: qs of q and dq, ks of k, v, dk and dv, ys = H·D of y and dy.
template <bool kBf16>
void gqa_backward_in(int threads, float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                     ConstAct v, ConstAct y, const float* lse, float* scratch, int B, int T, int H, int KV,
                     int D, int qs, int ks) {
  const int G = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ys = H * D;
  const size_t tile = size_t(kQueryBlock) * T;
  const int pairs = B * KV;
  const bool tiles = kBf16 && gqa_fits_tiles(q, k, v, T, D, kQueryBlock);
  const int nt = std::min(threads, pairs);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int bk = 0; bk < pairs; ++bk) {
    const int b = bk / KV, kvh = bk % KV;
    float* P = scratch + size_t(omp_get_thread_num()) * 2 * tile;  // (rows, i1)
    float* dS = P + tile;                                           // (rows, i1): dP, then dS
    const ConstAct kb = k.at(int64_t(b) * T * ks + int64_t(kvh) * D);  // (T,D), row stride ks
    const ConstAct vb = v.at(int64_t(b) * T * ks + int64_t(kvh) * D);
    float* dkb = dk + int64_t(b) * T * ks + int64_t(kvh) * D;
    float* dvb = dv + int64_t(b) * T * ks + int64_t(kvh) * D;
    if (tiles) {
      const int64_t first = int64_t(b) * T * qs + int64_t(kvh) * G * D;   // the group's first query head in q, dq
      const int64_t yfirst = int64_t(b) * T * ys + int64_t(kvh) * G * D;  // ... in y, dy
      const GqaGroup group{dq + first, dkb, dvb, dy + yfirst, q.bits() + first, kb.bits(), vb.bits(), y.at(yfirst),
                           lse + (int64_t(b) * H + int64_t(kvh) * G) * T, G, qs, ks, ys};
      gqa_group_backward_tiles(group, P, dS, kQueryBlock, T, D, scale);
      continue;
    }
    for (int t = 0; t < T; ++t) {
      std::memset(dkb + int64_t(t) * ks, 0, sizeof(float) * size_t(D));
      std::memset(dvb + int64_t(t) * ks, 0, sizeof(float) * size_t(D));
    }
    for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
      const int64_t off = int64_t(b) * T * qs + int64_t(h) * D, yoff = int64_t(b) * T * ys + int64_t(h) * D;
      const ConstAct qb = q.at(off);     // (T,D), row stride qs
      const float* dyb = dy + yoff;      // (T,D), row stride ys
      const ConstAct yb = y.at(yoff);    // (T,D), row stride ys
      float* dqb = dq + off;             // (T,D), row stride qs
      const float* lb = lse + (int64_t(b) * H + h) * T;  // (T)
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock), rows = i1 - i0;
        const ConstAct Qblk = qb.at(int64_t(i0) * qs);  // (rows,D)
        const float* dYblk = dyb + int64_t(i0) * ys;  // (rows,D)
        // P = exp(scale · Q_blk K[0:i1]^T − lse), zero above the diagonal (in bf16 the scale applied below)
        attention_product<kBf16>(false, true, rows, i1, D, kBf16 ? 1.f : scale, Qblk, qs, kb, ks, 0.f, P, i1);
        // dP = dY_blk · V[0:i1]^T
        attention_product<kBf16>(false, true, rows, i1, D, 1.f, dYblk, ys, vb, ks, 0.f, dS, i1);
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          float* __restrict p = P + int64_t(r) * i1;
          float* __restrict d = dS + int64_t(r) * i1;
          const float* __restrict gi = dYblk + int64_t(r) * ys;
          float drow = 0.f;  // Σ_j P_ij dP_ij = dy_i · y_i
          cpu::with_storage(yb.at(int64_t(i) * ys), [&](const auto* __restrict yi) {
            drow = vec::lane_sum(D, [&](int c) { return gi[c] * cpu::value(yi, c); });
          });
          const float l = lb[i];
          for (int j = 0; j <= i; ++j) {
            p[j] = vec::exp_approx((kBf16 ? p[j] * scale : p[j]) - l);
            d[j] = p[j] * (d[j] - drow);  // dS = P ∘ (dP − Drow)
          }
          for (int j = i + 1; j < i1; ++j) p[j] = d[j] = 0.f;
        }
        // dQ_blk(rows,D) = scale · dS · K[0:i1]
        attention_product<kBf16>(false, false, rows, D, i1, scale, dS, i1, kb, ks, 0.f, dqb + int64_t(i0) * qs, qs);
        // dK[0:i1](i1,D) += scale · dS^T · Q_blk (in bf16 summed unscaled, scaled once below);
        // dV[0:i1](i1,D) += P^T · dY_blk
        attention_product<kBf16>(true, false, i1, D, rows, kBf16 ? 1.f : scale, dS, i1, Qblk, qs, 1.f, dkb, ks);
        attention_product<kBf16>(true, false, i1, D, rows, 1.f, P, i1, dYblk, ys, 1.f, dvb, ks);
      }
    }
    if constexpr (kBf16)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < D; ++c) dkb[int64_t(t) * ks + c] *= scale;
  }
}

// q, k and v at one width, bf16 only in bf16 matmul precision.
void check_attention_inputs(const char* call, ConstAct q, ConstAct k, ConstAct v, Precision matmul) {
  PIPER_CHECK(q.bf16 == k.bf16 && k.bf16 == v.bf16, call, ": q, k and v at different widths");
  PIPER_CHECK(!q.bf16 || matmul == Precision::Bf16, call, ": bf16 q, k, v in fp32 matmul precision");
}

}  // namespace

size_t CpuKernels::gqa_attention_scratch_floats(int, int T, int, int, int) const {
  return size_t(threads_) * 2 * kQueryBlock * size_t(T > 0 ? T : 0);  // per thread: P and dS tiles (64, T)
}

// bf16 matmul precision: every product through the bf16 gemm, oneDNN where the processor has bf16 instructions (the
// scale applied to the fp32 sums), or on AMX tiles (gqa_attention_tiles.hpp).
void CpuKernels::gqa_attention_forward(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T, int H,
                                       int KV, int D, HeadRows rows) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  check_attention_inputs("gqa_attention_forward", q, k, v, matmul_);
  const HeadRows r = rows.resolved(H, KV, D);
  auto in = matmul_ == Precision::Bf16 ? gqa_forward_in<true> : gqa_forward_in<false>;
  in(threads_, y, lse, q, k, v, B, T, H, KV, D, int(r.q), int(r.kv));
}

void CpuKernels::gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                                        ConstAct v, ConstAct y, const float* lse, float* scratch, int B, int T,
                                        int H, int KV, int D, HeadRows rows) {
  if (B <= 0 || T <= 0 || KV <= 0) return;
  check_attention_inputs("gqa_attention_backward", q, k, v, matmul_);
  const HeadRows r = rows.resolved(H, KV, D);
  auto in = matmul_ == Precision::Bf16 ? gqa_backward_in<true> : gqa_backward_in<false>;
  in(threads_, dq, dk, dv, dy, q, k, v, y, lse, scratch, B, T, H, KV, D, int(r.q), int(r.kv));
}

}  // namespace piper
