// The compiler: job → model → training DAG → directive passes → one plan body per device set →
// per-rank plans. Everything here runs on rank 0 only (or on one process for --dry-run --world N).
#pragma once
#include <string>
#include <vector>

#include "compile/simulate.hpp"
#include "config/job.hpp"
#include "ir/graph.hpp"
#include "model/model.hpp"
#include "plan/plan.hpp"

namespace piper {

// One phase of the compile: its wall time and this process's memory (resident at its end, and how far
// its peak rose above the resident size at its start; -1 where Linux does not say).
struct CompilePhase {
  std::string name;
  double seconds = 0;
  int64_t resident_bytes = -1, peak_growth_bytes = -1;
};

struct CompileResult {
  Model model;
  Graph graph;                      // after all passes (graph.model points into this struct: do not copy)
  std::vector<Directive> applied;   // directives as applied, generated ones included
  std::vector<Plan> bodies;         // one per device set; binding fields unset
  CostModel cost;
  Simulation simulation;            // verified, predicted timeline of one step
  double seconds = 0;               // wall time of compile (graph, passes, lowering, verification)
  std::vector<CompilePhase> phases;  // model, graph, passes, lowering, verification, in that order
  CompileResult() = default;
  CompileResult(const CompileResult&) = delete;
  CompileResult& operator=(const CompileResult&) = delete;
};

// `spec` must already have its [mesh] expanded (expand_mesh).
void compile_job(const JobSpec& spec, int world, CompileResult& out);

// Lowers the transformed graph to one plan body per device set.
std::vector<Plan> lower(const Graph& g, const JobSpec& spec);

// The plan of `rank`: its set's body plus the binding.
Plan bind_plan(const Plan& body, int rank);
// Device set of each rank.
std::vector<int> rank_sets(const Graph& g);

// The least rows of a piece of a bf16-held stash's passes (HeldPieceRule::min_rows): 512 on a CPU, where matmuls of
// 512 rows run near their best, 4096 on a GPU, whose matmuls need more rows to fill it.
int64_t held_piece_rows(const JobSpec& spec);
// A pass's fp32 view may take a twelfth of what a device set holds in bf16 for one microbatch before it goes by pieces:
// a view that size adds about 4% of fp32's activations to the bf16 run's (the held stashes being half of them).
constexpr uint64_t kHeldViewShare = 12;

// Fills the job-wide part of a plan from the spec.
void fill_job_fields(Plan& p, const JobSpec& spec, const Graph& g);

}  // namespace piper
