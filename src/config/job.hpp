// JobSpec: the validated content of a job file (DESIGN.md §2). Everything downstream reads this,
// never the TOML itself. Source locations are kept so that later errors can point into the file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/model_dims.hpp"
#include "util/optimizer_config.hpp"

namespace piper {

// Where a value came from: "job.toml:12:5", or "--set model.n_layers".
struct SourceLoc {
  std::string file;
  int line = 0;
  int column = 0;
  std::string str() const;
};

// One tag constraint of a filter: an integer value, any value ("*"), or a name (PASS = "F").
struct TagMatch {
  enum class Kind { Int, Any, Name } kind = Kind::Any;
  int64_t value = 0;
  std::string name;
  bool operator==(const TagMatch&) const = default;
};

// A filter matches nodes whose tags satisfy every constraint.
struct Filter {
  std::map<std::string, TagMatch> match;
  std::string str() const;
};

struct JobSection {
  std::string name = "piper";
  int64_t steps = 100;
  uint64_t seed = 1234;
  std::string backend = "cpu";  // cpu | cuda
  std::string precision = "fp32";  // fp32 | bf16 (bf16 matmul operands, fp32 accumulation and master weights)
  std::string grad_reduce = "fp32";  // fp32 | bf16: the gradients' data-parallel reductions travel and sum in bf16
  int threads = 0;              // compute threads per rank; 0 = cores / ranks on the node
  double watchdog_s = 600;      // no instruction finished for this long during a step ends the job (exit 5); 0 = off
  int64_t log_every = 1;
  double peak_tflops = 0;  // a rank's peak for the MFU of the step lines; 0: measured (CPU) or the GPU's (CUDA)
  std::string on_nonfinite = "stop";  // a non-finite loss or gradient norm: stop (exit 3) | skip the update
  int64_t max_skipped = 5;            // with "skip": stop after this many skipped steps in a row
};

// [model]: the family (model.kind) and the hyperparameters it reads (model/model.hpp lists them all).
struct ModelSpec : ModelDims {
  std::string kind = "gpt";  // a registered family: gpt | qwen3 | mlp
};

struct DataSpec {
  std::string path;               // a token file; empty for families trained on a synthetic task
  int batch = 16;                 // global batch, sequences (or samples) per step
  std::string sampler = "random";  // random | sequential
  int token_bytes = 0;            // bytes per token id: 0 = by the file name (.u32.bin, .u16.bin/.bin, else raw bytes)
};

// [eval]: the mean cross-entropy of a validation token file (val_loss), every `every` steps and after the last:
// `batches` batches of data.batch sequences from the file's start, in order, with the weights of that step.
struct EvalSpec {
  std::string path;  // empty: no evaluation
  int64_t every = 100;
  int64_t batches = 4;
};

using OptimizerSpec = OptimizerConfig;

struct CheckpointSpec {
  std::string dir;   // empty: no checkpoints
  int64_t every = 0;  // 0: only at the end of the run
  int keep = 0;       // 0: keep all
  bool async = false;  // write on a thread of rank 0 while training continues
  // Settings --resume may find changed against the checkpoint with a warning instead of an error:
  // "job.seed", "data.sampler", "data.path" (the data file's content), "model.KEY".
  std::vector<std::string> allow_changes;
};

// [mesh]: a shorthand that writes annotations and directives for the common cases.
struct MeshSpec {
  bool present = false;
  int pp = 1;
  int dp = 1;
  int microbatches = 0;  // 0: pp (or 1 without pipeline)
  int zero = 0;
  double bucket_mb = 25.0;
  int grad_buckets_in_flight = 2;
  int ep = 1;            // ranks per expert group, inside each stage's dp ranks (1: no expert parallelism)
  int tp = 1;            // ranks per tensor-parallel group: each stage runs on dp · tp ranks (1: none)
  bool sequence = false;  // with tp: sequence parallelism (the activations between split segments in k parts)
  int chunks = 1;        // interleaved-1f1b: stages per pipeline rank (stage s on rank s mod pp)
  std::string schedule;  // empty: default
  std::string recompute;  // "", "none", "full" or "selective": writes a recompute directive over every region
  SourceLoc loc;
};

struct Annotation {
  std::string tag;
  std::vector<std::pair<int, int>> layers;  // inclusive ranges, one per tag value 0,1,...
  // or inclusive ranges of segment names ("model.layers.3.mlp"), which may cut inside a layer
  std::vector<std::pair<std::string, std::string>> segments;
  // or a pattern ("model.layers.*.mlp.experts", * any characters): a region, and a tag value, per matching
  // segment in model order; or ([mesh] ep) every segment whose parameters can be sharded (experts)
  std::string pattern;
  bool expert_segments = false;
  bool tp_segments = false;  // ([mesh] tp) a region per segment that tensor parallelism can split
  int index = 0;
  SourceLoc loc;
};

// One [[directive]]. Which fields are meaningful depends on `op`.
struct Directive {
  std::string op;  // split | place | replicate | shard | tp | order | schedule | recompute
  int index = 0;   // position among [[directive]] tables, 0-based
  SourceLoc loc;
  Filter filter;
  // split
  std::string dim = "MB";
  int count = 1;
  // place
  std::vector<int> devices;
  // replicate
  int zero = 0;
  double bucket_mb = 25.0;
  int grad_buckets_in_flight = 2;  // zero >= 2: full-gradient buffers alive at once (waiting on reductions)
  std::string stream = "dp";
  // shard and tp (and the stream above)
  int group = 0;  // shard: ranks per expert group (0: the whole device set); tp: ranks per tensor-parallel group
  bool sequence = false;  // tp: the activations between split segments held in parts (sequence parallelism)
  // recompute
  std::string policy = "full";      // full | selective
  int every = 1;                    // every k-th eligible segment of the matched regions, in model order
  std::vector<std::string> types;   // only segments of these types ("qwen3.mlp"); empty: every type
  // order
  std::vector<std::vector<Filter>> slots;
  // schedule
  std::string kind;
  int chunks = 0;        // interleaved: regions per rank (0 = from annotations)
  std::string file;      // kind = file
  std::string tag = "PP";  // which tag dimension is the pipeline
  bool generated = false;  // written by [mesh] or a schedule generator, not by the user
  int generated_by = -1;   // the schedule directive that wrote this order (-1: [mesh] or the user)
  std::string describe() const;  // "directive #3 (op = \"place\", job.toml:40)"
};

struct CostSpec {
  bool present = false;
  std::string preset = "cpu";   // cpu | h100 | h200; absent: h100 for backend = "cuda", else cpu
  bool preset_given = false;    // [cost] preset was written (else it follows job.backend)
  double flops = 0;             // device FLOP/s; 0 = preset
  double p2p_bandwidth = 0;     // bytes/s; 0 = preset
  double collective_bandwidth = 0;
  double latency = 0;           // seconds per message
  bool uniform = false;         // F = B = W = 1 time unit, comm free (for schedule analysis)
};

struct JobSpec {
  std::string path;  // the job file
  std::string text;  // the job file's text, with overrides recorded at the end as comments
  JobSection job;
  ModelSpec model;
  DataSpec data;
  EvalSpec eval;
  OptimizerSpec optimizer;
  CheckpointSpec checkpoint;
  MeshSpec mesh;
  CostSpec cost;
  std::vector<Annotation> annotations;
  std::vector<Directive> directives;
};

}  // namespace piper
