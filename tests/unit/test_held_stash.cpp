// A stash held in bf16 in pieces of samples (model/segment_type.hpp: held_stash): where a pass's whole view passes the
// limit, the most samples whose view fits it, never fewer rows than the least; one piece for segments spread over
// ranks and without a limit.
#include <catch2/catch.hpp>

#include "model/build.hpp"
#include "model/segment_type.hpp"
#include "model/stash_carver.hpp"

using namespace piper;

namespace {

Model gpt(int seq_len) {
  ModelSpec s;
  s.kind = "gpt";
  s.vocab = 256, s.seq_len = seq_len, s.d_model = 32, s.n_layers = 1, s.n_heads = 4, s.d_ff = 64;
  return build_model(s);
}

}  // namespace

TEST_CASE("held stash: the most samples whose view fits the limit, at least the least rows", "[bf16]") {
  const Model m = gpt(128);  // 128 rows a sample
  const Segment& mlp = m.segments[2];
  REQUIRE(mlp.type->name == "gpt2.mlp");
  REQUIRE(mlp.type->samples_apart);
  const uint64_t one = held_stash_layout(mlp, m.dims, 1, true).view_bytes();  // one sample's view
  struct Case {
    int samples;
    uint64_t limit;  // in samples' views
    int64_t min_rows;
    int pieces;
  };
  for (const Case c : {Case{16, 4, 512, 4},    // 4 samples fit: 4 pieces
                       Case{16, 5, 512, 4},    // 5 fit, 4 divides
                       Case{16, 16, 512, 1},   // the whole fits: one piece
                       Case{16, 1, 512, 4},    // 1 fits, but 512 rows need 4 samples
                       Case{16, 1, 128, 16},   // 1 sample a piece
                       Case{12, 5, 512, 3},    // divisors 4 and 6: 4 fits
                       Case{7, 2, 128, 7},     // prime: a sample a piece
                       Case{3, 1, 512, 1},     // 384 rows: too few to cut
                       Case{16, 0, 128, 1}}) {  // no limit: one piece
    INFO(c.samples << " samples, a view limit of " << c.limit << " samples, " << c.min_rows << " rows");
    const HeldStash h = held_stash(mlp, m.dims, c.samples, true, HeldPieceRule{c.min_rows, c.limit * one});
    CHECK(h.pieces == c.pieces);
    const StashLayout piece = held_stash_layout(mlp, m.dims, c.samples / c.pieces, true);
    CHECK(h.view_bytes() == piece.view_bytes());
    CHECK(uint64_t(h.pieces) * h.view_bytes() == held_stash_layout(mlp, m.dims, c.samples, true).view_bytes());
    CHECK(h.held_bytes() == uint64_t(h.pieces) * piece.packed_bytes());
  }
}

TEST_CASE("held stash: a segment spread over ranks keeps one piece, and the head is not a type of samples apart",
          "[bf16]") {
  const Model m = gpt(128);
  CHECK_FALSE(m.segments.back().type->samples_apart);
  Segment attention = m.segments[1];
  const HeldPieceRule rule{128, held_stash_layout(attention, m.dims, 1, true).view_bytes()};
  CHECK(held_stash(attention, m.dims, 16, true, rule).pieces == 16);
  attention.shards = 2;  // tensor-parallel: one piece
  CHECK(held_stash(attention, m.dims, 16, true, rule).pieces == 1);
}

TEST_CASE("held stash: with bf16 matmul inputs, the activations only matmuls read are held in place at 2 bytes, "
          "outside the view",
          "[bf16]") {
  Model m = gpt(16);
  const Segment& mlp = m.segments[2];
  REQUIRE(mlp.type->name == "gpt2.mlp");
  const int64_t n = 3 * 16, C = 32, F = 64;  // 3 samples
  const StashLayout fp32 = mlp.type->stash_layout(mlp, m.dims, 3);
  m.dims.bf16_matmul_inputs = true;
  const StashLayout bf16 = mlp.type->stash_layout(mlp, m.dims, 3);
  // mean, rstd (n) stay fp32 in the view; gelu' and the GELU's output (n,F) and the normed input (n,C) are bf16
  // where the stash is held
  CHECK(fp32.view_bytes() == uint64_t(2 * n + 2 * n * F + n * C) * 4);
  CHECK(bf16.view_bytes() == uint64_t(2 * n) * 4);
  CHECK(bf16.packed_bytes() == fp32.packed_bytes());  // held in bf16 either way
  uint64_t in_place = 0;
  for (const StashRun& r : bf16.runs) in_place += r.in_place ? r.bytes : 0;
  CHECK(in_place == uint64_t(2 * n * F + n * C) * 2);
  // a stash that is not held (one buffer) keeps them in it, at 2 bytes
  CHECK(segment_sizes(mlp, m.dims, 3).stash_bytes == uint64_t(2 * n) * 4 + uint64_t(2 * n * F + n * C) * 2);
}

