// Dry run (see dry_run.hpp).
#include "app/dry_run.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/fit_memory.hpp"
#include "app/launch.hpp"
#include "compile/compile.hpp"
#include "ir/dump.hpp"
#include "model/segment_type.hpp"
#include "util/error.hpp"
#include "util/memory_usage.hpp"
#include "util/timer.hpp"

namespace piper {

namespace {

std::string directive_text(const Directive& d, bool full) {
  std::string s = d.describe() + ":";
  if (d.op == "split") s += cat(" count = ", d.count);
  else if (d.op == "place") {
    s += " filter = " + d.filter.str() + ", devices = [";
    const size_t n = d.devices.size();
    for (size_t i = 0; i < n; ++i) {
      if (n > 12 && i == 4) {  // long rank lists: first few, last, and how many
        s += cat(", ... , ", d.devices[n - 1], "] (", n, " ranks)");
        break;
      }
      s += cat(i ? ", " : "", d.devices[i]);
      if (i + 1 == n) s += "]";
    }
  } else if (d.op == "replicate") {
    s += cat(" filter = ", d.filter.str(), ", zero = ", d.zero, ", bucket_mb = ", d.bucket_mb,
             ", grad_buckets_in_flight = ", d.grad_buckets_in_flight, ", stream = \"", d.stream, "\"");
  } else if (d.op == "shard") {
    s += cat(" filter = ", d.filter.str(), ", stream = \"", d.stream, "\"");
  } else if (d.op == "schedule") {
    s += cat(" kind = \"", d.kind, "\"");
  } else if (d.op == "order") {
    for (size_t i = 0; i < d.slots.size(); ++i) {
      if (!full && d.slots.size() > 24 && i == 16) {  // long orders: the start and the count
        s += cat(" -> ... (", d.slots.size(), " slots; --dump-plan writes all)");
        break;
      }
      s += i ? " ->" : "";
      for (size_t j = 0; j < d.slots[i].size(); ++j) {
        const Filter& f = d.slots[i][j];
        std::string pass, rest;
        for (const auto& [k, m] : f.match) {
          if (k == "PASS") pass = m.name;
          else rest += cat(rest.empty() ? "" : ",", k, "=", m.kind == TagMatch::Kind::Int ? std::to_string(m.value) : "*");
        }
        s += cat(j ? " + " : " ", pass.empty() ? "*" : pass, "[", rest, "]");
      }
    }
  }
  return s;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  out.close();  // a full disk shows at the last flush
  if (!out) throw SystemError(cat("--dump-plan: cannot write ", p.string(), ": ", std::strerror(errno ? errno : EIO)));
}

// The cost model's timeline of one step, in the Chrome-trace format --trace writes (times in microseconds,
// uniform units scaled by 1000): one process per device set (its first rank), one thread per stream.
std::string predicted_timeline_json(const CompileResult& r) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"predicted\":true,\"traceEvents\":[\n";
  const double scale = r.cost.uniform ? 1e3 : 1e6;
  bool first = true;
  for (size_t s = 0; s < r.bodies.size(); ++s) {
    const Plan& p = r.bodies[s];
    const int rank = p.sets[s][0];
    Plan bound = bind_plan(p, rank);
    auto add = [&](const std::string& e) {
      out += (first ? "" : ",\n") + e;
      first = false;
    };
    add(cat("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", rank, ",\"args\":{\"name\":\"rank ", rank,
            " (device set ", s, ")\"}}"));
    for (size_t t = 0; t < p.streams.size(); ++t)
      add(cat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank, ",\"tid\":", t, ",\"args\":{\"name\":\"",
              p.streams[t], "\"}}"));
    for (const auto& span : r.simulation.spans[s]) {
      const Instr& in = p.instrs[size_t(span.instr)];
      char buf[128];
      std::snprintf(buf, sizeof(buf), "\"ts\":%.3f,\"dur\":%.3f", span.start * scale, (span.end - span.start) * scale);
      add(cat("{\"name\":\"", instr_label(bound, in), "\",\"ph\":\"X\",", buf, ",\"pid\":", rank, ",\"tid\":",
              int(in.stream), ",\"args\":{\"instr\":", span.instr, ",\"node\":", in.node, ",\"mb\":", in.mb, "}}"));
    }
  }
  return out + "\n]}\n";
}

}  // namespace

