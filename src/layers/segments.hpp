// Forward, backward-input (BI) and backward-weight (BW) of each segment kind, composed from backend
// kernels. A fused backward is BI then BW over the same buffers, so split and fused give identical bits.
#pragma once
#include <cstdint>

#include "backend/kernels.hpp"
#include "model/model.hpp"

namespace piper {

struct SegmentIO {
  int samples = 0;              // sequences (gpt) or samples (mlp) in this microbatch
  const float* const* w = nullptr;  // parameters, in Segment::params order
  float* const* g = nullptr;        // their gradients, same order
  uint32_t overwrite = 0;       // bit i: gradient i is written (first write of the step), else accumulated
  const float* in = nullptr;    // activation from the previous segment; null when reading data
  float* out = nullptr;         // activation for the next segment; null for heads
  void* stash = nullptr;        // forward → backward (data ids are loaded into its start, see data_slot)
  float* wstash = nullptr;      // backward-input → backward-weight
  float* workspace = nullptr;   // scratch, segment_sizes().workspace_bytes
  float* attn_scratch = nullptr;  // backend attention scratch
  const float* dout = nullptr;  // gradient of `out`; unused by heads (they start from the loss)
  float* din = nullptr;         // gradient of `in`; null when the segment reads data
  double* loss_sum = nullptr;   // heads add loss_scale · Σ token losses
  float loss_scale = 1.f;
};

// What a segment reads from the data pipeline into the start of its stash.
enum class DataSlot : uint8_t { None, Tokens, Targets, Features };
DataSlot data_slot(const Segment& seg);

void segment_forward(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io);
void segment_backward_input(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io);
void segment_backward_weight(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io);

}  // namespace piper
