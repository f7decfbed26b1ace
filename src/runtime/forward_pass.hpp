// A model's forward on one device, without a plan: every segment in order over one sequence, up to the head,
// whose logits it returns. What sampling from a checkpoint runs; training never does (the executor runs plans).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "model/model.hpp"

namespace piper {

class ForwardPass {
 public:
  // `model`: a language model (its head segment has SegmentType::logits), built for its trained seq_len, which
  // bounds the context. The model's own dims, but an expert capacity of none: every routed token is kept, as in
  // Hugging Face transformers' inference. Device buffers for the longest context are allocated once.
  ForwardPass(const Model& model, Backend& backend);
  ~ForwardPass();
  ForwardPass(const ForwardPass&) = delete;
  ForwardPass& operator=(const ForwardPass&) = delete;

  // Parameter `index` (Model::params) from host values, model.params[index].numel of them.
  void set_param(size_t index, const std::vector<float>& values);
  // The logits (vocab) of the next token after `tokens` (1 <= size <= seq_len), from a forward over exactly
  // these tokens: position t sees tokens [0, t].
  std::vector<float> next_logits(const std::vector<int32_t>& tokens);

  int max_context() const { return model_.dims.seq_len; }
  int vocab() const { return model_.dims.vocab; }

 private:
  void* device(size_t bytes);  // allocated from the backend, released with this object

  Model model_;
  Backend& backend_;
  Kernels& k_;
  std::unique_ptr<StreamContext> stream_;         // bound to the constructing thread, which must make every call
  size_t head_ = 0;                              // the segment with the logits
  std::vector<float*> params_;                   // by model parameter (device)
  std::vector<void*> out_, stash_;               // by segment (device), sized for the longest context
  float* scratch_ = nullptr;                     // backend scratch
  float* workspace_ = nullptr;                   // segment scratch (SegmentSizes::workspace_bytes)
  double* sums_ = nullptr;                       // device: sinks for the loss, balance loss and routing statistics (never read)
  std::vector<std::pair<void*, size_t>> owned_;  // every allocation, released at the end
  std::vector<int32_t> counts_;                  // host: a ragged input's part counts
};

}  // namespace piper
