// Tensor-parallel Qwen3 and GPT-2 segments (Megatron layout): the attention and MLP halves of a layer run as the k
// ranks of a tensor-parallel group, each with its pieces of the parameters (SegmentType::tp_split), against the same
// segment on one rank with the whole parameters: the ranks' outputs, input gradients and copied parameters' gradients
// sum to the one-rank ones, each split parameter's gradient is its piece of the one-rank gradient, a
// selective-recompute rerun of a rank's stash tail gives back what its forward wrote, and tp_refusal says which
// dimension does not divide.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "backend/cpu/cpu_kernels.hpp"
#include "model/build.hpp"
#include "model/gpt2/gpt2_segments.hpp"
#include "model/qwen3/qwen3_segments.hpp"
#include "model/segment_type.hpp"
#include "test_util.hpp"

using namespace piper;
using namespace piper::test;

namespace {

// C 32, H 4 query heads of D 8, F 48, T 8.
ModelSpec tp_qwen3(int kv_heads, bool qk_norm, int heads = 4) {
  ModelSpec s;
  s.kind = "qwen3";
  s.vocab = 16, s.seq_len = 8, s.d_model = 32, s.n_layers = 1, s.n_heads = heads, s.n_kv_heads = kv_heads;
  s.head_dim = 8, s.d_ff = 48, s.rope_theta = 100, s.norm_eps = 1e-6, s.qk_norm = qk_norm;
  return s;
}

// C 32, 4 heads of 8, F 48, T 8.
ModelSpec tp_gpt2(int heads = 4) {
  ModelSpec s;
  s.kind = "gpt";
  s.vocab = 16, s.seq_len = 8, s.d_model = 32, s.n_layers = 1, s.n_heads = heads, s.d_ff = 48;
  return s;
}

const Segment& segment_of(const Model& m, const SegmentType& type) {
  for (const Segment& s : m.segments)
    if (s.type == &type) return s;
  FAIL("no segment of type " << type.name);
  return m.segments.front();
}

// Piece t of a tensor held by k ranks as `split` says: for o < outer the elements [o·k·inner + t·inner, + inner);
// the whole tensor when copied.
std::vector<float> piece(const std::vector<float>& whole, ParamSplit split, int k, int t) {
  if (!split.split()) return whole;
  REQUIRE(size_t(split.outer * k * split.inner) == whole.size());
  std::vector<float> p;
  for (int64_t o = 0; o < split.outer; ++o) {
    const auto at = whole.begin() + (o * k + t) * split.inner;
    p.insert(p.end(), at, at + split.inner);
  }
  return p;
}

// ‖got − want‖ / ‖want‖ (normwise relative error)
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_err(got, std::vector<double>(want.begin(), want.end()));
}

template <typename T>
void add_to(std::vector<double>& sum, const std::vector<T>& x, double scale = 1) {
  if (sum.empty()) sum.assign(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) sum[i] += scale * double(x[i]);
}

std::vector<float> contents(const Guarded& b) { return {b.data(), b.data() + b.size()}; }

// What one rank of a segment produced.
struct Pass {
  std::vector<float> out, din;
  std::vector<std::vector<float>> g;  // by slot
  bool tail_rerun_same = false;       // the poisoned stash tail, rerun, came back to the bit
  bool intact = false;                // nothing written past the sizes the segment gave
};

