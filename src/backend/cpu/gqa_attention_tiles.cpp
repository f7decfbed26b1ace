// Grouped-query attention on AMX tiles (see gqa_attention_tiles.hpp): per query block, S = q kᵀ and
// dP = dY vᵀ on the lower tiles, P·v and dS·k up to the diagonal, dkᵀ and dvᵀ summed over the group's blocks.
#include "backend/cpu/gqa_attention_tiles.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/amx_tiles.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

namespace {

// This thread's packed operands and fp32 sums, grown once and kept for later heads and calls.
struct GqaScratch {
  std::vector<uint16_t> k_t, v_t, k_rows, v_rows;  // kᵀ, vᵀ (D,T) and k, v (T,D) as B operands
  std::vector<uint16_t> p, ds, pairs;              // P and dS rounded (block,T); one of them as a B operand
  std::vector<uint16_t> dy, dyt, qt;               // a block's dY rounded (block,D), dYᵀ and qᵀ (D,block)
  std::vector<float> out, dkt, dvt, drow;          // dQ of a block (block,D); dkᵀ, dvᵀ (D,T); dy·y (T)
  void fit(int block, int T, int D) {
    const size_t td = size_t(T) * D, bt = size_t(block) * T, bd = size_t(block) * D;
    for (auto* v : {&k_t, &v_t, &k_rows, &v_rows})
      if (v->size() < td) v->resize(td);
    for (auto* v : {&p, &ds, &pairs})
      if (v->size() < bt) v->resize(bt);
    for (auto* v : {&dy, &dyt, &qt})
      if (v->size() < bd) v->resize(bd);
    if (out.size() < bd) out.resize(bd);
    for (auto* v : {&dkt, &dvt})
      if (v->size() < td) v->resize(td);
    if (drow.size() < size_t(T)) drow.resize(size_t(T));
  }
};
thread_local GqaScratch t_gqa;

}  // namespace

bool bf16_attention_on_tiles() {
  static const bool on = [] {
    const char* env = std::getenv("PIPER_BF16_ATTENTION");
    const std::string asked = env ? env : "";
    if (!asked.empty() && asked != "tiles" && asked != "gemm")
      throw UserError(cat("PIPER_BF16_ATTENTION = \"", asked, "\": expected \"tiles\" or \"gemm\" (or unset: tiles "
                          "where the processor has AMX)"));
    std::string why;
    const bool available = amx_tiles_available(&why);
    if (asked == "tiles" && !available) throw UserError(cat("PIPER_BF16_ATTENTION = \"tiles\" but ", why));
    return available && asked != "gemm";
  }();
  return on;
}

bool gqa_fits_tiles(ConstAct q, ConstAct k, ConstAct v, int T, int D, int block) {
  return q.bf16 && k.bf16 && v.bf16 && T > 0 && T % 32 == 0 && D % 32 == 0 && block % 32 == 0 &&
         bf16_attention_on_tiles();
}

void gqa_head_forward_tiles(float* y, int ys, float* lse, const uint16_t* q, int qs, const uint16_t* k,
                            const uint16_t* v, int ks, float* S, int block, int T, int D, float scale) {
  GqaScratch& s = t_gqa;
  s.fit(block, T, D);
  vnni_from_transposed(s.k_t.data(), k, ks, D, T);  // kᵀ (D,T)
  vnni_from_rows(s.v_rows.data(), v, ks, T, D);     // v (T,D)
  for (int i0 = 0; i0 < T; i0 += block) {
    const int i1 = std::min(T, i0 + block), rows = i1 - i0;
    // S (rows,i1) = q_blk kᵀ[:, 0:i1] on the lower tiles, then scaled as the gemm path scales its sums
    amx_product(rows, i1, D, q + int64_t(i0) * qs, qs, s.k_t.data(), S, i1,
                {.lower_tiles_only = true, .row0 = i0, .ldb = T});
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      float* __restrict row = S + int64_t(r) * i1;
      for (int j = 0; j <= i; ++j) row[j] *= scale;
      const float mx = vec::lane_max(row, i + 1);
      for (int j = 0; j <= i; ++j) row[j] = vec::exp_approx(row[j] - mx);
      const float sum = vec::lane_sum(i + 1, [&](int j) { return row[j]; });
      const float inv = 1.0f / sum;
      uint16_t* __restrict p = s.p.data() + int64_t(r) * i1;
      for (int j = 0; j <= i; ++j) p[j] = bf16_bits(row[j] * inv);
      for (int j = i + 1; j < i1; ++j) p[j] = 0;
      lse[i] = mx + std::log(sum);
    }
    // y_blk (rows,D) = P v[0:i1]
    amx_product(rows, D, i1, s.p.data(), i1, s.v_rows.data(), y + int64_t(i0) * ys, ys,
                {.sums = TileSums::UpToRow, .row0 = i0});
  }
}

