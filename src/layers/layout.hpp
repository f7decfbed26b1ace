// Sizes and layouts of the per-microbatch buffers of one segment: its output activation, the stash
// kept from forward to backward, the stash kept from input-grad to weight-grad (BI → BW), and scratch.
// The compiler sizes plan buffers from these; the layers carve the same buffers with the same offsets.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/model.hpp"

namespace piper {

struct SegmentSizes {
  size_t out_bytes = 0;        // activation handed to the next segment (0 for heads)
  size_t stash_bytes = 0;      // forward → backward
  size_t wstash_bytes = 0;     // backward-input → backward-weight
  size_t workspace_bytes = 0;  // scratch during backward (excluding backend attention scratch)
  size_t input_bytes = 0;      // activation this segment reads (0 when it reads data)
};

// `samples`: sequences (gpt) or samples (mlp) in the microbatch.
SegmentSizes segment_sizes(const Segment& seg, const ModelDims& d, int samples);

// Offsets (in floats from the start of the stash) of each saved tensor of a block; n = samples·T rows.
struct BlockStash {
  size_t ln1, ln1_mean, ln1_rstd, qkv, att, atty, xmid, ln2, ln2_mean, ln2_rstd, fc_dgelu, fc_gelu, total;
  BlockStash(int64_t n, int64_t C, int64_t F, int64_t B, int64_t NH, int64_t T);
};

// Offsets (floats) of the backward-input results a block's weight gradients need; n rows.
struct BlockWStash {
  size_t dfc_pre, dln2, dxmid, dqkv, dln1, total;
  BlockWStash(int64_t n, int64_t C, int64_t F);
};

}  // namespace piper
