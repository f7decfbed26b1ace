// --dry-run --fit-memory SIZE: per ZeRO level and recompute policy, the largest microbatch (sequences per
// microbatch) whose estimated peak fits in SIZE on every rank, which rank and buffer kind stop the next size, and
// the FLOPs the policy's reruns add.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "app/json_writer.hpp"
#include "config/job.hpp"
#include "ir/graph.hpp"

namespace piper {

// One ZeRO level's answer. sequences == 0: not even one sequence per microbatch fits (or the level does
// not compile: `error` says why). The limit is read at `sequences + 1` (or at 1 when nothing fits), unless
// the search reached `kMaxSequences` (then `capped`).
struct FitRow {
  int zero = 0;
  std::string recompute = "none";  // the policy of a recompute directive over every region, or none at all
  double rerun_share = 0;          // the FLOPs its reruns add, as a share of the model's FLOPs of a step
  int sequences = 0;           // per microbatch, per replica
  uint64_t peak_bytes = 0;     // the highest rank's estimated peak at `sequences`
  int limit_rank = -1, limit_set = -1;
  int limit_kind = -1;         // BufferKind with the largest peak on the limiting rank
  uint64_t limit_peak = 0, limit_kind_bytes = 0;
  bool capped = false;
  std::string error;
};

struct FitReport {
  uint64_t limit_bytes = 0;
  int microbatches = 0;
  int64_t batch_per_sequence = 0;  // data.batch = sequences per microbatch × this
  bool replicated = false;         // false: no replicate directive, one row stands for every level
  std::vector<FitRow> rows;
};

constexpr int kMaxSequences = 1 << 20;

// The recompute policies a fit is searched for: each replaces the job's own recompute directives.
inline const std::vector<std::string>& fit_recompute_policies() {
  static const std::vector<std::string> policies = {"none", "selective", "full"};
  return policies;
}

// Compiles `spec` (already expanded) for `world` ranks at each trial size; `compiled` is the graph of the
// job as given (its microbatches and batch split). Throws UserError when the job itself does not compile.
FitReport fit_memory(const JobSpec& spec, int world, const Graph& compiled, uint64_t limit_bytes);

// Prints the report as a table.
void print_fit_report(const FitReport& r);

// Writes the report as one JSON object (the value after a key(), or an array element).
void fit_report_json(JsonWriter& w, const FitReport& r);


}  // namespace piper
