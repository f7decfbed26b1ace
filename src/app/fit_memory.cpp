// Memory planning for --dry-run --fit-memory (see fit_memory.hpp): a doubling then bisecting search over
// sequences per microbatch, one full compile (with its memory estimate) per trial size, ZeRO level and recompute
// policy.
#include "app/fit_memory.hpp"

#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>

#include "compile/compile.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// The estimate of one trial: the highest rank's peak and what dominates it.
struct Trial {
  uint64_t peak = 0;
  int set = -1, rank = -1, kind = -1;
  uint64_t kind_bytes = 0;
  double rerun_share = 0;
};

// The job with one recompute directive of `policy` over every region in place of its own ("none": none).
JobSpec with_recompute(JobSpec spec, const std::string& policy) {
  std::erase_if(spec.directives, [](const Directive& d) { return d.op == "recompute"; });
  for (size_t i = 0; i < spec.directives.size(); ++i) spec.directives[i].index = int(i);
  if (policy == "none") return spec;
  Directive d;
  d.op = "recompute";
  d.policy = policy;
  d.index = int(spec.directives.size());
  d.loc.file = "--fit-memory";
  d.generated = true;
  spec.directives.push_back(d);
  return spec;
}

Trial compile_trial(JobSpec spec, int world, int zero, int64_t batch) {
  spec.data.batch = int(batch);
  for (Directive& d : spec.directives)
    if (d.op == "replicate") d.zero = zero;
  CompileResult r;
  compile_job(spec, world, r);
  Trial t;
  double model = 0, reruns = 0;  // FLOPs of a step: the model's, and the reruns' over every rank
  for (const auto& seg : r.graph.model->segments) model += 3.0 * seg.fwd_flops_per_sample * double(batch);
  for (const Plan& body : r.bodies)
    for (const Instr& in : body.instrs)
      if (in.op == Op::Recompute)
        reruns += instr_forward_flops(body, in) * in.compute().samples * double(body.sets[size_t(body.set)].size());
  t.rerun_share = model > 0 ? reruns / model : 0;
  for (size_t s = 0; s < r.bodies.size(); ++s) {
    const MemoryEstimate& m = r.bodies[s].memory;
    if (t.set >= 0 && m.peak_total <= t.peak) continue;
    t.peak = m.peak_total;
    t.set = int(s);
    t.rank = r.bodies[s].sets[s][0];
    t.kind = 0;
    for (int k = 1; k < kBufferKinds; ++k)
      if (m.peak_by_kind[k] > m.peak_by_kind[t.kind]) t.kind = k;
    t.kind_bytes = m.peak_by_kind[t.kind];
  }
  return t;
}

FitRow fit_level(const JobSpec& spec, int world, int zero, int64_t per_sequence, uint64_t limit) {
  FitRow row;
  row.zero = zero;
  const int64_t most = std::min<int64_t>(kMaxSequences, INT_MAX / per_sequence);
  auto at = [&](int64_t seqs) { return compile_trial(spec, world, zero, seqs * per_sequence); };
  auto limited_by = [&](const Trial& t) {
    row.limit_rank = t.rank;
    row.limit_set = t.set;
    row.limit_kind = t.kind;
    row.limit_peak = t.peak;
    row.limit_kind_bytes = t.kind_bytes;
  };
  try {
    Trial first = at(1);
    if (first.peak > limit) {
      limited_by(first);
      return row;
    }
    // Doubling finds a size that does not fit (or the cap), bisection the last one that does.
    int64_t lo = 1, hi = 0;
    Trial lo_trial = first, hi_trial;
    while (hi == 0) {
      const int64_t next = std::min(lo * 2, most);
      if (next == lo) break;
      Trial t = at(next);
      if (t.peak > limit) hi = next, hi_trial = t;
      else lo = next, lo_trial = t;
    }
    while (hi != 0 && hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      Trial t = at(mid);
      if (t.peak > limit) hi = mid, hi_trial = t;
      else lo = mid, lo_trial = t;
    }
    row.sequences = int(lo);
    row.peak_bytes = lo_trial.peak;
    row.rerun_share = lo_trial.rerun_share;
    if (hi == 0) {
      row.capped = true;
      limited_by(lo_trial);
    } else {
      limited_by(hi_trial);
    }
  } catch (const UserError& e) {
    row.sequences = 0;
    row.error = e.what();
  }
  return row;
}

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }
double mib(uint64_t b) { return double(b) / 1048576.0; }

}  // namespace

