// A stash held in bf16 in pieces of samples (model/segment_type.hpp: held_stash): the fewest samples that divide the
// microbatch and make the plan's rows a piece, only for types whose samples are apart and segments on one rank.
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

TEST_CASE("held stash: pieces of the fewest samples that divide the microbatch and make 512 rows", "[bf16]") {
  const Model m = gpt(128);
  const Segment& mlp = m.segments[2];
  REQUIRE(mlp.type->name == "gpt2.mlp");
  REQUIRE(mlp.type->samples_apart);
  struct Case {
    int samples, pieces;
  };
  // 128 rows a sample: at least 4 samples a piece
  for (const Case c : {Case{16, 4}, Case{12, 3}, Case{4, 1}, Case{3, 1}, Case{1, 1}, Case{10, 2}, Case{7, 1}}) {
    INFO(c.samples << " samples");
    const HeldStash h = held_stash(mlp, m.dims, c.samples, true, 512);
    CHECK(h.pieces == c.pieces);
    const StashLayout whole = held_stash_layout(mlp, m.dims, c.samples, true);
    const StashLayout piece = held_stash_layout(mlp, m.dims, c.samples / c.pieces, true);
    CHECK(h.piece.runs.size() == piece.runs.size());
    CHECK(h.view_bytes() == piece.fp32_bytes());
    CHECK(uint64_t(h.pieces) * h.view_bytes() == whole.fp32_bytes());
    CHECK(h.held_bytes() == uint64_t(h.pieces) * piece.packed_bytes());
  }
  // long sequences: a sample a piece; a GPU's 4096 rows: 4 samples
  const Model long_seq = gpt(1024);
  CHECK(held_stash(long_seq.segments[1], long_seq.dims, 8, false, 512).pieces == 8);
  CHECK(held_stash(long_seq.segments[1], long_seq.dims, 8, false, 4096).pieces == 2);
  CHECK(held_stash(long_seq.segments[1], long_seq.dims, 3, false, 4096).pieces == 1);
}

TEST_CASE("held stash: a segment spread over ranks keeps one piece; the head is not a type of samples apart", "[bf16]") {
  Model m = gpt(128);
  Segment head = m.segments.back();  // a type without samples_apart
  CHECK_FALSE(head.type->samples_apart);
  Segment attention = m.segments[1];
  CHECK(held_stash(attention, m.dims, 16, true, 512).pieces == 4);
  attention.shards = 2;  // tensor-parallel: one piece
  CHECK(held_stash(attention, m.dims, 16, true, 512).pieces == 1);
}
