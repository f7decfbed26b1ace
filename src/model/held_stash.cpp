// How a bf16-held stash is cut into pieces of samples (segment_type.hpp: HeldStash): the fewest samples per piece
// that divide the microbatch and reach the plan's rows a piece, for a type whose buffers grow by the sample.
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

HeldStash held_stash(const Segment& s, const ModelDims& d, int samples, bool input, int64_t piece_rows) {
  int piece = samples;
  if (s.type->samples_apart && s.shards <= 1 && samples > 1) {
    // the smallest divisor of samples with at least piece_rows rows (its divisors in pairs up to the root)
    const int64_t rows = std::max(1, d.rows_per_sample), least = (std::max<int64_t>(1, piece_rows) + rows - 1) / rows;
    for (int64_t i = 1; i * i <= samples; ++i) {
      if (samples % i != 0) continue;
      for (const int64_t c : {i, samples / i})
        if (c >= least && c < piece) piece = int(c);
    }
    if (piece < samples && !grows_by_sample(segment_sizes(s, d, samples), segment_sizes(s, d, piece), samples / piece))
      piece = samples;
  }
  HeldStash h;
  h.pieces = samples / piece;
  h.piece = held_stash_layout(s, d, piece, input);
  return h;
}

}  // namespace piper
