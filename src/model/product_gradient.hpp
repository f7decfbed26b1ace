// A gradient that a linear layer's two backward products read (d input, then d weight), kept between the backward's
// two passes at the products' width: in a bf16 run rounded once instead of in each product.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/kernels.hpp"
#include "model/stash_carver.hpp"
#include "util/error.hpp"

namespace piper {

// dy(n,OC), carved from a segment's backward-input → backward-weight stash: fp32, or in a bf16 run rounded once, with
// the bias gradient Σ_rows dy (`has_bias`) taken before, from the fp32 values. `kept_in_fp32` false: an fp32 dy stays
// where it is (a segment's output gradient), only a bf16 one is kept.
struct ProductGradient {
  bool kept;
  Act dy;               // (n,OC), where kept
  float* db = nullptr;  // (OC), bf16 with a bias only
  ProductGradient(StashCarver& c, int n, int OC, bool bf16, bool kept_in_fp32, bool has_bias)
      : kept(bf16 || kept_in_fp32), dy(kept ? c.keep_act(int64_t(n) * OC, bf16) : Act()),
        db(bf16 && has_bias ? c.keep<float>(OC) : nullptr) {}
  // What the products read: dy, or the fp32 values at `source` where they are not kept.
  ConstAct read(const float* source) const { return kept ? ConstAct(dy) : ConstAct(source); }
  // dy from its fp32 values at `computed`: rounded, with the bias gradient, where bf16 (else they are there).
  void settle_from(Kernels& k, const float* computed, int n, int OC) const {
    if (!dy.bf16) return;
    if (db) k.to_bf16_with_column_sums(dy.bits(), db, computed, n, OC);
    else k.to_bf16(dy.bits(), computed, size_t(n) * OC);
  }
  // dy = computed ⊙ dgelu (gelu_backward of the fp32 values at `computed`): in place where fp32; where bf16, rounded
  // as it is made, with the bias gradient, and the fp32 products never written.
  void settle_gelu_backward_from(Kernels& k, float* computed, ConstAct dgelu, int n, int OC) const {
    if (dy.bf16 && db) return k.gelu_backward_to_bf16(dy.bits(), db, computed, dgelu, n, OC);
    k.gelu_backward(computed, computed, dgelu, size_t(n) * OC);
    settle_from(k, computed, n, OC);
  }
  // dw (+)= dyᵀ · x(n,C) and bias_grad (+)= Σ_rows dy (may be null); `source` as for read().
  void weight_gradients(Kernels& k, float* dw, float* bias_grad, const float* source, ConstAct x, int n, int C, int OC,
                        bool accumulate) const {
    if (!dy.bf16) {
      k.linear_backward_weight(dw, bias_grad, read(source), x, n, C, OC, accumulate);
      return;
    }
    k.linear_backward_weight(dw, nullptr, dy, x, n, C, OC, accumulate);
    if (!bias_grad) return;
    PIPER_CHECK(db, "a bias gradient of a product gradient carved without one");
    if (accumulate) k.accumulate(bias_grad, db, size_t(OC));
    else k.copy(bias_grad, db, sizeof(float) * size_t(OC));
  }
};

}  // namespace piper
