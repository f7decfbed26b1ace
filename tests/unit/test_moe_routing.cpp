// Mixture-of-experts routing (model/qwen3/moe_routing): softmax, top-k with renormalization, capacity that
// drops later positions of a sequence first, the expert-ordered assignment list, the balance loss against
// its definition, and the router backward against finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "model/moe/routing.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

// Σ_t,k dw[t,k] · w[t,k] + scale · balance: a scalar whose gradient router_backward computes.
double objective(const moe::RouterShape& s, const std::vector<float>& logits, const std::vector<float>& dw,
                 double scale) {
  moe::Routing r = moe::route(s, logits.data());
  double v = 0;
  for (size_t i = 0; i < dw.size(); ++i)
    if (r.position[i] >= 0) v += double(dw[i]) * r.weight[i];
  return v + scale * r.balance;
}

}  // namespace

TEST_CASE("moe routing: top-k, weights, expert order, capacity and balance loss", "[moe]") {
  moe::RouterShape s{8, 4, 4, 2, true, 0.0};  // two sequences of 4 tokens, 4 experts, top-2
  Rand rng(3);
  std::vector<float> logits = rng.normal(size_t(8 * 4));
  moe::Routing r = moe::route(s, logits.data());
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
  // dropless: every assignment kept, listed by expert then token
  CHECK(r.offsets.back() == 16);
  for (int e = 0; e < 4; ++e)
    for (int i = r.offsets[size_t(e)]; i < r.offsets[size_t(e) + 1]; ++i) {
      const int t = r.token[size_t(i)];
      if (i > r.offsets[size_t(e)]) CHECK(r.token[size_t(i - 1)] < t);
      const int k = r.selected[size_t(t * 2)] == e ? 0 : 1;
      CHECK(r.selected[size_t(t * 2 + k)] == e);
      CHECK(r.position[size_t(t * 2 + k)] == i);
      CHECK(r.token_weight[size_t(i)] == r.weight[size_t(t * 2 + k)]);
    }
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

  // capacity 0.5: ⌈0.5·4·2/4⌉ = 1 token per expert and sequence; later positions are dropped first
  moe::RouterShape capped = s;
  capped.capacity_factor = 0.5;
  CHECK(capped.capacity() == 1);
  std::vector<float> favour(size_t(8 * 4), 0.f);
  for (int t = 0; t < 8; ++t) favour[size_t(t * 4)] = 5.f, favour[size_t(t * 4 + 1)] = 4.f;  // all pick 0 then 1
  moe::Routing rc = moe::route(capped, favour.data());
  CHECK(rc.offsets.back() == 4);  // experts 0 and 1, one token each, in each of the two sequences
  for (int q = 0; q < 2; ++q)
    for (int t = q * 4; t < q * 4 + 4; ++t) {
      CHECK((rc.position[size_t(t * 2)] >= 0) == (t == q * 4));  // only the sequence's first token keeps its place
      CHECK((rc.position[size_t(t * 2 + 1)] >= 0) == (t == q * 4));
    }
  // the balance loss counts routed tokens, dropped or not: experts 0 and 1 take every token
  CHECK(rc.fraction[0] == Approx(4.0 / 8 * 4));
  CHECK(rc.fraction[2] == 0.f);
}

TEST_CASE("moe router backward matches finite differences, with and without renormalization and capacity", "[moe]") {
  for (bool norm : {true, false}) {
    for (double capacity : {0.0, 0.6}) {
      INFO("norm_topk " << norm << " capacity " << capacity);
      moe::RouterShape s{12, 6, 5, 2, norm, capacity};
      Rand rng(11);
      std::vector<float> logits = rng.normal(size_t(12 * 5), 2.0);
      std::vector<float> dw = rng.normal(size_t(12 * 2));
      const double scale = 0.3;
      moe::Routing r = moe::route(s, logits.data());
      std::vector<float> masked(dw);  // dropped assignments carry no weight gradient
      for (size_t i = 0; i < dw.size(); ++i)
        if (r.position[i] < 0) masked[i] = 0.f;
      std::vector<float> dl(logits.size());
      moe::router_backward(s, r, masked.data(), scale, dl.data());
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
