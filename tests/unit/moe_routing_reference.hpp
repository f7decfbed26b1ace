// Mixture-of-experts routing written plainly on the host, the reference of the routing kernels: router softmax
// (fp32), top-k with renormalization, per-sequence capacity, the expert-ordered list of kept (token, slot)
// assignments, the sequence-wise balance loss (DeepSeek-V3) and the backward to the router logits.
#pragma once
#include <cstdint>
#include <vector>

namespace piper::moe {

struct RouterShape {
  int tokens = 0;       // n = sequences · T
  int seq_len = 0;      // T: capacity and the balance loss are per sequence
  int experts = 0;      // E
  int top_k = 0;        // K
  bool norm_topk = true;
  double capacity_factor = 0;  // 0: dropless
  int capacity() const;        // per sequence and expert: ⌈factor · T · K / E⌉ (or T · K when dropless)
};

// Result of routing n tokens. Assignments (t, k) are numbered in expert order: expert 0's kept tokens in
// token order, then expert 1's, ...
struct Routing {
  std::vector<float> probs;        // (n,E) softmax of the logits
  std::vector<int32_t> selected;   // (n,K) expert of each slot, most probable first (ties: lower index)
  std::vector<float> weight;       // (n,K) combine weight: p / Σ_k p (norm_topk) or p
  std::vector<int32_t> position;   // (n,K) index of the assignment among kept ones, -1 when dropped
  std::vector<int32_t> token;      // (m) token of each kept assignment, expert-ordered
  std::vector<float> token_weight; // (m) its combine weight
  std::vector<int32_t> offsets;    // (E+1) first assignment of each expert
  std::vector<float> fraction;     // (sequences,E) f_e = E / (K·T) · tokens of the sequence routed to e
  double balance = 0;              // Σ over sequences Σ_e f_e · P_e (P_e: mean probability over the sequence)
};

// `bias` (E, may be null): added to the probabilities for choosing the top-k only (auxiliary-loss-free
// balancing, DeepSeek-V3); the combine weights stay the probabilities.
Routing route(const RouterShape& s, const float* logits, const float* bias = nullptr);

// dlogits(n,E) from dweight(n,K), the gradient of the loss with respect to the combine weights, plus the
// balance loss scaled by `balance_scale` (aux_loss_coef / sequences of the global batch).
void router_backward(const RouterShape& s, const Routing& r, const float* dweight, double balance_scale,
                     float* dlogits);

}  // namespace piper::moe