int dry_run(const CliOptions& opts, int world_size) {
  const int world = opts.world > 0 ? opts.world : world_size;
  JobSpec spec = load_and_check(opts, world);
  CompileResult result;
  compile_job(spec, world, result);
  const Graph& g = result.graph;
  std::printf("dry run of '%s' for %d rank%s: compiled in %.3f s\n", spec.job.name.c_str(), world, world == 1 ? "" : "s",
              result.seconds);
  std::printf("model: %s, %lld parameters, %zu segments; %zu regions, %zu device sets, %d microbatches of %d samples\n",
              spec.model.kind.c_str(), static_cast<long long>(result.model.n_params()), result.model.segments.size(),
              g.regions.size(), g.sets.size(), g.microbatches, g.samples_per_microbatch);
  for (const auto& r : g.regions)
    std::printf("  %s: segments %s .. %s\n", r.label().c_str(),
                result.model.segments[size_t(r.seg_begin)].name.c_str(),
                result.model.segments[size_t(r.seg_end - 1)].name.c_str());
  // Counted-row buffers (routed tokens) are sized by a bound: say which one.
  for (size_t i = 0; i < result.model.segments.size(); ++i) {
    Segment seg = result.model.segments[i];
    seg.shards = g.segment_shards[i];
    const SegmentSizes z = segment_sizes(seg, result.model.dims, g.samples_per_microbatch);
    if (z.ragged_parts == 0 || z.ragged_width == 0) continue;
    const size_t rows = (z.input_bytes - size_t(z.ragged_parts) * 4) / (sizeof(float) * size_t(z.ragged_width));
    std::printf("routed rows: %s holds up to %zu rows per microbatch (%s%s)\n", seg.name.c_str(), rows,
                spec.model.moe_capacity_factor > 0 ? "the capacity of every expert" : "the worst case, dropless",
                seg.shards > 1 ? cat(", from all ", seg.shards, " ranks of its set").c_str() : "");
    break;  // every MoE layer has the same bound
  }
  std::printf("graph: %zu nodes\n", g.live_nodes());
  std::printf("%5s %8s %13s %12s %14s   peak by kind (MiB): params grads optim activations comm workspace\n", "set",
              "ranks", "instructions", "plan bytes", "est. peak MiB");
  uint64_t total_bytes = 0;  // rank 0 sends each body once; the set broadcasts it
  const double serialize_start = now_seconds();
  double serialize_seconds = 0;
  for (size_t s = 0; s < result.bodies.size(); ++s) {
    const Plan& p = result.bodies[s];
    const std::vector<uint8_t> body = serialize_plan(p);
    deserialize_plan(body.data(), body.size());  // what each rank reads must pass the plan check
    size_t bytes = body.size();
    total_bytes += bytes;
    serialize_seconds = now_seconds() - serialize_start;
    std::printf("%5zu %8zu %13zu %12zu %14.2f  ", s, p.sets[s].size(), p.instrs.size(), bytes,
                double(p.memory.peak_total) / 1048576.0);
    for (int k = 0; k < kBufferKinds; ++k) std::printf(" %.2f", double(p.memory.peak_by_kind[k]) / 1048576.0);
    std::printf("\n");
  }
  std::printf("cost model %s: predicted step %.6g %s; bubble per device set:", result.cost.describe().c_str(),
              result.simulation.step_time, result.cost.uniform ? "units" : "s");
  for (size_t s = 0; s < result.bodies.size(); ++s) std::printf(" %.4f", result.simulation.bubble[s]);
  std::printf("\n");
  std::printf("plan bytes sent by rank 0: %llu (one body per device set, broadcast inside the set); compile time %.3f s\n",
              static_cast<unsigned long long>(total_bytes), result.seconds);
  // Where the compile's time and memory went (resident: this process at the phase's end; peak: how far
  // its peak rose above where the phase started).
  std::printf("compile phase %-15s %10s %14s %14s\n", "(name)", "seconds", "resident MiB", "peak rise MiB");
  auto mib = [](int64_t b) {
    char t[32] = "-";
    if (b >= 0) std::snprintf(t, sizeof(t), "%.1f", double(b) / 1048576.0);
    return std::string(t);
  };
  for (const CompilePhase& ph : result.phases)
    std::printf("compile phase %-15s %10.3f %14s %14s\n", ph.name.c_str(), ph.seconds, mib(ph.resident_bytes).c_str(),
                mib(ph.peak_growth_bytes).c_str());
  std::printf("compile phase %-15s %10.3f %14s %14s\n", "serialization", serialize_seconds, mib(resident_bytes()).c_str(),
              "-");
  std::printf("directives:\n");
  for (const auto& d : result.applied) std::printf("  %s\n", directive_text(d, false).c_str());
  if (!opts.dump_plan.empty()) {
    std::filesystem::path dir(opts.dump_plan);
    std::filesystem::create_directories(dir);
    write_file(dir / "graph.txt", graph_to_text(g));
    write_file(dir / "graph.dot", graph_to_dot(g));
    std::string dirs;
    for (const auto& d : result.applied) dirs += directive_text(d, true) + "\n";
    write_file(dir / "directives.txt", dirs);
    for (size_t s = 0; s < result.bodies.size(); ++s) {
      Plan bound = bind_plan(result.bodies[s], result.bodies[s].sets[s][0]);
      write_file(dir / cat("plan_set", s, ".txt"), plan_to_text(bound));
      const std::vector<uint8_t> bytes = serialize_plan(result.bodies[s]);  // as rank 0 sends it
      write_file(dir / cat("plan_set", s, ".bin"), std::string(bytes.begin(), bytes.end()));
    }
    write_file(dir / "timeline.json", predicted_timeline_json(result));
    std::printf("wrote graph.txt, graph.dot, directives.txt, timeline.json (predicted) and %zu plans (text and binary) to %s\n",
                result.bodies.size(), dir.string().c_str());
  }
  if (opts.fit_memory_bytes > 0) print_fit_report(fit_memory(spec, world, g, opts.fit_memory_bytes));
  return 0;
}

}  // namespace piper
