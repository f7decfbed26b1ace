// Compiler driver: model, graph, passes, lowering, verification; and per-rank binding of plan bodies.
#include "compile/compile.hpp"
#include "compile/finalize.hpp"

#include <algorithm>

#include <set>

#include "ir/build.hpp"
#include "passes/passes.hpp"
#include "model/build.hpp"
#include "model/family.hpp"
#include "util/error.hpp"
#include "util/memory_usage.hpp"
#include "util/timer.hpp"

namespace piper {

int64_t held_piece_rows(const JobSpec& spec) { return spec.job.backend == "cuda" ? 4096 : 512; }

void fill_job_fields(Plan& p, const JobSpec& spec, const Graph& g) {
  p.job_name = spec.job.name;
  p.job_text = spec.text;
  p.backend = spec.job.backend;
  p.precision = spec.job.precision == "bf16" ? Precision::Bf16 : Precision::Fp32;
  p.held_pieces.min_rows = held_piece_rows(spec);
  p.seed = spec.job.seed;
  p.steps = spec.job.steps;
  p.watchdog_s = spec.job.watchdog_s;
  p.log_every = spec.job.log_every;
  p.peak_tflops = spec.job.peak_tflops;
  p.skip_nonfinite = spec.job.on_nonfinite == "skip";
  p.max_skipped = spec.job.max_skipped;
  p.checkpoint_dir = spec.checkpoint.dir;
  p.checkpoint_every = spec.checkpoint.every;
  p.checkpoint_keep = spec.checkpoint.keep;
  p.checkpoint_async = spec.checkpoint.async;
  p.allow_changes = spec.checkpoint.allow_changes;
  p.model_keys = model_keys_text(spec.model);
  p.threads = spec.job.threads;
  p.optimizer = spec.optimizer;
  const Model& m = *g.model;
  DataConfig& d = p.data;
  d.kind = m.reads_tokens ? DataConfig::Kind::Tokens : DataConfig::Kind::Synthetic;
  d.path = spec.data.path;
  d.token_bytes = spec.data.token_bytes;
  d.vocab = spec.model.vocab;
  d.seq_len = spec.model.seq_len;
  d.sequential = spec.data.sampler == "sequential";
  d.seed = spec.job.seed;
  d.batch = spec.data.batch;
  d.d_in = spec.model.d_in;
  d.n_classes = spec.model.n_classes;
  if (!spec.eval.path.empty()) {  // the validation file, read in order from its start
    p.eval_every = spec.eval.every;
    p.eval_batches = spec.eval.batches;
    p.eval_data = d;
    p.eval_data.path = spec.eval.path;
    p.eval_data.token_bytes = 0;
    p.eval_data.sequential = true;
  }
  p.dims = m.dims;
  p.params = m.params;
  p.segments = m.segments;
  for (size_t i = 0; i < p.segments.size(); ++i) p.segments[i].shards = g.segment_shards[i];
  p.world = g.world;
  p.sets.clear();
  for (const auto& s : g.sets) p.sets.emplace_back(s.ranks.begin(), s.ranks.end());
  p.microbatches = g.microbatches;
  p.samples_per_replica = g.samples_per_microbatch * g.microbatches;
  p.data_sharing = g.sets.empty() ? 1 : g.sets[0].tp;
}

namespace {

// For messages: which directives ordered each device set's nodes.
OrderOrigins order_origins(const Graph& g, const std::vector<Directive>& applied) {
  OrderOrigins o;
  o.per_set.resize(g.sets.size());
  std::vector<std::set<int>> seen(g.sets.size());
  for (const auto& e : g.edges) {
    if (e.removed || e.kind != EdgeKind::Order || e.source_directive < 0) continue;
    int set = g.nodes[size_t(e.from)].device_set;
    if (set < 0 || !seen[size_t(set)].insert(e.source_directive).second) continue;
    for (const auto& d : applied)
      if (d.index == e.source_directive)
        o.per_set[size_t(set)] += (o.per_set[size_t(set)].empty() ? "" : ", ") + d.describe();
  }
  return o;
}

// For each send of a plan, the first compute instruction after it that the simulation starts once the send is
// complete (its receiver took it): where the sent buffer is free again. Other entries are unused.
std::vector<size_t> send_completions(const Plan& p, const std::vector<SimSpan>& spans) {
  const size_t n = p.instrs.size();
  std::vector<size_t> done(n, n - 1);
  std::vector<double> start(n, 0.0), end(n, 0.0);
  for (const SimSpan& s : spans) {
    start[size_t(s.instr)] = s.start;
    end[size_t(s.instr)] = s.end;
  }
  for (size_t i = 0; i < n; ++i) {
    if (p.instrs[i].op != Op::Send) continue;
    for (size_t j = i + 1; j < n; ++j)
      if (op_is_compute(p.instrs[j].op) && start[j] >= end[i]) {
        done[i] = j;
        break;
      }
  }
  return done;
}

}  // namespace

void compile_job(const JobSpec& spec, int world, CompileResult& out) {
  double t0 = now_seconds();
  // Each phase timed, with the rise of this process's peak memory above where it started.
  auto phase = [&](const char* name, auto&& work) {
    const bool peak_reset = reset_peak_resident();
    const int64_t before = resident_bytes();
    const double start = now_seconds();
    work();
    CompilePhase p{name, now_seconds() - start, -1, -1};
    if (before > 0) p.resident_bytes = resident_bytes();
    if (peak_reset && before > 0) p.peak_growth_bytes = std::max<int64_t>(0, peak_resident_bytes() - before);
    out.phases.push_back(p);
  };
  phase("model", [&] {
    out.model = build_model(spec.model);
    out.model.dims.bf16_matmul_inputs = spec.job.precision == "bf16";
  });
  phase("graph", [&] { out.graph = build_training_graph(out.model, spec, world); });
  phase("passes", [&] { out.applied = apply_directives(out.graph, spec); });
  phase("lowering", [&] { out.bodies = lower(out.graph, spec); });
  out.cost = CostModel::from_spec(spec.cost);
  phase("verification", [&] { out.simulation = simulate_plans(out.bodies, out.cost, order_origins(out.graph, out.applied)); });
  for (size_t s = 0; s < out.bodies.size(); ++s) {
    out.bodies[s].predicted_step = out.simulation.step_time;
    out.bodies[s].predicted_bubble = out.simulation.bubble[s];
    estimate_memory(out.bodies[s], send_completions(out.bodies[s], out.simulation.spans[s]));
  }
  out.seconds = now_seconds() - t0;
}

std::vector<int> rank_sets(const Graph& g) {
  std::vector<int> of(static_cast<size_t>(g.world), -1);
  for (size_t s = 0; s < g.sets.size(); ++s)
    for (int r : g.sets[s].ranks) of[size_t(r)] = int(s);
  return of;
}

Plan bind_plan(const Plan& body, int rank) {
  Plan p = body;
  p.rank = rank;
  const auto& ranks = body.sets[size_t(body.set)];
  p.replica = -1;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank) p.replica = int(i);
  PIPER_CHECK(p.replica >= 0, "rank ", rank, " is not in device set ", body.set);
  return p;
}

}  // namespace piper