// Rank `shard` of `shards` of `seg` (shards 1: the one-rank segment): forward with the stash's tail in its own buffer,
// that tail poisoned and rerun (selective recompute), backward input, then backward weight from what BI left in the
// wstash (workspace and scratch poisoned in between). Gradients start as `g` and are added to or overwritten.
Pass run(Kernels& k, Segment seg, const ModelDims& d, int samples, int shard, int shards,
         const std::vector<std::vector<float>>& w, const std::vector<float>& in, const std::vector<float>& dout,
         std::vector<std::vector<float>> g, bool accumulate) {
  seg.shards = shards;
  const SegmentSizes z = segment_sizes(seg, d, samples);
  REQUIRE(z.input_bytes == in.size() * sizeof(float));
  REQUIRE(z.out_bytes == dout.size() * sizeof(float));
  REQUIRE(z.stash_kept_bytes > 0);
  Guarded out(z.out_bytes), din(z.input_bytes), stash(z.stash_kept_bytes), tail(z.stash_bytes - z.stash_kept_bytes),
      wstash(z.wstash_bytes), workspace(z.workspace_bytes),
      scratch(segment_scratch_floats(k, seg, d, samples) * sizeof(float));
  std::vector<const float*> wp;
  std::vector<float*> gp;
  for (auto& x : w) wp.push_back(x.data());
  for (auto& x : g) gp.push_back(x.data());
  const std::vector<uint8_t> overwrite(w.size(), accumulate ? 0 : 1);
  SegmentIO io;
  io.samples = samples, io.shard = shard, io.shards = shards;
  io.w = wp.data(), io.g = gp.data(), io.overwrite = overwrite.data();
  io.in = in.data(), io.out = out.data(), io.dout = dout.data(), io.din = din.data();
  io.stash = stash.data(), io.stash_tail = tail.data(), io.wstash = wstash.data();
  io.workspace = workspace.data(), io.scratch = scratch.data();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(out.data(), out.data() + out.size(), nan);  // written, not added to
  std::fill(din.data(), din.data() + din.size(), nan);
  segment_forward(k, seg, d, io);
  const std::vector<float> written = contents(tail);
  std::fill(tail.data(), tail.data() + tail.size(), nan);
  seg.type->rerun_tail(k, seg, d, io);
  Pass p;
  p.tail_rerun_same = bitwise_equal(written, contents(tail));
  segment_backward_input(k, seg, d, io);
  std::fill(workspace.data(), workspace.data() + workspace.size(), nan);
  std::fill(scratch.data(), scratch.data() + scratch.size(), nan);
  io.workspace = nullptr, io.scratch = nullptr;
  segment_backward_weight(k, seg, d, io);
  p.out = contents(out), p.din = contents(din), p.g = std::move(g);
  p.intact = out.intact() && din.intact() && stash.intact() && tail.intact() && wstash.intact() &&
             workspace.intact() && scratch.intact();
  return p;
}

// Random parameters of a segment by slot (norm weights near 1), its input and output gradient, and the gradients'
// starting values: junk when overwritten, values they are added to when accumulating.
struct Point {
  std::vector<std::vector<float>> w, g;
  std::vector<float> in, dout;
  Point(const Model& m, const Segment& seg, int samples, bool accumulate, uint64_t seed) {
    Rand rng(seed);
    for (int p : seg.params) {
      const ParamSpec& spec = m.params[size_t(p)];
      w.push_back(spec.init == InitKind::Ones ? rng.normal(size_t(spec.numel), 0.2, 1.0)
                                              : rng.normal(size_t(spec.numel), 0.2));
      g.push_back(accumulate ? rng.normal(size_t(spec.numel)) : std::vector<float>(size_t(spec.numel), 1e3f));
    }
    const size_t n = size_t(samples) * m.dims.seq_len * m.dims.d_model;
    in = rng.normal(n), dout = rng.normal(n);
  }
};

constexpr double kTol = 1e-5;

