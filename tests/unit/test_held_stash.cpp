// A stash held in bf16 in pieces of samples (model/segment_type.hpp: held_stash): where a pass's whole view passes the
// limit, the most samples whose view fits it, never fewer rows than the least; one piece for segments spread over
// ranks and without a limit.
#include <catch2/catch.hpp>

#include "model/build.hpp"
#include "model/segment_type.hpp"

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
  const uint64_t one = held_stash_layout(mlp, m.dims, 1, true).fp32_bytes();  // one sample's view
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
    CHECK(h.view_bytes() == piece.fp32_bytes());
    CHECK(uint64_t(h.pieces) * h.view_bytes() == held_stash_layout(mlp, m.dims, c.samples, true).fp32_bytes());
    CHECK(h.held_bytes() == uint64_t(h.pieces) * piece.packed_bytes());
  }
}

TEST_CASE("held stash: a segment spread over ranks keeps one piece, and the head is not a type of samples apart",
          "[bf16]") {
  const Model m = gpt(128);
  CHECK_FALSE(m.segments.back().type->samples_apart);
  Segment attention = m.segments[1];
  const HeldPieceRule rule{128, held_stash_layout(attention, m.dims, 1, true).fp32_bytes()};
  CHECK(held_stash(attention, m.dims, 16, true, rule).pieces == 16);
  attention.shards = 2;  // tensor-parallel: one piece
  CHECK(held_stash(attention, m.dims, 16, true, rule).pieces == 1);
}
