// Mixture-of-experts routing written plainly in double precision, the reference of the routing kernels and the
// maker of their inputs: router softmax, top-k (with a selection bias) and renormalization, and per-sequence
// capacity with the expert-ordered numbering of the kept (token, slot) assignments.
#pragma once
#include <cstdint>
#include <vector>

namespace piper::moe {

struct RouterShape {
  int tokens = 0;       // n = sequences · T
  int seq_len = 0;      // T: capacity is per sequence
  int experts = 0;      // E
  int top_k = 0;        // K
  bool norm_topk = true;
  double capacity_factor = 0;  // 0: dropless
  int capacity() const;        // per sequence and expert: ⌈factor · T · K / E⌉ (or T · K when dropless)
};

// Result of routing n tokens. Kept assignments (t, k) are numbered in expert order: expert 0's in token order,
// then expert 1's, ...
struct Routing {
  std::vector<float> probs;       // (n,E) softmax of the logits
  std::vector<int32_t> selected;  // (n,K) the experts of largest probs + bias, largest first (ties: lower index)
  std::vector<float> weight;      // (n,K) combine weight: p / Σ_k p (norm_topk) or p
  std::vector<int32_t> position;  // (n,K) index of the assignment among kept ones, -1 when dropped
  std::vector<float> fraction;    // (sequences,E) E / (K·T) · the sequence's assignments to e, dropped or not
};

// `bias` (E, may be null): added to the probabilities for choosing the top-k only; the weights stay the
// probabilities.
Routing route(const RouterShape& s, const float* logits, const float* bias = nullptr);

}  // namespace piper::moe