// The segment of `type` on one rank and on k ranks, from the same point.
void check_tensor_parallel(const ModelSpec& spec, const SegmentType& type, int k, bool accumulate) {
  const Model m = build_model(spec);
  const ModelDims& d = m.dims;
  const Segment& seg = segment_of(m, type);
  const int samples = 2;
  REQUIRE(type.tp_split);
  REQUIRE(type.tp_refusal(d, k).empty());
  const Point x(m, seg, samples, accumulate, 7);
  CpuKernels cpu(2);
  const Pass one = run(cpu, seg, d, samples, 0, 1, x.w, x.in, x.dout, x.g, accumulate);
  REQUIRE(one.intact);
  REQUIRE(one.tail_rerun_same);

  const size_t P = seg.params.size();
  std::vector<ParamSplit> split(P);
  for (size_t i = 0; i < P; ++i) split[i] = type.tp_split(d, int(i), k);
  // Each rank's pieces, with `wrong_slot` (>= 0) cut from the next rank's piece instead.
  auto rank = [&](int t, int wrong_slot) {
    std::vector<std::vector<float>> w, g;
    for (size_t i = 0; i < P; ++i) {
      w.push_back(piece(x.w[i], split[i], k, int(i) == wrong_slot ? (t + 1) % k : t));
      g.push_back(piece(x.g[i], split[i], k, t));
    }
    return run(cpu, seg, d, samples, t, k, w, x.in, x.dout, g, accumulate);
  };
  std::vector<double> out, din;
  std::vector<std::vector<double>> copies(P);
  for (int t = 0; t < k; ++t) {
    INFO("rank " << t << " of " << k);
    const Pass r = rank(t, -1);
    CHECK(r.intact);
    CHECK(r.tail_rerun_same);
    add_to(out, r.out);
    add_to(din, r.din);
    for (size_t i = 0; i < P; ++i) {
      INFO("parameter " << m.params[size_t(seg.params[i])].name);
      if (!split[i].split()) {
        add_to(copies[i], r.g[i]);
        continue;
      }
      const double e = rel_err(r.g[i], piece(one.g[i], split[i], k, t));
      INFO("gradient: relative error " << e);
      CHECK(e < kTol);
      CHECK(rel_err(r.g[i], piece(one.g[i], split[i], k, (t + 1) % k)) > 1e-2);  // another piece is not it
    }
  }
  const double e_out = rel_err(one.out, out), e_din = rel_err(one.din, din);
  INFO("sum of outputs: relative error " << e_out << "; of input gradients " << e_din);
  CHECK(e_out < kTol);
  CHECK(e_din < kTol);
  for (size_t i = 0; i < P; ++i) {
    if (split[i].split()) continue;
    if (accumulate) add_to(copies[i], x.g[i], -(k - 1));  // every rank's gradient started as the one-rank one did
    const double e = rel_err(one.g[i], copies[i]);
    INFO("copied " << m.params[size_t(seg.params[i])].name << ": relative error of the summed gradient " << e);
    CHECK(e < kTol);
  }

  // Not vacuous: with one split parameter's pieces given to the wrong ranks the outputs do not add up.
  size_t first_split = 0;
  while (!split[first_split].split()) ++first_split;
  std::vector<double> wrong;
  for (int t = 0; t < k; ++t) add_to(wrong, rank(t, int(first_split)).out);
  CHECK(rel_err(one.out, wrong) > 1e-3);
}

}  // namespace

TEST_CASE("tensor-parallel Qwen3 attention: k ranks' partial results add up to the one-rank segment",
          "[tensor_parallel][qwen3]") {
  struct Case {
    int kv, k;
  };
  // 4 key/value heads split over 2 and 4 ranks; 2 and 1 of them copied to 4 and 2 ranks (a head per rank)
  for (Case c : {Case{4, 2}, Case{4, 4}, Case{2, 4}, Case{1, 2}, Case{2, 2}}) {
    for (bool qk_norm : {true, false}) {
      for (bool accumulate : {false, true}) {
        INFO("kv heads " << c.kv << ", " << c.k << " ranks, qk_norm " << qk_norm << ", accumulate " << accumulate);
        check_tensor_parallel(tp_qwen3(c.kv, qk_norm), qwen3::attention_type(), c.k, accumulate);
      }
    }
  }
}

TEST_CASE("tensor-parallel Qwen3 MLP: k ranks' partial results add up to the one-rank segment",
          "[tensor_parallel][qwen3]") {
  for (int k : {2, 4}) {
    for (bool accumulate : {false, true}) {
      INFO(k << " ranks, accumulate " << accumulate);
      check_tensor_parallel(tp_qwen3(2, true), qwen3::mlp_type(), k, accumulate);
    }
  }
}

