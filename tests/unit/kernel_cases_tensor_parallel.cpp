// Kernel cases of tensor parallelism: the vocabulary-parallel cross-entropy over 1, 2 and 4 shards of the
// vocabulary (statistics per shard, the gathered statistics finished on every shard, the backward), against the
// double softmax and loss over the whole vocabulary; with one shard it equals softmax_xent_forward to the bit. The
// vocabulary-parallel token embedding over 1, 2 and 4 shards: the shards summed (forward) and stacked (backward)
// equal the token embedding of the whole vocabulary to the bit.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernel_cases.hpp"
#include "test_util.hpp"

namespace piper::test {

namespace {

struct Shape {
  int N, V, ranks;
  float shift;  // rows shifted by shift · (row % 3): the shards' maxima differ by far more than exp can span
};

// The logits of the whole vocabulary, (N,V), from the shards (ranks,N,V/ranks).
std::vector<float> whole(const std::vector<float>& shards, const Shape& s) {
  const int Vl = s.V / s.ranks;
  std::vector<float> out(size_t(s.N) * s.V);
  for (int q = 0; q < s.ranks; ++q)
    for (int n = 0; n < s.N; ++n)
      for (int v = 0; v < Vl; ++v)
        out[size_t(n) * s.V + size_t(q) * Vl + v] = shards[(size_t(q) * s.N + n) * Vl + v];
  return out;
}

// The other way: (N,V) of doubles to the shards' layout (ranks,N,V/ranks).
std::vector<double> sharded(const std::vector<double>& full, const Shape& s) {
  const int Vl = s.V / s.ranks;
  std::vector<double> out(full.size());
  for (int q = 0; q < s.ranks; ++q)
    for (int n = 0; n < s.N; ++n)
      for (int v = 0; v < Vl; ++v)
        out[(size_t(q) * s.N + n) * Vl + v] = full[size_t(n) * s.V + size_t(q) * Vl + v];
  return out;
}

// Every rank's statistics, "gathered" into all(ranks,N,3), then every rank's finish into its shard of probs and
// its own loss (each rank adds the whole loss).
void forward_on_all_ranks(Kernels& k, Buffers& b, const Shape& s, float scale, bool in_place) {
  const int Vl = s.V / s.ranks;
  const size_t shard = size_t(s.N) * Vl;
  for (int q = 0; q < s.ranks; ++q)
    k.vocab_xent_stats(b.f("all") + size_t(q) * s.N * 3, b.f("logits") + q * shard, b.i("targets"), s.N, Vl, q * Vl);
  for (int q = 0; q < s.ranks; ++q) {
    float* probs = in_place ? b.f("logits") + q * shard : b.f("probs") + q * shard;
    k.vocab_xent_finish(probs, b.d("loss") + q, b.f("logits") + q * shard, b.f("all"), b.i("targets"), s.N, Vl,
                        s.ranks, scale);
  }
  if (in_place) k.copy(b.f("probs"), b.f("logits"), sizeof(float) * shard * size_t(s.ranks));
}

void vocab_xent_cases(std::vector<KernelCase>& cases) {
  for (Shape s : {Shape{7, 12, 1, 0.f}, Shape{50, 300, 2, 0.f}, Shape{9, 5000, 4, 0.f}, Shape{600, 64, 4, 200.f},
                  Shape{33, 1000, 1, 0.f}}) {
    const int N = s.N, V = s.V, Vl = V / s.ranks;
    const std::string shape = dims({{"N", N}, {"V", V}, {"ranks", s.ranks}}) + (s.shift > 0 ? " shifted rows" : "");
    const float scale = 0.37f;
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      std::vector<float> full = uniform(gen, size_t(N) * V, -5.f, 5.f);
      for (int n = 0; n < N; ++n)  // large shifts per shard too: each shard's maximum is another
        for (int v = 0; v < V; ++v) full[size_t(n) * V + v] += s.shift * float((n + v / Vl) % 3);
      std::vector<double> as_double(full.begin(), full.end());
      std::vector<float> shards(full.size());
      const std::vector<double> by_shard = sharded(as_double, s);
      for (size_t i = 0; i < shards.size(); ++i) shards[i] = float(by_shard[i]);
      t["logits"] = f32(shards);  // (ranks,N,V/ranks)
      t["targets"] = i32(tokens(gen, size_t(N), V));
      t["all"] = f32(filled(size_t(s.ranks) * N * 3, std::nanf("")));
      t["probs"] = f32(filled(size_t(N) * V, std::nanf("")));
      t["loss"] = f64(std::vector<double>(size_t(s.ranks), 0.5));  // each rank's loss, added to
      return t;
    };
    auto reference = [=](Tensors& t) {  // the softmax over the whole vocabulary and every rank's whole loss
      std::vector<double> probs;
      const double loss = scale * xent_ref(whole(t["logits"].f, s), t["targets"].i, N, V, &probs);
      t["probs"] = as_f32(sharded(probs, s));
      for (double& l : t["loss"].d) l += loss;
    };
    KernelCase c{.name = "vocab_xent_stats and vocab_xent_finish " + shape,
                 .make = start,
                 .call = [=](Kernels& k, Buffers& b) { forward_on_all_ranks(k, b, s, scale, false); },
                 .outs = {{"probs", 1e-4}, {"loss", 1e-5}},
                 .reference = reference,
                 .cuda_repeatable = true,
                 .twins = {{.what = "in place",
                            .call = [=](Kernels& k, Buffers& b) { forward_on_all_ranks(k, b, s, scale, true); },
                            .outs = {"probs", "loss"}}}};
    if (s.ranks == 1)  // one shard: the cross-entropy of the whole vocabulary, to the bit
      c.twins.push_back({.what = "softmax_xent_forward",
                         .call =
                             [=](Kernels& k, Buffers& b) {
                               k.softmax_xent_forward(b.f("probs"), b.d("loss"), b.f("logits"), b.i("targets"), N, V,
                                                      scale);
                             },
                         .outs = {"probs", "loss"}});
    cases.push_back(c);
    // dlogits = scale · (probs − onehot(target)) on each shard, where the target falls in it
    cases.push_back({.name = "vocab_xent_backward " + shape,
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t = start(gen);
                           reference(t);  // the probs of the forward
                           t["dlogits"] = f32(filled(size_t(N) * V, std::nanf("")));
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           for (int q = 0; q < s.ranks; ++q) {
                             const size_t at = size_t(q) * N * Vl;
                             k.vocab_xent_backward(b.f("dlogits") + at, b.f("probs") + at, b.i("targets"), N, Vl,
                                                   q * Vl, scale);
                           }
                         },
                     .outs = {{"dlogits", 1e-6, 1e-6}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> d(size_t(N) * V);
                           for (int q = 0; q < s.ranks; ++q)
                             for (int n = 0; n < N; ++n)
                               for (int v = 0; v < Vl; ++v) {
                                 const size_t i = (size_t(q) * N + n) * Vl + v;
                                 d[i] = scale * (double(t["probs"].f[i]) - (q * Vl + v == t["targets"].i[size_t(n)]));
                               }
                           t["dlogits"] = as_f32(d);
                         },
                     .cuda_repeatable = true,
                     .twins = {{.what = "in place",
                                .call =
                                    [=](Kernels& k, Buffers& b) {
                                      for (int q = 0; q < s.ranks; ++q) {
                                        const size_t at = size_t(q) * N * Vl;
                                        k.copy(b.f("dlogits") + at, b.f("probs") + at, sizeof(float) * N * Vl);
                                        k.vocab_xent_backward(b.f("dlogits") + at, b.f("dlogits") + at,
                                                              b.i("targets"), N, Vl, q * Vl, scale);
                                      }
                                    }}}});
  }
}

