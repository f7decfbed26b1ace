// Mixture-of-experts routing kernels on the CPU (Kernels::moe_*): softmax, top-k with renormalization, capacity that
// drops later positions of a sequence first, the expert-ordered assignment list, the routing statistics, the balance
// loss against its definition, and the router backward against finite differences of the routed objective.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

struct Shape {
  int n, T, E, K;
  bool norm_topk;
  int capacity;  // per sequence and expert
};

// Everything the routing kernels write for one batch of logits.
struct Routed {
  std::vector<float> probs, weight, token_weight, fraction;
  std::vector<int32_t> selected, position, token, counts, offsets;
  std::vector<double> stats;  // E loads, then the dropped
  double balance = 0;         // Σ_q Σ_e fraction · mean_t probs
};

Routed route(const Shape& s, const std::vector<float>& logits, const float* bias = nullptr) {
  CpuKernels k(1);
  const int A = s.n * s.K;
  Routed r;
  r.probs = logits;
  r.selected.assign(size_t(A), -7);
  r.weight.assign(size_t(A), -7.f);
  r.position.assign(size_t(A), -7);
  r.token.assign(size_t(A), -7);
  r.token_weight.assign(size_t(A), -7.f);
  r.counts.assign(size_t(s.E), -7);
  r.fraction.assign(size_t(s.n / s.T) * s.E, -7.f);
  r.stats.assign(size_t(s.E) + 1, 0.0);
  k.moe_route(r.probs.data(), r.selected.data(), r.weight.data(), r.probs.data(), bias, s.n, s.E, s.K, s.norm_topk);
  k.moe_assign(r.position.data(), r.counts.data(), r.token.data(), r.token_weight.data(), r.fraction.data(),
               r.stats.data(), r.selected.data(), r.weight.data(), s.n, s.T, s.E, s.K, s.capacity, A);
  k.moe_balance_loss(&r.balance, r.fraction.data(), r.probs.data(), s.n, s.T, s.E, 1.0);
  r.offsets.assign(size_t(s.E) + 1, 0);
  for (int e = 0; e < s.E; ++e) r.offsets[size_t(e) + 1] = r.offsets[size_t(e)] + r.counts[size_t(e)];
  return r;
}

// Σ_t,k dw[t,k] · w[t,k] over kept slots + scale · balance: a scalar whose gradient moe_router_backward computes.
double objective(const Shape& s, const std::vector<float>& logits, const std::vector<float>& dw, double scale) {
  Routed r = route(s, logits);
  double v = 0;
  for (size_t i = 0; i < dw.size(); ++i)
    if (r.position[i] >= 0) v += double(dw[i]) * r.weight[i];
  return v + scale * r.balance;
}

}  // namespace