void gqa_group_backward_tiles(const GqaGroup& g, float* P, float* dS, int block, int T, int D, float scale) {
  GqaScratch& s = t_gqa;
  s.fit(block, T, D);
  vnni_from_transposed(s.k_t.data(), g.k, g.ks, D, T);  // kᵀ (D,T)
  vnni_from_transposed(s.v_t.data(), g.v, g.ks, D, T);  // vᵀ (D,T)
  vnni_from_rows(s.k_rows.data(), g.k, g.ks, T, D);     // k (T,D)
  std::fill(s.dkt.begin(), s.dkt.begin() + int64_t(T) * D, 0.f);
  std::fill(s.dvt.begin(), s.dvt.begin() + int64_t(T) * D, 0.f);
  for (int h = 0; h < g.G; ++h) {
    const int64_t off = int64_t(h) * D;  // the head's columns in every operand
    const float* lh = g.lse + int64_t(h) * T;
    // Σ_j P_ij dP_ij = dy_i · y_i for every row first: independent loads of y's scattered rows, overlapped
    float* drow = s.drow.data();
    for (int i = 0; i < T; ++i) {
      const float* __restrict gi = g.dy + off + int64_t(i) * g.ys;
      cpu::with_storage(g.y.at(off + int64_t(i) * g.ys), [&](const auto* __restrict yi) {
        drow[i] = vec::lane_sum(D, [&](int c) { return gi[c] * cpu::value(yi, c); });
      });
    }
    for (int i0 = 0; i0 < T; i0 += block) {
      const int i1 = std::min(T, i0 + block), rows = i1 - i0;
      const uint16_t* q_blk = g.q + off + int64_t(i0) * g.qs;  // (rows,D)
      const float* dy_blk = g.dy + off + int64_t(i0) * g.ys;   // (rows,D)
      round_rows(s.dy.data(), D, dy_blk, g.ys, rows, D);  // dY rounded (rows,D), and transposed
      transpose_bits(s.dyt.data(), s.dy.data(), D, rows, D);
      // P = exp(scale · q_blk kᵀ − lse) and dP = dY vᵀ on the lower tiles
      amx_product(rows, i1, D, q_blk, g.qs, s.k_t.data(), P, i1, {.lower_tiles_only = true, .row0 = i0, .ldb = T});
      amx_product(rows, i1, D, s.dy.data(), D, s.v_t.data(), dS, i1,
                  {.lower_tiles_only = true, .row0 = i0, .ldb = T});
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        float* __restrict p = P + int64_t(r) * i1;
        float* __restrict d = dS + int64_t(r) * i1;
        const float l = lh[i], di = drow[i];
        uint16_t* __restrict pr = s.p.data() + int64_t(r) * i1;
        uint16_t* __restrict dr = s.ds.data() + int64_t(r) * i1;
        for (int j = 0; j <= i; ++j) {
          const float pj = vec::exp_approx(p[j] * scale - l);
          pr[j] = bf16_bits(pj);
          dr[j] = bf16_bits(pj * (d[j] - di));  // dS = P ∘ (dP − Drow)
        }
        for (int j = i + 1; j < i1; ++j) pr[j] = dr[j] = 0;
      }
      // dQ_blk (rows,D) = scale · dS k[0:i1]
      amx_product(rows, D, i1, s.ds.data(), i1, s.k_rows.data(), s.out.data(), D,
                  {.sums = TileSums::UpToRow, .row0 = i0});
      store_scaled(g.dq + off + int64_t(i0) * g.qs, g.qs, s.out.data(), D, rows, D, scale);
      // dkᵀ[:, 0:i1] += q_blkᵀ dS; dvᵀ[:, 0:i1] += dY_blkᵀ P
      transpose_bits(s.qt.data(), q_blk, g.qs, rows, D);
      vnni_from_rows(s.pairs.data(), s.ds.data(), i1, rows, i1);
      amx_product(D, i1, rows, s.qt.data(), rows, s.pairs.data(), s.dkt.data(), T, {.accumulate = true});
      vnni_from_rows(s.pairs.data(), s.p.data(), i1, rows, i1);
      amx_product(D, i1, rows, s.dyt.data(), rows, s.pairs.data(), s.dvt.data(), T, {.accumulate = true});
    }
  }
  store_transposed(g.dk, g.ks, s.dkt.data(), T, D, scale);  // summed unscaled, scaled once
  store_transposed(g.dv, g.ks, s.dvt.data(), T, D, 1.f);
}

}  // namespace piper
