// The token picker of `piper sample`: greedy, temperature, top-k and top-p against probabilities worked out by
// hand, and draws that follow the uniform number they are given.
#include <catch2/catch.hpp>

#include <cmath>

#include "app/token_picker.hpp"

using namespace piper;

namespace {

// softmax(x / t) of a few values, in double
std::vector<double> softmax(const std::vector<double>& x, double t) {
  double sum = 0;
  std::vector<double> p;
  for (double v : x) p.push_back(std::exp(v / t)), sum += p.back();
  for (double& v : p) v /= sum;
  return p;
}

}  // namespace

TEST_CASE("token picker: greedy takes the largest logit, the lowest id among equals", "[sample]") {
  SamplingRule greedy;
  greedy.temperature = 0;
  CHECK(pick_token({0.1f, 2.f, -1.f, 2.f}, greedy, 0.99) == 1);
  CHECK(pick_token({-3.f}, greedy, 0.5) == 0);
  const auto p = token_probabilities({0.1f, 2.f, -1.f, 2.f}, greedy);
  CHECK(p == std::vector<double>{0, 1, 0, 0});
}

TEST_CASE("token picker: temperature, top-k and top-p give the probabilities worked out by hand", "[sample]") {
  const std::vector<float> logits = {1.f, 3.f, 0.f, 2.f};  // by size: 1, 3, 0, 2
  SamplingRule rule;
  rule.temperature = 2.0;
  auto p = token_probabilities(logits, rule);
  auto want = softmax({1, 3, 0, 2}, 2.0);
  for (size_t i = 0; i < 4; ++i) CHECK(p[i] == Approx(want[i]).epsilon(1e-12));

  rule.top_k = 2;  // ids 1 and 3 only
  p = token_probabilities(logits, rule);
  want = softmax({3, 2}, 2.0);
  CHECK(p[0] == 0);
  CHECK(p[2] == 0);
  CHECK(p[1] == Approx(want[0]).epsilon(1e-12));
  CHECK(p[3] == Approx(want[1]).epsilon(1e-12));

  // top-p over the temperature-1 softmax: p(1) = 0.644, p(3) = 0.237, p(0) = 0.087, p(2) = 0.032
  rule = SamplingRule{};
  const auto full = softmax({1, 3, 0, 2}, 1.0);
  rule.top_p = 0.5;  // id 1 alone reaches it
  p = token_probabilities(logits, rule);
  CHECK(p == std::vector<double>{0, 1, 0, 0});
  rule.top_p = 0.7;  // ids 1 and 3
  p = token_probabilities(logits, rule);
  CHECK(p[1] == Approx(full[1] / (full[1] + full[3])).epsilon(1e-12));
  CHECK(p[3] == Approx(full[3] / (full[1] + full[3])).epsilon(1e-12));
  CHECK(p[0] == 0);
  CHECK(p[2] == 0);
  rule.top_p = (full[1] + full[3]) * (1 - 1e-9);  // just reached by two: no third
  p = token_probabilities(logits, rule);
  CHECK(p[0] == 0);
  rule.top_p = (full[1] + full[3]) * (1 + 1e-9);  // just past two: the third too
  p = token_probabilities(logits, rule);
  CHECK(p[0] == Approx(full[0] / (full[1] + full[3] + full[0])).epsilon(1e-12));

  rule.top_k = 3;  // top-k first (ids 1, 3, 0), then top-p within them
  rule.top_p = 0.95;
  p = token_probabilities(logits, rule);
  const double kept = full[1] + full[3] + full[0];
  CHECK(full[1] / kept + full[3] / kept < 0.95);  // so the third is needed
  CHECK(p[0] == Approx(full[0] / kept).epsilon(1e-12));
  CHECK(p[2] == 0);
}

TEST_CASE("token picker: a draw walks the probabilities in id order with the uniform number given", "[sample]") {
  const std::vector<float> logits = {0.f, 0.f, 0.f, 0.f};  // uniform: a quarter each
  SamplingRule rule;
  CHECK(pick_token(logits, rule, 0.0) == 0);
  CHECK(pick_token(logits, rule, 0.24) == 0);
  CHECK(pick_token(logits, rule, 0.26) == 1);
  CHECK(pick_token(logits, rule, 0.74) == 2);
  CHECK(pick_token(logits, rule, 0.999999) == 3);
  rule.top_k = 2;  // ids 0 and 1 (the lowest among equals), half each
  CHECK(pick_token(logits, rule, 0.49) == 0);
  CHECK(pick_token(logits, rule, 0.51) == 1);
  CHECK(pick_token(logits, rule, 0.999999) == 1);
}
