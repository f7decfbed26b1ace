// Picks the next token from a model's logits: greedy, or a draw after temperature, top-k and top-p (in that order,
// as Hugging Face transformers' logits warpers), from a uniform number the caller gives, so a seed repeats a run.
#pragma once
#include <cstdint>
#include <vector>

namespace piper {

struct SamplingRule {
  double temperature = 1.0;  // 0: greedy (the largest logit, the lowest id among equals)
  int top_k = 0;             // keep the k largest logits (0: all)
  double top_p = 1.0;        // then the fewest most probable tokens whose probability sums to at least p (1: all)
};

// The probabilities of every token under the rule (vocab of them, summing to 1; 0 where the rule removed the token).
std::vector<double> token_probabilities(const std::vector<float>& logits, const SamplingRule& rule);
// A token: greedy with temperature 0, else drawn from token_probabilities with u in [0, 1).
int32_t pick_token(const std::vector<float>& logits, const SamplingRule& rule, double u);

}  // namespace piper
