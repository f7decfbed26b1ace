// The model as the compiler sees it: an ordered list of segments, each of a registered segment type
// (segment_type.hpp), with the parameters it uses (name, logical shape, init rule) and its FLOPs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_dims.hpp"

namespace piper {

struct SegmentType;

enum class InitKind : uint8_t { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;             // logical name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // logical shape, PyTorch convention: Linear weight is (out, in)
  int64_t numel = 0;
  InitKind init = InitKind::Zeros;
  float init_std = 0.f;
  bool decay = false;           // AdamW weight decay applies (matrices and embeddings only)
  // read only as an operand of linear-layer matmuls, which a bf16 run rounds to bf16: a ZeRO-3 bf16 run gathers it
  // in bf16 (the rounding the matmul would do, done before the wire)
  bool bf16_operand = false;
  // >= 0: not trained by the optimizer; after each step it moves by the `statistics_step` of that segment's
  // type, from the step's routing statistics (a router's selection bias)
  int32_t statistics_segment = -1;
  bool operator==(const ParamSpec&) const = default;
};

struct Segment {
  const SegmentType* type = nullptr;  // its math and buffer sizes
  std::string name;                   // "model.layers.3.mlp", "head"
  int layer = 0;                      // the model layer annotations select it by
  std::vector<int> params;            // indices into Model::params, in the order its type expects
  double fwd_flops_per_sample = 0;    // forward FLOPs for one sequence/sample (matmuls and attention)
  double tail_flops_per_sample = 0;   // of them, what a selective recompute's rerun of its stash's tail redoes
  int shards = 1;                     // ranks its parameters are spread over (the shard directive)
};

// A bound on the parameters a model build may add on this thread while the scope lives: the plan check builds
// the model a received plan's dimensions give no further than the plan's own parameter list reaches, so that
// dimensions no job would have (millions of experts) cannot make it build millions of names. Past the bound
// Model::add_param throws UserError.
class ParamBudget {
 public:
  explicit ParamBudget(size_t most);
  ~ParamBudget();
  ParamBudget(const ParamBudget&) = delete;
  ParamBudget& operator=(const ParamBudget&) = delete;
  static const size_t* current();

 private:
  size_t most_;
  const size_t* outer_;
};

struct Model {
  std::string kind;  // the family
  ModelDims dims;
  bool reads_tokens = true;  // trains on a token file (else on a synthetic task)
  std::vector<ParamSpec> params;
  std::vector<Segment> segments;
  int64_t n_params() const;           // distinct parameters (tied counted once)
  // Adds a parameter and returns its index (for family builders).
  int add_param(std::string name, std::vector<int64_t> shape, InitKind init, float std, bool decay);
  // add_param of a matrix read only by linear-layer matmuls (ParamSpec::bf16_operand)
  int add_matmul_weight(std::string name, std::vector<int64_t> shape, float std);
};

// Value of element `index` of parameter `p` for this seed: the same on every rank and strategy.
float init_value(const ParamSpec& p, uint64_t seed, int64_t index);
// Fills out[0..count) with elements [begin, begin+count) of parameter `p`.
void init_param_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count, float* out);

}  // namespace piper