TEST_CASE("tensor-parallel Qwen3: the Megatron layout of each parameter, and the group sizes it refuses",
          "[tensor_parallel][qwen3]") {
  using namespace qwen3;
  const SegmentType &att = attention_type(), &mlp = mlp_type();
  const ModelDims d = build_model(tp_qwen3(2, true)).dims;  // C 32, H 4, KV 2, D 8, F 48
  auto same = [](ParamSplit a, ParamSplit b) { return a.outer == b.outer && a.inner == b.inner; };
  CHECK(same(att.tp_split(d, kQProj, 2), ParamSplit::rows(32, 32, 2)));   // q_proj (H·D, C) by rows
  CHECK(same(att.tp_split(d, kKProj, 2), ParamSplit::rows(16, 32, 2)));   // k_proj (KV·D, C): a head each
  CHECK(same(att.tp_split(d, kVProj, 4), ParamSplit::copy()));            // 2 heads for 4 ranks: copies
  CHECK(same(att.tp_split(d, kOProj, 4), ParamSplit::cols(32, 32, 4)));   // o_proj (C, H·D) by columns
  for (int slot : {int(kInputNorm), int(kQNorm), int(kKNorm)}) CHECK(!att.tp_split(d, slot, 2).split());
  CHECK(same(mlp.tp_split(d, kGateProj, 4), ParamSplit::rows(48, 32, 4)));
  CHECK(same(mlp.tp_split(d, kUpProj, 4), ParamSplit::rows(48, 32, 4)));
  CHECK(same(mlp.tp_split(d, kDownProj, 4), ParamSplit::cols(32, 48, 4)));
  CHECK(!mlp.tp_split(d, kPostAttentionNorm, 4).split());

  for (int k : {1, 2, 4}) CHECK(att.tp_refusal(d, k) == "");
  CHECK(att.tp_refusal(d, 3) == "4 query heads do not divide among 3 ranks");
  CHECK(att.tp_refusal(d, 8) == "4 query heads do not divide among 8 ranks");
  const ModelDims odd = build_model(tp_qwen3(4, true, 12)).dims;  // 12 query heads, 4 key/value heads
  CHECK(att.tp_refusal(odd, 6) == "4 key/value heads do not divide among 6 ranks, nor 6 ranks among them");
  CHECK(att.tp_refusal(odd, 12) == "");  // 3 ranks to a key/value head
  for (int k : {1, 2, 3, 4, 6, 8}) CHECK(mlp.tp_refusal(d, k) == "");
  CHECK(mlp.tp_refusal(d, 5) == "d_ff 48 does not divide among 5 ranks");
}

TEST_CASE("tensor-parallel GPT-2 attention and MLP: k ranks' partial results add up to the one-rank segment",
          "[tensor_parallel][gpt]") {
  for (const SegmentType* type : {&gpt2::attention_type(), &gpt2::mlp_type()}) {
    for (int k : {2, 4}) {
      for (bool accumulate : {false, true}) {
        INFO(type->name << ", " << k << " ranks, accumulate " << accumulate);
        check_tensor_parallel(tp_gpt2(), *type, k, accumulate);
      }
    }
  }
}