struct EmbedShape {
  int N, C, V, ranks;
  bool strays;  // tokens outside the whole vocabulary too (-1, V, INT32_MIN, INT32_MAX): every shard skips them
};

// Shard q of the vocabulary: [v0(q), v0(q + 1)), uneven where ranks do not divide V
int shard_v0(const EmbedShape& s, int q) { return int(int64_t(q) * s.V / s.ranks); }

// Whether token t lies in [v0, v0 + Vl), and its row there
bool in_shard(int32_t t, int v0, int Vl) { return int64_t(t) >= v0 && int64_t(t) < int64_t(v0) + Vl; }

// The vocabulary-parallel token embedding over 1, 2 and 4 shards of the vocabulary (each rank's rows of w
// stacked in rank order are the whole w): the forward on each shard (the rows of its tokens, zeros elsewhere), the
// shards' outputs summed (the ranks' all-reduce) against token_embedding_forward of the whole vocabulary, and the
// backward on each shard, the shards' gradients stacked against token_embedding_backward of the whole vocabulary,
// both to the bit; all against double references.
void vocab_embedding_cases(std::vector<KernelCase>& cases) {
  // small with tokens that never occur (4, 5, 7, 8), on 1, 2 and 4 (uneven) shards; uneven halves; repeated
  // tokens split across threads; a larger vocabulary; tokens outside every shard
  for (EmbedShape s : {EmbedShape{12, 8, 10, 1, false}, EmbedShape{12, 8, 10, 2, false},
                       EmbedShape{12, 8, 10, 4, false}, EmbedShape{60, 40, 301, 2, false},
                       EmbedShape{1024, 40, 52, 4, false}, EmbedShape{1000, 96, 5000, 4, false},
                       EmbedShape{12, 8, 10, 2, true}, EmbedShape{700, 24, 64, 4, true}}) {
    const int N = s.N, C = s.C, V = s.V, ranks = s.ranks;
    const bool small = V == 10;
    const std::string shape =
        dims({{"N", N}, {"C", C}, {"V", V}, {"ranks", ranks}}) + (s.strays ? " stray tokens" : "");
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      std::vector<int32_t> tok = small ? std::vector<int32_t>{0, 1, 1, 3, 0, 2, 3, 3, 1, 9, 6, 9}
                                       : hot_tokens(gen, size_t(N), V);  // small: 4, 5, 7, 8 never occur
      if (s.strays) {
        const int32_t stray[] = {-1, V, INT32_MIN, INT32_MAX};
        for (size_t i = 1, k = 0; i < tok.size(); i += 3, ++k) tok[i] = stray[k % 4];
      }
      t["tok"] = i32(tok);
      t["w"] = f32(uniform(gen, size_t(V) * C));  // the shards' rows stacked: (V,C)
      t["dx"] = f32(uniform(gen, size_t(N) * C));
      t["x"] = f32(filled(size_t(ranks) * N * C, std::nanf("")));  // each rank's output: (ranks,N,C)
      t["sum"] = f32(filled(size_t(N) * C, std::nanf("")));        // their all-reduce: (N,C)
      t["dw"] = f32(uniform(gen, size_t(V) * C));                  // the shards' gradients stacked, (V,C): the prior
      return t;
    };
    auto forward_shards = [=](Kernels& k, Buffers& b) {
      const size_t rows = size_t(N) * C;
      for (int q = 0; q < ranks; ++q) {
        const int v0 = shard_v0(s, q), Vl = shard_v0(s, q + 1) - v0;
        k.vocab_embedding_forward(b.f("x") + q * rows, b.i("tok"), b.f("w") + size_t(v0) * C, N, C, v0, Vl);
      }
      k.copy(b.f("sum"), b.f("x"), sizeof(float) * rows);
      for (int q = 1; q < ranks; ++q) k.accumulate(b.f("sum"), b.f("x") + q * rows, rows);
    };
    KernelCase fwd{.name = "vocab_embedding_forward " + shape,  // a gather and zeros: exact
                   .make = start,
                   .call = forward_shards,
                   .outs = {{"x", 0, 0}, {"sum", 0, 0}},
                   .reference =
                       [=](Tensors& t) {
                         for (int q = 0; q < ranks; ++q) {
                           const int v0 = shard_v0(s, q), Vl = shard_v0(s, q + 1) - v0;
                           for (int n = 0; n < N; ++n) {
                             const int32_t tk = t["tok"].i[size_t(n)];
                             for (int c = 0; c < C; ++c)
                               t["x"].f[(size_t(q) * N + n) * C + c] =
                                   in_shard(tk, v0, Vl) ? t["w"].f[size_t(tk) * C + c] : 0.f;
                           }
                         }
                         for (int n = 0; n < N; ++n) {
                           const int32_t tk = t["tok"].i[size_t(n)];
                           for (int c = 0; c < C; ++c)
                             t["sum"].f[size_t(n) * C + c] = in_shard(tk, 0, V) ? t["w"].f[size_t(tk) * C + c] : 0.f;
                         }
                       },
                   .cuda_repeatable = true};
    if (!s.strays)  // token_embedding_forward reads w[tok] for any token: only tokens of the vocabulary
      fwd.twins.push_back({.what = "token_embedding_forward of the whole vocabulary",
                           .call =
                               [=](Kernels& k, Buffers& b) {
                                 k.token_embedding_forward(b.f("sum"), b.i("tok"), b.f("w"), N, C);
                               },
                           .outs = {"sum"}});
    cases.push_back(fwd);

    auto loss = [=](const Tensors& t) {  // Σ dx · w[tok] over the tokens of the vocabulary
      double sum = 0;
      for (int n = 0; n < N; ++n) {
        const int32_t tk = t.at("tok").i[size_t(n)];
        if (!in_shard(tk, 0, V)) continue;
        for (int c = 0; c < C; ++c) sum += double(t.at("dx").f[size_t(n) * C + c]) * t.at("w").f[size_t(tk) * C + c];
      }
      return sum;
    };
    for (bool acc : {false, true}) {
      KernelCase bwd{
          .name = std::string("vocab_embedding_backward ") + (acc ? "accumulate " : "") + shape,
          .make = start,
          .call =
              [=](Kernels& k, Buffers& b) {
                for (int q = 0; q < ranks; ++q) {
                  const int v0 = shard_v0(s, q), Vl = shard_v0(s, q + 1) - v0;
                  k.vocab_embedding_backward(b.f("dw") + size_t(v0) * C, b.f("dx"), b.i("tok"), N, C, v0, Vl, acc);
                }
              },
          .outs = {{"dw", 1e-5, 1e-4}},  // the hot token sums hundreds of rows in float
          .reference =
              [=](Tensors& t) {  // dw[tok] (+)= dx for the tokens of the vocabulary, rows in order
                std::vector<double> dw(t["dw"].f.size(), 0.0);
                for (int n = 0; n < N; ++n) {
                  const int32_t tk = t["tok"].i[size_t(n)];
                  if (!in_shard(tk, 0, V)) continue;
                  for (int c = 0; c < C; ++c) dw[size_t(tk) * C + c] += t["dx"].f[size_t(n) * C + c];
                }
                t["dw"] = as_f32(add_prior(dw, t["dw"].f, acc));
              },
          .gradients = acc || !small ? std::vector<Gradient>{} : std::vector<Gradient>{{"w", "dw", loss}},
          .cuda_repeatable = true,
          .twins = {{.what = "token_embedding_backward of the whole vocabulary (the shards stacked)",
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.token_embedding_backward(b.f("dw"), b.f("dx"), b.i("tok"), N, C, V, acc);
                         }}}};
      // The promised order, on any backend: each row of dw is its prior (or 0) plus its token's dx rows in
      // increasing row order, in float, to the bit; rows of tokens that never occur (in the small cases 4 and 5,
      // on either side of the two shards' boundary) stay the prior or 0.
      bwd.property = [=](const Tensors& st, const Tensors& out) {
        std::vector<float> want = acc ? st.at("dw").f : std::vector<float>(st.at("dw").f.size(), 0.f);
        for (int n = 0; n < N; ++n) {
          const int32_t tk = st.at("tok").i[size_t(n)];
          if (!in_shard(tk, 0, V)) continue;
          for (int c = 0; c < C; ++c) want[size_t(tk) * C + c] += st.at("dx").f[size_t(n) * C + c];
        }
        const std::vector<float>& got = out.at("dw").f;
        size_t differ = 0;
        for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
        INFO("dw elements not the bits of the in-order float sum");
        CHECK(differ == 0);
      };
      cases.push_back(bwd);
    }
  }
}

}  // namespace

void add_tensor_parallel_cases(std::vector<KernelCase>& cases) {
  vocab_xent_cases(cases);
  vocab_embedding_cases(cases);
}

}  // namespace piper::test