FitReport fit_memory(const JobSpec& spec, int world, const Graph& compiled, uint64_t limit_bytes) {
  FitReport rep;
  rep.limit_bytes = limit_bytes;
  rep.microbatches = compiled.microbatches;
  rep.batch_per_sequence = compiled.global_batch / compiled.samples_per_microbatch;
  if (rep.batch_per_sequence * compiled.samples_per_microbatch != compiled.global_batch)
    throw SystemError("fit-memory: data.batch is not a whole number of microbatch sizes");
  for (const Directive& d : spec.directives) rep.replicated |= d.op == "replicate";
  for (int zero = 0; zero <= (rep.replicated ? 3 : 0); ++zero)
    for (const std::string& policy : fit_recompute_policies()) {
      rep.rows.push_back(fit_level(with_recompute(spec, policy), world, zero, rep.batch_per_sequence, limit_bytes));
      rep.rows.back().recompute = policy;
    }
  return rep;
}

void print_fit_report(const FitReport& r) {
  std::printf("fit memory: %.2f GiB (%.2f MiB) per rank; %d microbatches, data.batch = sequences per microbatch x %lld\n",
              gib(r.limit_bytes), mib(r.limit_bytes), r.microbatches, static_cast<long long>(r.batch_per_sequence));
  std::printf("%6s %10s %22s %10s %14s %12s   %s\n", "zero", "recompute", "sequences/microbatch", "data.batch",
              "est. peak MiB", "extra FLOPs", "limited by (estimate at the next size)");
  for (const FitRow& row : r.rows) {
    const std::string zero = r.replicated ? std::to_string(row.zero) : std::string("-");
    const char* policy = row.recompute.c_str();
    if (!row.error.empty()) {
      std::printf("%6s %10s %22s %10s %14s %12s   does not compile: %s\n", zero.c_str(), policy, "-", "-", "-", "-",
                  row.error.c_str());
      continue;
    }
    std::string why = row.limit_set < 0 ? std::string("-")
                                        : cat("rank ", row.limit_rank, " (device set ", row.limit_set, "): ",
                                              buffer_kind_name(BufferKind(row.limit_kind)), " ");
    if (row.limit_set >= 0) {
      char t[96];
      std::snprintf(t, sizeof(t), "%.2f MiB of its %.2f MiB peak", mib(row.limit_kind_bytes), mib(row.limit_peak));
      why += t;
    }
    if (row.capped) why = cat("the search stops at ", kMaxSequences, " sequences; largest kind there: ", why);
    if (row.sequences == 0) {
      std::printf("%6s %10s %22s %10s %14s %12s   %s (not even 1 sequence fits)\n", zero.c_str(), policy, "none", "-",
                  "-", "-", why.c_str());
      continue;
    }
    std::printf("%6s %10s %22d %10lld %14.2f %11.1f%%   %s\n", zero.c_str(), policy, row.sequences,
                static_cast<long long>(row.sequences * r.batch_per_sequence), mib(row.peak_bytes),
                100.0 * row.rerun_share, why.c_str());
  }
  if (!r.replicated) std::printf("no replicate directive: ZeRO levels do not apply, one row stands for all\n");
}

void fit_report_json(JsonWriter& w, const FitReport& r) {
  w.begin_object().key("limit_bytes").value(r.limit_bytes).key("microbatches").value(r.microbatches);
  w.key("batch_per_sequence").value(r.batch_per_sequence).key("replicated").value(r.replicated);
  w.key("max_sequences").value(kMaxSequences).key("rows").begin_array();
  for (const FitRow& row : r.rows) {
    w.begin_object().key("zero");
    if (r.replicated) w.value(row.zero);
    else w.null();  // ZeRO levels do not apply: the one row stands for all
    w.key("recompute").value(row.recompute);
    w.key("sequences").value(row.sequences);
    w.key("extra_flops").value(row.rerun_share);  // the reruns' FLOPs over the model's
    w.key("data_batch");
    if (row.sequences > 0) w.value(row.sequences * r.batch_per_sequence);
    else w.null();
    w.key("peak_bytes");
    if (row.sequences > 0) w.value(row.peak_bytes);
    else w.null();
    w.key("limited_by");
    if (row.limit_set < 0) {
      w.null();
    } else {
      w.begin_object().key("rank").value(row.limit_rank).key("device_set").value(row.limit_set);
      w.key("buffer_kind").value(buffer_kind_name(BufferKind(row.limit_kind)));
      w.key("buffer_kind_bytes").value(row.limit_kind_bytes).key("peak_bytes").value(row.limit_peak).end_object();
    }
    w.key("capped").value(row.capped).key("error");
    if (row.error.empty()) w.null();
    else w.value(row.error);
    w.end_object();
  }
  w.end_array().end_object();
}

}  // namespace piper
