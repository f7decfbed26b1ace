// Greedy choice and temperature / top-k / top-p draws over one row of logits, in double, on the host (a vocabulary
// row is small next to the forward that made it).
#include "app/token_picker.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.hpp"

namespace piper {

namespace {

int32_t greedy(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // the first of equals
}

}  // namespace

std::vector<double> token_probabilities(const std::vector<float>& logits, const SamplingRule& rule) {
  PIPER_CHECK(!logits.empty(), "no logits to pick from");
  const size_t V = logits.size();
  std::vector<double> p(V, 0.0);
  if (rule.temperature <= 0) {
    p[size_t(greedy(logits))] = 1.0;
    return p;
  }
  // ids by logit, largest first (the lower id first among equals)
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  size_t kept = rule.top_k > 0 ? std::min(V, size_t(rule.top_k)) : V;
  // softmax of logits / temperature over the kept ids
  const double top = double(logits[size_t(order[0])]) / rule.temperature;
  double sum = 0;
  for (size_t i = 0; i < kept; ++i) {
    const size_t id = size_t(order[i]);
    p[id] = std::exp(double(logits[id]) / rule.temperature - top);
    sum += p[id];
  }
  for (size_t i = 0; i < kept; ++i) p[size_t(order[i])] /= sum;
  if (rule.top_p < 1.0) {  // the fewest most probable whose sum reaches top_p (at least one)
    double cumulative = 0;
    size_t n = 0;
    while (n < kept && (n == 0 || cumulative < rule.top_p)) cumulative += p[size_t(order[n++])];
    for (size_t i = n; i < kept; ++i) p[size_t(order[i])] = 0;
    for (size_t i = 0; i < n; ++i) p[size_t(order[i])] /= cumulative;
  }
  for (size_t i = kept; i < V; ++i) p[size_t(order[i])] = 0;
  return p;
}

int32_t pick_token(const std::vector<float>& logits, const SamplingRule& rule, double u) {
  if (rule.temperature <= 0) return greedy(logits);
  const std::vector<double> p = token_probabilities(logits, rule);
  double cumulative = 0;
  int32_t last = -1;
  for (size_t id = 0; id < p.size(); ++id) {
    if (p[id] <= 0) continue;
    cumulative += p[id];
    last = int32_t(id);
    if (u < cumulative) return last;
  }
  return last;  // u within rounding of 1
}

}  // namespace piper