TEST_CASE("tensor-parallel GPT-2: the Megatron layout of each parameter, and the group sizes it refuses",
          "[tensor_parallel][gpt]") {
  using namespace gpt2;
  const SegmentType &att = attention_type(), &mlp = mlp_type();
  const ModelDims d = build_model(tp_gpt2()).dims;  // C 32, 4 heads, F 48
  auto same = [](ParamSplit a, ParamSplit b) { return a.outer == b.outer && a.inner == b.inner; };
  CHECK(same(att.tp_split(d, kQkvW, 2), ParamSplit{3, 16 * 32}));  // (3C, C): C/k rows of each of q, k, v
  CHECK(same(att.tp_split(d, kQkvB, 4), ParamSplit{3, 8}));        // (3C): C/k of each
  CHECK(same(att.tp_split(d, kAttnProjW, 4), ParamSplit::cols(32, 32, 4)));  // (C, C) by columns
  for (int slot : {int(kLn1W), int(kLn1B), int(kAttnProjB)}) CHECK(!att.tp_split(d, slot, 2).split());
  CHECK(same(mlp.tp_split(d, kFcW, 4), ParamSplit::rows(48, 32, 4)));        // (F, C) by rows
  CHECK(same(mlp.tp_split(d, kFcB, 4), ParamSplit{1, 12}));                  // (F)
  CHECK(same(mlp.tp_split(d, kMlpProjW, 2), ParamSplit::cols(32, 48, 2)));   // (C, F) by columns
  for (int slot : {int(kLn2W), int(kLn2B), int(kMlpProjB)}) CHECK(!mlp.tp_split(d, slot, 2).split());

  for (int k : {1, 2, 4}) CHECK(att.tp_refusal(d, k) == "");
  CHECK(att.tp_refusal(d, 3) == "4 heads do not divide among 3 ranks");
  CHECK(att.tp_refusal(d, 8) == "4 heads do not divide among 8 ranks");
  for (int k : {1, 2, 3, 4, 6, 8}) CHECK(mlp.tp_refusal(d, k) == "");
  CHECK(mlp.tp_refusal(d, 5) == "d_ff 48 does not divide among 5 ranks");
}

namespace {

// GPT-2's vocabulary-parallel embedding on rank `shard` of `shards` (wte and wpe held whole): forward, then backward
// weight into gradients starting as `g`.
Pass run_gpt2_embedding(Kernels& k, Segment seg, const ModelDims& d, int samples, int shard, int shards,
                        const std::vector<std::vector<float>>& w, const std::vector<int32_t>& tokens,
                        const std::vector<float>& dout, std::vector<std::vector<float>> g, bool accumulate) {
  seg.shards = shards;
  const SegmentSizes z = segment_sizes(seg, d, samples);
  REQUIRE(z.input_bytes == 0);
  REQUIRE(z.out_bytes == dout.size() * sizeof(float));
  Guarded out(z.out_bytes), stash(z.stash_bytes);
  std::memcpy(stash.data(), tokens.data(), tokens.size() * sizeof(int32_t));
  std::vector<const float*> wp;
  std::vector<float*> gp;
  for (auto& x : w) wp.push_back(x.data());
  for (auto& x : g) gp.push_back(x.data());
  const std::vector<uint8_t> overwrite(w.size(), accumulate ? 0 : 1);
  SegmentIO io;
  io.samples = samples, io.shard = shard, io.shards = shards;
  io.w = wp.data(), io.g = gp.data(), io.overwrite = overwrite.data();
  io.out = out.data(), io.dout = dout.data(), io.stash = stash.data();
  std::fill(out.data(), out.data() + out.size(), std::numeric_limits<float>::quiet_NaN());
  segment_forward(k, seg, d, io);
  segment_backward_weight(k, seg, d, io);
  Pass p;
  p.out = contents(out), p.g = std::move(g);
  p.intact = out.intact() && stash.intact();
  return p;
}

}  // namespace

