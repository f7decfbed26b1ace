// GPT-2's attention per head on AMX tiles (see attention_tiles.hpp): the seven products of a head as tile products,
// the transposed ones (dV, dK) computed as their transposes so that every A operand is row-major.
#include "backend/cpu/attention_tiles.hpp"

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/amx_tiles.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

namespace {

// This thread's packed operands, grown once and kept for later heads and calls.
struct Scratch {
  std::vector<uint16_t> b;         // a B operand in tile pairs (K,N)
  std::vector<uint16_t> a;         // a transposed A operand (hd,T)
  std::vector<uint16_t> dy;        // dY rounded (T,hd)
  std::vector<uint16_t> dyt;       // dYᵀ rounded (hd,T)
  std::vector<uint16_t> ds;        // dS rounded (T,T)
  std::vector<uint16_t> ds_pairs;  // dS as a B operand (T,T)
  std::vector<uint16_t> p_pairs;   // P as a B operand (T,T)
  std::vector<float> out;          // a product's (T,hd) or (hd,T) fp32 result
  void fit(int T, int hd) {
    const size_t th = size_t(T) * hd, tt = size_t(T) * T;
    if (b.size() < tt) b.resize(tt);
    for (auto* v : {&a, &dy, &dyt})
      if (v->size() < th) v->resize(th);
    for (auto* v : {&ds, &ds_pairs, &p_pairs})
      if (v->size() < tt) v->resize(tt);
    if (out.size() < th) out.resize(th);
  }
};
thread_local Scratch t_scratch;

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

bool attention_fits_tiles(ConstAct qkv, ConstAct att, int T, int hd) {
  return qkv.bf16 && att.bf16 && T % 32 == 0 && hd % 32 == 0 && T > 0 && bf16_attention_on_tiles();
}

void causal_softmax_rows(float* S, int T, float row_scale) {
  for (int t = 0; t < T; ++t) {
    float* __restrict row = S + int64_t(t) * T;
    const float mx = row_scale * vec::lane_max(row, t + 1);  // row_scale > 0: the max of the scaled row
    for (int j = 0; j <= t; ++j) row[j] = vec::exp_approx(row_scale * row[j] - mx);
    const float sum = vec::lane_sum(t + 1, [&](int j) { return row[j]; });
    const float inv = 1.0f / sum;
    for (int j = 0; j <= t; ++j) row[j] *= inv;
    for (int j = t + 1; j < T; ++j) row[j] = 0.f;
  }
}

void attention_head_forward_tiles(float* y, int ldy, uint16_t* P, float* S, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, int ld, int T, int hd, float scale) {
  Scratch& s = t_scratch;
  s.fit(T, hd);
  // S = q kᵀ on the lower tiles, its softmax, P rounded
  vnni_from_transposed(s.b.data(), k, ld, hd, T);
  amx_product(T, T, hd, q, ld, s.b.data(), S, T, {.lower_tiles_only = true});
  causal_softmax_rows(S, T, scale);
  round_rows(P, T, S, T, T, T);
  // y = P v
  vnni_from_rows(s.b.data(), v, ld, T, hd);
  amx_product(T, hd, T, P, T, s.b.data(), y, ldy, {.sums = TileSums::UpToRow});
}

void attention_head_backward_tiles(float* dq, float* dk, float* dv, const float* dY, int ldy, const uint16_t* q,
                                   const uint16_t* k, const uint16_t* v, int ld, const uint16_t* P, float* dP, int T,
                                   int hd, float scale) {
  Scratch& s = t_scratch;
  s.fit(T, hd);
  vnni_from_rows(s.p_pairs.data(), P, T, T, T);  // P as a B operand first: one stream through it, then in cache
  round_rows(s.dy.data(), hd, dY, ldy, T, hd);  // dY rounded, as it is and transposed
  transpose_bits(s.dyt.data(), s.dy.data(), hd, T, hd);
  // dP = dY vᵀ on the lower tiles
  vnni_from_transposed(s.b.data(), v, ld, hd, T);
  amx_product(T, T, hd, s.dy.data(), hd, s.b.data(), dP, T, {.lower_tiles_only = true});
  // dS = P ⊙ (dP − Σ_j P dP) rounded, and as a B operand
  for (int t = 0; t < T; ++t) {
    const uint16_t* __restrict p = P + int64_t(t) * T;
    const float* __restrict d = dP + int64_t(t) * T;
    const float dot = vec::lane_sum(t + 1, [&](int j) { return bf16_value(p[j]) * d[j]; });
    uint16_t* __restrict ds = s.ds.data() + int64_t(t) * T;
    for (int j = 0; j <= t; ++j) ds[j] = bf16_bits(bf16_value(p[j]) * (d[j] - dot));
    for (int j = t + 1; j < T; ++j) ds[j] = 0;
  }
  vnni_from_rows(s.ds_pairs.data(), s.ds.data(), T, T, T);
  float* out = s.out.data();
  // dVᵀ (hd,T) = dYᵀ P
  amx_product(hd, T, T, s.dyt.data(), T, s.p_pairs.data(), out, T, {.sums = TileSums::FromColumn});
  store_transposed(dv, ld, out, T, hd, 1.f);
  // dQ (T,hd) = dS k · scale
  vnni_from_rows(s.b.data(), k, ld, T, hd);
  amx_product(T, hd, T, s.ds.data(), T, s.b.data(), out, hd, {.sums = TileSums::UpToRow});
  store_scaled(dq, ld, out, hd, T, hd, scale);
  // dKᵀ (hd,T) = qᵀ dS · scale
  transpose_bits(s.a.data(), q, ld, T, hd);
  amx_product(hd, T, T, s.a.data(), T, s.ds_pairs.data(), out, T, {.sums = TileSums::FromColumn});
  store_transposed(dk, ld, out, T, hd, scale);
}

}  // namespace piper