TEST_CASE("moe routing kernels: top-k, weights, expert order, statistics, capacity and balance loss", "[moe]") {
  const Shape s{8, 4, 4, 2, true, 8};  // two sequences of 4 tokens, 4 experts, top-2, dropless (capacity T·K)
  Rand rng(3);
  std::vector<float> logits = rng.normal(size_t(8 * 4));
  Routed r = route(s, logits);
  for (int t = 0; t < 8; ++t) {
    double sum = 0;
    for (int e = 0; e < 4; ++e) sum += r.probs[size_t(t * 4 + e)];
    CHECK(sum == Approx(1.0).epsilon(1e-6));
    const int a = r.selected[size_t(t * 2)], b = r.selected[size_t(t * 2 + 1)];
    CHECK(a != b);
    for (int e = 0; e < 4; ++e)
      if (e != a && e != b) CHECK(r.probs[size_t(t * 4 + e)] <= r.probs[size_t(t * 4 + b)]);
    CHECK(r.probs[size_t(t * 4 + a)] >= r.probs[size_t(t * 4 + b)]);
    CHECK(r.weight[size_t(t * 2)] + r.weight[size_t(t * 2 + 1)] == Approx(1.0).epsilon(1e-6));
  }
  // dropless: every assignment kept, listed by expert then token; loads are the counts, nothing dropped
  CHECK(r.offsets.back() == 16);
  for (int e = 0; e < 4; ++e) {
    CHECK(r.stats[size_t(e)] == r.counts[size_t(e)]);
    for (int i = r.offsets[size_t(e)]; i < r.offsets[size_t(e) + 1]; ++i) {
      const int t = r.token[size_t(i)];
      if (i > r.offsets[size_t(e)]) CHECK(r.token[size_t(i - 1)] < t);
      const int k = r.selected[size_t(t * 2)] == e ? 0 : 1;
      CHECK(r.selected[size_t(t * 2 + k)] == e);
      CHECK(r.position[size_t(t * 2 + k)] == i);
      CHECK(r.token_weight[size_t(i)] == r.weight[size_t(t * 2 + k)]);
    }
  }
  CHECK(r.stats[4] == 0.0);
  // balance: Σ_seq Σ_e E/(K·T)·count_e · mean_t p_e
  double want = 0;
  for (int q = 0; q < 2; ++q)
    for (int e = 0; e < 4; ++e) {
      double count = 0, mean_p = 0;
      for (int t = q * 4; t < q * 4 + 4; ++t) {
        count += (r.selected[size_t(t * 2)] == e) + (r.selected[size_t(t * 2 + 1)] == e);
        mean_p += r.probs[size_t(t * 4 + e)] / 4;
      }
      want += 4.0 / (2 * 4) * count * mean_p;
    }
  CHECK(r.balance == Approx(want).epsilon(1e-6));

  // capacity 1 per expert and sequence; later positions are dropped first, and the rows past the kept are -1
  Shape capped = s;
  capped.capacity = 1;
  std::vector<float> favour(size_t(8 * 4), 0.f);
  for (int t = 0; t < 8; ++t) favour[size_t(t * 4)] = 5.f, favour[size_t(t * 4 + 1)] = 4.f;  // all pick 0 then 1
  Routed rc = route(capped, favour);
  CHECK(rc.offsets.back() == 4);  // experts 0 and 1, one token each, in each of the two sequences
  for (int q = 0; q < 2; ++q)
    for (int t = q * 4; t < q * 4 + 4; ++t) {
      CHECK((rc.position[size_t(t * 2)] >= 0) == (t == q * 4));  // only the sequence's first token keeps its place
      CHECK((rc.position[size_t(t * 2 + 1)] >= 0) == (t == q * 4));
    }
  for (size_t i = 4; i < rc.token.size(); ++i) CHECK((rc.token[i] == -1 && rc.token_weight[i] == 0.f));
  // the balance loss and the loads count routed assignments, dropped or not: experts 0 and 1 take every token
  CHECK(rc.fraction[0] == Approx(4.0 / 8 * 4));
  CHECK(rc.fraction[2] == 0.f);
  CHECK((rc.stats[0] == 8.0 && rc.stats[1] == 8.0 && rc.stats[2] == 0.0 && rc.stats[4] == 12.0));

  // a selection bias chooses the experts but never weighs them
  std::vector<float> bias = {0.f, 0.f, 10.f, 10.f};
  Routed rb = route(s, logits, bias.data());
  for (int t = 0; t < 8; ++t) {
    CHECK(rb.selected[size_t(t * 2)] + rb.selected[size_t(t * 2 + 1)] == 5);
    const float p2 = rb.probs[size_t(t * 4 + 2)], p3 = rb.probs[size_t(t * 4 + 3)];
    CHECK(rb.weight[size_t(t * 2)] + rb.weight[size_t(t * 2 + 1)] == Approx(1.0).epsilon(1e-6));
    CHECK(rb.weight[size_t(t * 2) + (rb.selected[size_t(t * 2)] == 2 ? 0 : 1)] == Approx(p2 / (p2 + p3)));
  }
}

TEST_CASE("moe router backward kernel matches finite differences, with and without renormalization and capacity",
          "[moe]") {
  for (bool norm : {true, false}) {
    for (int capacity : {12, 2}) {
      INFO("norm_topk " << norm << " capacity " << capacity);
      const Shape s{12, 6, 5, 2, norm, capacity};
      Rand rng(11);
      std::vector<float> logits = rng.normal(size_t(12 * 5), 2.0);
      std::vector<float> dw = rng.normal(size_t(12 * 2));
      const double scale = 0.3;
      Routed r = route(s, logits);
      std::vector<float> masked(dw);  // dropped assignments carry no weight gradient
      for (size_t i = 0; i < dw.size(); ++i)
        if (r.position[i] < 0) masked[i] = 0.f;
      std::vector<float> dl(logits.size());
      CpuKernels(1).moe_router_backward(dl.data(), r.probs.data(), r.selected.data(), r.weight.data(),
                                        r.fraction.data(), masked.data(), s.n, s.T, s.E, s.K, s.norm_topk, scale);
      // the selection and capacity are piecewise constant: differences small enough not to change them
      std::vector<size_t> all(logits.size());
      std::iota(all.begin(), all.end(), 0);
      auto num = numeric_grad(logits, 1e-3, [&] { return objective(s, logits, dw, scale); }, all);
      double worst = 0;
      for (size_t i = 0; i < dl.size(); ++i) worst = std::max(worst, std::fabs(dl[i] - num[i]));
      INFO("worst absolute difference " << worst);
      CHECK(worst < 2e-3);
      double largest = 0;
      for (float v : dl) largest = std::max(largest, double(std::fabs(v)));
      CHECK(largest > 0.05);
    }
  }
}