TEST_CASE("tensor-parallel GPT-2 embedding: k ranks' partial outputs and gradients add up to the one-rank segment",
          "[tensor_parallel][gpt]") {
  const Model m = build_model(tp_gpt2());
  const ModelDims& d = m.dims;
  const Segment& seg = segment_of(m, gpt2::embedding_type());
  const int samples = 3, n = samples * d.seq_len;
  CpuKernels cpu(2);
  for (int k : {2, 4}) {
    for (bool accumulate : {false, true}) {
      INFO(k << " ranks, accumulate " << accumulate);
      REQUIRE(gpt2::embedding_type().tp_refusal(d, k).empty());
      for (int slot : {int(gpt2::kWte), int(gpt2::kWpe)}) CHECK(!gpt2::embedding_type().tp_split(d, slot, k).split());
      const Point x(m, seg, samples, accumulate, 11);
      Rand rng(5);
      const std::vector<int32_t> tokens = rng.ints(size_t(n), 0, d.vocab);
      const Pass one = run_gpt2_embedding(cpu, seg, d, samples, 0, 1, x.w, tokens, x.dout, x.g, accumulate);
      REQUIRE(one.intact);
      std::vector<double> out;
      std::vector<std::vector<double>> g(2);
      for (int t = 0; t < k; ++t) {
        const Pass r = run_gpt2_embedding(cpu, seg, d, samples, t, k, x.w, tokens, x.dout, x.g, accumulate);
        CHECK(r.intact);
        add_to(out, r.out);
        for (size_t i = 0; i < 2; ++i) add_to(g[i], r.g[i]);
      }
      CHECK(rel_err(one.out, out) < kTol);
      for (size_t i = 0; i < 2; ++i) {
        if (accumulate) add_to(g[i], x.g[i], -(k - 1));  // every rank's gradient started as the one-rank one did
        INFO("gradient of slot " << i);
        CHECK(rel_err(one.g[i], g[i]) < kTol);
      }
    }
  }
  CHECK(gpt2::embedding_type().tp_refusal(d, 3) == "a vocabulary of 16 does not divide among 3 ranks");
}