TEST_CASE("stash carver: a bf16 activation in place lies where the layout's order holds it", "[bf16]") {
  // kept: exact (5 floats), rounded (7 floats), in place (6 bf16); tail: rounded (3 floats), in place (9 bf16)
  auto carve = [](StashParts parts, float** exact, float** rounded, Act* kept_act, float** tail_f, Act* tail_a) {
    StashCarver c(parts);
    *exact = c.keep_exact(5);
    *rounded = c.keep<float>(7);
    *kept_act = c.keep_act(6, true);
    c.tail(*tail_f, 3);
    c.tail_act(*tail_a, 9, true);
    c.finish();
    return c.bytes();
  };
  StashLayout layout;
  float *e, *r, *t;
  Act ka, ta;
  carve(StashParts::recording(&layout), &e, &r, &ka, &t, &ta);
  std::vector<uint64_t> held_at;  // where each run is held, in order
  uint64_t at = 0;
  for (const StashRun& run : layout.runs) held_at.push_back(at), at += StashLayout::packed_size(run);
  REQUIRE(layout.runs.size() == 5);
  CHECK(layout.view_bytes() == (5 + 7 + 3) * 4);  // the view: no room for the runs in place
  CHECK(layout.runs[2].in_place);
  CHECK(layout.runs[4].in_place);
  std::vector<char> view(layout.view_bytes()), held(layout.packed_bytes());
  const size_t plain = carve(StashParts{view.data(), nullptr, nullptr, held.data()}, &e, &r, &ka, &t, &ta);
  CHECK(plain == layout.view_bytes());
  CHECK(reinterpret_cast<char*>(e) == view.data());
  CHECK(reinterpret_cast<char*>(r) == view.data() + 5 * 4);
  CHECK(static_cast<char*>(ka.p) == held.data() + held_at[2]);
  CHECK(reinterpret_cast<char*>(t) == view.data() + 12 * 4);
  CHECK(static_cast<char*>(ta.p) == held.data() + held_at[4]);
  CHECK(held_at[4] + 20 == held.size());  // 9 bf16 rounded up to 4 bytes, last
}

TEST_CASE("held stash: with bf16 matmul inputs, GPT-2's qkv and attention output and Qwen3's q, k, "
          "v, attention output and q, k before their norms (read by products, or as a held stash gives them back) are "
          "held in place too",
          "[bf16]") {
  // in place: the bytes of the runs held where the stash is, outside the view
  auto in_place = [](const StashLayout& l) {
    uint64_t b = 0;
    for (const StashRun& r : l.runs) b += r.in_place ? r.bytes : 0;
    return b;
  };
  SECTION("gpt2") {
    Model m = gpt(16);
    const Segment& attention = m.segments[1];
    REQUIRE(attention.type->name == "gpt2.attention");
    const int64_t n = 3 * 16, C = 32, lse = 3 * 4 * 16;  // 3 samples, 4 heads
    const StashLayout fp32 = attention.type->stash_layout(attention, m.dims, 3);
    m.dims.bf16_matmul_inputs = true;
    const StashLayout bf16 = attention.type->stash_layout(attention, m.dims, 3);
    // qkv (n,3C), the normed input and the attention's output (n,C): all but the norm's statistics and the
    // attention's log-sum-exps (b,H,T), which stay fp32 in the view
    CHECK(in_place(bf16) == uint64_t(3 * n * C + 2 * n * C) * 2);
    CHECK(fp32.view_bytes() - bf16.view_bytes() == uint64_t(3 * n * C + 2 * n * C) * 4);
    CHECK(bf16.view_bytes() == uint64_t(2 * n + lse) * 4);
    CHECK(bf16.packed_bytes() == fp32.packed_bytes());
  }
  SECTION("qwen3") {
    for (bool qk_norm : {true, false}) {
      ModelSpec s;
      s.kind = "qwen3";
      s.vocab = 256, s.seq_len = 16, s.d_model = 32, s.n_layers = 1, s.n_heads = 4, s.n_kv_heads = 2, s.d_ff = 64;
      s.head_dim = 8, s.qk_norm = qk_norm;
      Model m = build_model(s);
      const Segment& attention = m.segments[1];
      REQUIRE(attention.type->name == "qwen3.attention");
      const int64_t n = 2 * 16, C = 32, QD = 4 * 8, KD = 2 * 8;  // 2 samples
      const StashLayout fp32 = attention.type->stash_layout(attention, m.dims, 2);
      m.dims.bf16_matmul_inputs = true;
      const StashLayout bf16 = attention.type->stash_layout(attention, m.dims, 2);
      INFO("qk_norm " << qk_norm);
      // h, q, k, v, the attention output y, and with qk_norm q and k before their norms: all but the statistics
      const int64_t acts = n * C + 2 * n * QD + 2 * n * KD + (qk_norm ? n * QD + n * KD : 0);
      CHECK(in_place(bf16) == uint64_t(acts) * 2);
      CHECK(fp32.view_bytes() - bf16.view_bytes() == uint64_t(acts) * 4);
      const int64_t stats = n + (qk_norm ? n * 4 + n * 2 : 0) + 2 * 4 * 16;  // rstd, q_rstd, k_rstd, lse (b,H,T)
      CHECK(bf16.view_bytes() == uint64_t(stats) * 4);
    }
  }
}
