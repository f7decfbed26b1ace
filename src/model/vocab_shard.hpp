// A tensor-parallel group's shard of the vocabulary: the rows of the (V,C) embedding or LM head a rank uses, and
// their gradient, for a tensor split by rows (the rank holds its piece) or held whole (tied embedding and head).
#pragma once
#include <cstdint>
#include <string>

#include "backend/kernels.hpp"
#include "config/model_dims.hpp"
#include "util/error.hpp"

namespace piper {

// Rank `shard` of `shards` holds rows [v0, v0 + Vl) of the vocabulary; on one rank, the whole vocabulary.
struct Vocab {
  int shards, Vl, v0;
  Vocab(const ModelDims& d, int shards_, int shard) : shards(shards_), Vl(d.vocab / shards_), v0(shard * Vl) {}
};

// This rank's rows of a (V,C) tensor w: its piece, or (`whole`) its rows of the whole tensor.
inline const float* vocab_rows(const float* w, const ModelDims& d, const Vocab& v, bool whole) {
  return whole ? w + int64_t(v.v0) * d.d_model : w;
}

// The gradient of this rank's rows: of a whole tensor, zeros elsewhere when it is written (the sum over the group
// is the gradient).
inline float* vocab_grad_rows(Kernels& k, float* g, const ModelDims& d, const Vocab& v, bool accumulate, bool whole) {
  if (!whole || v.shards == 1) return g;
  const int64_t C = d.d_model;
  if (!accumulate) {
    k.fill(g, 0.f, size_t(v.v0 * C));
    k.fill(g + (v.v0 + v.Vl) * C, 0.f, size_t((d.vocab - v.v0 - v.Vl) * C));
  }
  return g + v.v0 * C;
}

inline std::string vocab_tp_refusal(const ModelDims& d, int k) {
  if (k < 1) return cat(k, " ranks: a group needs at least one");
  return d.vocab % k == 0 ? std::string() : cat("a vocabulary of ", d.vocab, " does not divide among ", k, " ranks");
}

}  // namespace piper