TEST_CASE("tensor-parallel GPT-2 head and loss: each rank's loss is the one-rank loss, and the gradients add up",
          "[tensor_parallel][gpt]") {
  const Model m = build_model(tp_gpt2());
  const ModelDims& d = m.dims;
  const Segment& head = segment_of(m, gpt2::head_type());
  const Segment& loss = segment_of(m, gpt2::loss_type());
  CHECK((&loss == &head + 1 && loss.type->link_offset == -1 && loss.type->computes_loss));
  CHECK(!head.type->computes_loss);
  CHECK(head.type->tp_output == SegmentType::TpOutput::Gathered);
  CHECK(!loss.type->tp_input_grad_partial);
  const int samples = 2, n = samples * d.seq_len, C = d.d_model;
  CpuKernels cpu(2);
  for (int k : {2, 4}) {
    for (bool accumulate : {false, true}) {
      INFO(k << " ranks, accumulate " << accumulate);
      REQUIRE(head.type->tp_refusal(d, k).empty());
      REQUIRE(loss.type->tp_refusal(d, k).empty());
      for (int slot = 0; slot < gpt2::kHeadParams; ++slot) CHECK(!head.type->tp_split(d, slot, k).split());
      const Point x(m, head, samples, accumulate, 13);
      Rand rng(3);
      const std::vector<int32_t> targets = rng.ints(size_t(n), 0, d.vocab);
      // The k ranks (k = 1: the one-rank pair) of the head and loss: heads' forwards, their statistics gathered,
      // then each rank's loss and backward.
      struct Result {
        std::vector<double> loss;
        std::vector<double> din;
        std::vector<std::vector<double>> g;
        bool intact = true;
      };
      auto pair = [&](int shards) {
        Segment h = head, l = loss;
        h.shards = l.shards = shards;
        const SegmentSizes zh = segment_sizes(h, d, samples), zl = segment_sizes(l, d, samples);
        REQUIRE(zh.input_bytes == size_t(n) * C * sizeof(float));
        REQUIRE(zh.out_bytes == size_t(shards) * n * 3 * sizeof(float));
        REQUIRE(zl.input_bytes == zh.out_bytes);
        REQUIRE(zl.out_bytes == 0);
        Guarded stats(zh.out_bytes), dstats(zl.input_bytes);
        std::vector<Guarded> stash, wstash, din;
        std::vector<std::vector<float>> g(size_t(shards) * x.g.size());
        std::vector<std::vector<const float*>> wp(static_cast<size_t>(shards));
        std::vector<std::vector<float*>> gp(static_cast<size_t>(shards));
        const std::vector<uint8_t> overwrite(x.w.size(), accumulate ? 0 : 1);
        std::vector<SegmentIO> io(static_cast<size_t>(shards));
        for (int t = 0; t < shards; ++t) {
          stash.emplace_back(zh.stash_bytes), wstash.emplace_back(zh.wstash_bytes), din.emplace_back(zh.input_bytes);
        }
        Guarded workspace(zh.workspace_bytes);
        for (int t = 0; t < shards; ++t) {
          std::memcpy(stash[size_t(t)].data(), targets.data(), targets.size() * sizeof(int32_t));
          for (size_t i = 0; i < x.w.size(); ++i) {
            g[size_t(t) * x.g.size() + i] = x.g[i];
            wp[size_t(t)].push_back(x.w[i].data());
            gp[size_t(t)].push_back(g[size_t(t) * x.g.size() + i].data());
          }
          SegmentIO& s = io[size_t(t)];
          s.samples = samples, s.shard = t, s.shards = shards;
          s.w = wp[size_t(t)].data(), s.g = gp[size_t(t)].data(), s.overwrite = overwrite.data();
          s.in = x.in.data(), s.out = stats.data(), s.stash = stash[size_t(t)].data();
          s.wstash = wstash[size_t(t)].data(), s.workspace = workspace.data(), s.din = din[size_t(t)].data();
          s.loss_scale = 1.f / float(n);
          segment_forward(cpu, h, d, s);  // writes its part of the statistics
        }
        Result r;
        for (int t = 0; t < shards; ++t) {
          SegmentIO s;  // the loss: the gathered statistics in, the head's stash linked
          double sum = 0;
          s.samples = samples, s.shard = t, s.shards = shards;
          s.in = stats.data(), s.din = dstats.data(), s.link = stash[size_t(t)].data();
          s.loss_sum = &sum, s.loss_scale = 1.f / float(n);
          segment_forward(cpu, l, d, s);
          segment_backward_input(cpu, l, d, s);  // dlogits into the head's stash
          r.loss.push_back(sum);
          segment_backward_input(cpu, h, d, io[size_t(t)]);
          segment_backward_weight(cpu, h, d, io[size_t(t)]);
          add_to(r.din, contents(din[size_t(t)]));
          r.intact = r.intact && stash[size_t(t)].intact() && wstash[size_t(t)].intact() && din[size_t(t)].intact();
        }
        r.g.resize(x.g.size());
        for (int t = 0; t < shards; ++t)
          for (size_t i = 0; i < x.g.size(); ++i) add_to(r.g[i], g[size_t(t) * x.g.size() + i]);
        for (size_t i = 0; i < x.g.size(); ++i)
          if (accumulate) add_to(r.g[i], x.g[i], -(shards - 1));  // each rank's gradient started as one rank's
        r.intact = r.intact && stats.intact() && dstats.intact() && workspace.intact();
        return r;
      };
      const Result one = pair(1), many = pair(k);
      CHECK(one.intact);
      CHECK(many.intact);
      REQUIRE(one.loss.size() == 1);
      for (double l : many.loss) CHECK(l == Approx(one.loss[0]).epsilon(1e-6));  // each rank adds the whole loss
      // the loss against the textbook cross-entropy of the whole vocabulary's logits
      const float* no_bias = nullptr;
      auto lf = layernorm_ref(x.in, x.w[gpt2::kLnfW], x.w[gpt2::kLnfB], n, C);
      auto logits = linear_ref(lf, x.w[gpt2::kHeadWte], no_bias, n, C, d.vocab);
      CHECK(one.loss[0] == Approx(xent_ref(logits, targets, n, d.vocab) / n).epsilon(1e-5));
      std::vector<float> one_din(one.din.begin(), one.din.end());
      CHECK(rel_err(one_din, many.din) < kTol);  // the partial input gradients sum to the one-rank one
      for (size_t i = 0; i < x.g.size(); ++i) {
        INFO("gradient of slot " << i);
        std::vector<float> want(one.g[i].begin(), one.g[i].end());
        CHECK(rel_err(want, many.g[i]) < kTol);  // copies: partial gradients
      }
    }
  }
  CHECK(head.type->tp_refusal(d, 3) == "a vocabulary of 16 does not divide among 3 ranks");
}
