// Kernel cases of tensor parallelism: the vocabulary-parallel cross-entropy over 1, 2 and 4 shards of the
// vocabulary (statistics per shard, the gathered statistics finished on every shard, the backward), against the
// double softmax and loss over the whole vocabulary; with one shard it equals softmax_xent_forward to the bit.
#include <cmath>

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

}  // namespace

void add_tensor_parallel_cases(std::vector<KernelCase>& cases) { vocab_xent_cases(cases); }

}  // namespace piper::test
