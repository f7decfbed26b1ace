// The model as the compiler sees it: an ordered list of segments (embedding, blocks, head), each with
// the parameters it uses (name, logical shape, init rule) and its FLOPs per token. No tensors live here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>


namespace piper {

enum class SegmentKind : uint8_t { Embedding, Block, Head, MlpLayer, MlpHead };
const char* segment_kind_name(SegmentKind k);

enum class InitKind : uint8_t { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;             // logical name, e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;   // logical shape, PyTorch convention: Linear weight is (out, in)
  int64_t numel = 0;
  InitKind init = InitKind::Zeros;
  float init_std = 0.f;
  bool decay = false;           // AdamW weight decay applies (matrices and embeddings only)
};

// Dimensions every kernel needs; one struct for both model kinds.
struct ModelDims {
  SegmentKind first_kind = SegmentKind::Embedding;
  int vocab = 0, seq_len = 0, d_model = 0, n_heads = 0, d_ff = 0;  // gpt
  int d_in = 0, d_hidden = 0, n_classes = 0;                       // mlp
  int n_layers = 0;
  bool is_gpt() const { return first_kind == SegmentKind::Embedding; }
  // Rows one sequence/sample contributes to the activation matrices: T for gpt, 1 for mlp.
  int rows_per_sample() const { return is_gpt() ? seq_len : 1; }
};

struct Segment {
  SegmentKind kind;
  std::string name;         // "embedding", "blocks.3", "head"
  int layer = -1;           // user-visible layer index; embedding and head take -1
  std::vector<int> params;  // indices into Model::params, in the order the kernels expect
  double fwd_flops_per_sample = 0;  // forward FLOPs for one sequence/sample (matmuls and attention)
};

struct Model {
  ModelDims dims;
  std::vector<ParamSpec> params;
  std::vector<Segment> segments;
  int64_t n_params() const;           // distinct parameters (tied counted once)
};

// Value of element `index` of parameter `p` for this seed: the same on every rank and strategy.
float init_value(const ParamSpec& p, uint64_t seed, int64_t index);
// Fills out[0..count) with elements [begin, begin+count) of parameter `p`.
void init_param_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count, float* out);

}  // namespace piper
