// How a bf16-held stash is cut into pieces of samples (segment_type.hpp: HeldStash, HeldPieceRule): the most samples
// per piece whose view fits the plan's limit, for a type whose buffers grow by the sample.
#include <algorithm>

#include "model/segment_type.hpp"

namespace piper {

namespace {

// Whether every per-microbatch buffer of `whole` samples is `k` times that of `part` samples: pieces of samples
// then sit one after another in each of them.
bool grows_by_sample(const SegmentSizes& whole, const SegmentSizes& part, int k) {
  return whole.ragged_parts == 0 && whole.input_bytes == k * part.input_bytes && whole.out_bytes == k * part.out_bytes &&
         whole.stash_bytes == k * part.stash_bytes && whole.wstash_bytes == k * part.wstash_bytes;
}

}  // namespace

HeldStash held_stash(const Segment& s, const ModelDims& d, int samples, bool input, const HeldPieceRule& rule) {
  int piece = samples;
  const uint64_t whole_view = held_stash_layout(s, d, samples, input).view_bytes();
  if (s.type->samples_apart && s.shards <= 1 && samples > 1 && rule.view_limit > 0 && whole_view > rule.view_limit) {
    // divisors of samples (in pairs up to the root): the largest within the view limit and at least min_rows rows,
    // else the smallest of at least min_rows rows
    const int64_t rows = std::max(1, d.rows_per_sample), least = (std::max<int64_t>(1, rule.min_rows) + rows - 1) / rows;
    const auto most = int64_t(static_cast<long double>(rule.view_limit) * samples / static_cast<long double>(whole_view));
    int64_t within = 0, above = samples;
    for (int64_t i = 1; i * i <= samples; ++i) {
      if (samples % i != 0) continue;
      for (const int64_t c : {i, samples / i}) {
        if (c < least) continue;
        if (c <= most) within = std::max(within, c);
        above = std::min(above, c);
      }
    }
    piece = int(within > 0 ? within : above);
    if (piece < samples && !grows_by_sample(segment_sizes(s, d, samples), segment_sizes(s, d, piece), samples / piece))
      piece = samples;
  }
  HeldStash h;
  h.pieces = samples / piece;
  h.piece = held_stash_layout(s, d, piece, input);
  return h;
}

}  // namespace piper
