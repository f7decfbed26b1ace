// Dry run (see dry_run.hpp).
#include "app/dry_run.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "app/fit_memory.hpp"
#include "app/json_writer.hpp"
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
    s += cat(" filter = ", d.filter.str(), d.group > 0 ? cat(", group = ", d.group) : std::string(), ", stream = \"",
             d.stream, "\"");
  } else if (d.op == "tp") {
    s += cat(" filter = ", d.filter.str(), ", group = ", d.group, d.sequence ? ", sequence = true" : "", ", stream = \"",
             d.stream, "\"");
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
// uniform units scaled by 1000): one process per device set (its first rank; "ranks" lists all of the set's), one
// thread per stream.
std::string predicted_timeline_json(const CompileResult& r) {
  std::string out = cat("{\"displayTimeUnit\":\"ms\",\"predicted\":true,", r.cost.uniform ? "\"uniform\":true," : "",
                        "\"traceEvents\":[\n");
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
    std::string ranks;  // every rank of the set runs this timeline
    for (int r : p.sets[s]) ranks += cat(ranks.empty() ? "" : ",", r);
    add(cat("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", rank, ",\"args\":{\"name\":\"rank ", rank,
            " (device set ", s, ")\",\"ranks\":[", ranks, "]}}"));
    for (size_t t = 0; t < p.streams.size(); ++t)
      add(cat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank, ",\"tid\":", t, ",\"args\":{\"name\":\"",
              json_escape(p.streams[t]), "\"}}"));
    for (const auto& span : r.simulation.spans[s]) {
      const Instr& in = p.instrs[size_t(span.instr)];
      char buf[128];
      std::snprintf(buf, sizeof(buf), "\"ts\":%.3f,\"dur\":%.3f", span.start * scale, (span.end - span.start) * scale);
      add(cat("{\"name\":\"", json_escape(instr_label(bound, in)), "\",\"ph\":\"X\",", buf, ",\"pid\":", rank,
              ",\"tid\":", int(in.stream), ",\"args\":{\"instr\":", span.instr, ",\"node\":", in.node, ",\"mb\":", in.mb,
              "}}"));
    }
  }
  return out + "\n]}\n";
}

// What the dry run measured beside the compile, for either format.
struct DryRunFacts {
  int world = 0;
  struct {
    std::string segment;  // "": no segment with counted rows
    size_t rows = 0;
    size_t row_bytes = 0;  // one row as held and exchanged: 4 · d_model, or 2 · d_model in a bf16 run
    bool capacity = false;  // bounded by the experts' capacity (else the dropless worst case)
    int shards = 1;
  } routed;
  std::vector<size_t> plan_bytes;  // serialized body, per device set
  uint64_t total_bytes = 0;        // sent by rank 0
  double serialize_seconds = 0;
  int64_t serialize_resident = -1;
  std::vector<std::string> dump_files;  // --dump-plan: names written
};

void print_summary(const JobSpec& spec, const CompileResult& result, const DryRunFacts& facts) {
  const Graph& g = result.graph;
  const int world = facts.world;
  std::printf("dry run of '%s' for %d rank%s: compiled in %.3f s\n", spec.job.name.c_str(), world, world == 1 ? "" : "s",
              result.seconds);
  std::printf("model: %s, %lld parameters, %zu segments; %zu regions, %zu device sets, %d microbatches of %d samples\n",
              spec.model.kind.c_str(), static_cast<long long>(result.model.n_params()), result.model.segments.size(),
              g.regions.size(), g.sets.size(), g.microbatches, g.samples_per_microbatch);
  if (spec.job.precision == "bf16")
    std::printf("precision bf16: matmuls on bf16 operands; the blocks' stashes and inputs held in bf16 (a pass whose "
                "fp32 view would pass a twelfth of them goes by pieces of at least %lld rows), counted so in the memory "
                "below; the cost model's matmul rate is its fp32 one\n",
                static_cast<long long>(held_piece_rows(spec)));
  if (spec.job.grad_reduce == "bf16")
    std::printf("gradient reductions in bf16: half the bytes of an fp32 reduction on the wire, counted so in the cost "
                "model; each sum rounded to bf16\n");
  for (const auto& r : g.regions)
    std::printf("  %s: segments %s .. %s\n", r.label().c_str(),
                result.model.segments[size_t(r.seg_begin)].name.c_str(),
                result.model.segments[size_t(r.seg_end - 1)].name.c_str());
  if (!facts.routed.segment.empty())
    std::printf("routed rows: %s holds up to %zu rows per microbatch, %zu bytes each (%s%s)\n",
                facts.routed.segment.c_str(), facts.routed.rows, facts.routed.row_bytes,
                facts.routed.capacity ? "the capacity of every expert" : "the worst case, dropless",
                facts.routed.shards > 1 ? cat(", from the ", facts.routed.shards, " ranks of its expert group").c_str() : "");
  std::printf("graph: %zu nodes\n", g.live_nodes());
  std::printf("%5s %8s %13s %12s %14s   peak by kind (MiB): params grads optim activations comm workspace\n", "set",
              "ranks", "instructions", "plan bytes", "est. peak MiB");
  for (size_t s = 0; s < result.bodies.size(); ++s) {
    const Plan& p = result.bodies[s];
    std::printf("%5zu %8zu %13zu %12zu %14.2f  ", s, p.sets[s].size(), p.instrs.size(), facts.plan_bytes[s],
                double(p.memory.peak_total) / 1048576.0);
    for (int k = 0; k < kBufferKinds; ++k) std::printf(" %.2f", double(p.memory.peak_by_kind[k]) / 1048576.0);
    std::printf("\n");
  }
  std::printf("cost model %s: predicted step %.6g %s; bubble per device set:", result.cost.describe().c_str(),
              result.simulation.step_time, result.cost.uniform ? "units" : "s");
  for (size_t s = 0; s < result.bodies.size(); ++s) std::printf(" %.4f", result.simulation.bubble[s]);
  std::printf("\n");
  std::printf("plan bytes sent by rank 0: %llu (one body per device set, broadcast inside the set); compile time %.3f s\n",
              static_cast<unsigned long long>(facts.total_bytes), result.seconds);
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
  std::printf("compile phase %-15s %10.3f %14s %14s\n", "serialization", facts.serialize_seconds,
              mib(facts.serialize_resident).c_str(), "-");
  std::printf("directives:\n");
  for (const auto& d : result.applied) std::printf("  %s\n", directive_text(d, false).c_str());
}

// Bytes by buffer kind as an object keyed by the kinds' names.
void kinds_json(JsonWriter& w, const uint64_t (&bytes)[kBufferKinds]) {
  w.begin_object();
  for (int k = 0; k < kBufferKinds; ++k) w.key(buffer_kind_name(BufferKind(k))).value(bytes[k]);
  w.end_object();
}

// The same summary as one JSON object, left open for what follows (dump, fit).
void summary_json(JsonWriter& w, const JobSpec& spec, const CompileResult& result, const DryRunFacts& facts) {
  const Graph& g = result.graph;
  w.begin_object();
  w.key("job").value(spec.job.name).key("world").value(facts.world).key("compile_seconds").value(result.seconds);
  w.key("model").begin_object().key("kind").value(spec.model.kind).key("parameters").value(result.model.n_params());
  w.key("segments").value(result.model.segments.size()).end_object();
  w.key("graph").begin_object().key("nodes").value(g.live_nodes()).key("microbatches").value(g.microbatches);
  w.key("samples_per_microbatch").value(g.samples_per_microbatch).key("regions").begin_array();
  for (const auto& r : g.regions)
    w.begin_object()
        .key("label").value(r.label())
        .key("first_segment").value(result.model.segments[size_t(r.seg_begin)].name)
        .key("last_segment").value(result.model.segments[size_t(r.seg_end - 1)].name)
        .key("device_set").value(r.device_set)
        .end_object();
  w.end_array().end_object();
  w.key("routed_rows");
  if (facts.routed.segment.empty()) {
    w.null();
  } else {
    w.begin_object().key("segment").value(facts.routed.segment).key("rows_per_microbatch").value(facts.routed.rows);
    w.key("bytes_per_row").value(facts.routed.row_bytes);
    w.key("bound").value(facts.routed.capacity ? "capacity" : "dropless").key("ranks").value(facts.routed.shards);
    w.end_object();
  }
  w.key("device_sets").begin_array();
  for (size_t s = 0; s < result.bodies.size(); ++s) {
    const Plan& p = result.bodies[s];
    w.begin_object().key("device_set").value(s).key("ranks").begin_array();
    for (int r : p.sets[s]) w.value(r);
    w.end_array();
    w.key("instructions").value(p.instrs.size()).key("plan_bytes").value(facts.plan_bytes[s]);
    w.key("predicted_bubble").value(result.simulation.bubble[s]);
    w.key("memory").begin_object().key("peak_total_bytes").value(p.memory.peak_total);
    w.key("peak_bytes");
    kinds_json(w, p.memory.peak_by_kind);
    w.key("steady_bytes");
    kinds_json(w, p.memory.steady_by_kind);
    w.end_object();
    w.key("buckets").begin_array();
    for (const PlanBucket& b : p.buckets) {
      w.begin_object().key("region").value(b.region).key("params").value(b.numel).key("padded").value(b.padded);
      w.key("zero");
      if (b.zero >= 0) w.value(b.zero);
      else w.null();
      w.key("group_size").value(b.group_size).key("tied_copy").value(b.tied_copy).end_object();
    }
    w.end_array().end_object();
  }
  w.end_array();
  w.key("cost_model").begin_object().key("name").value(result.cost.describe());
  w.key("unit").value(result.cost.uniform ? "units" : "s").key("predicted_step").value(result.simulation.step_time);
  w.end_object();
  w.key("plan_bytes_sent").value(facts.total_bytes);
  auto bytes_or_null = [&](int64_t b) -> JsonWriter& { return b >= 0 ? w.value(b) : w.null(); };
  w.key("compile_phases").begin_array();
  for (const CompilePhase& ph : result.phases) {
    w.begin_object().key("name").value(ph.name).key("seconds").value(ph.seconds).key("resident_bytes");
    bytes_or_null(ph.resident_bytes).key("peak_rise_bytes");
    bytes_or_null(ph.peak_growth_bytes).end_object();
  }
  w.begin_object().key("name").value("serialization").key("seconds").value(facts.serialize_seconds);
  w.key("resident_bytes");
  bytes_or_null(facts.serialize_resident).key("peak_rise_bytes").null().end_object();
  w.end_array();
  w.key("directives").begin_array();
  for (const auto& d : result.applied)
    w.begin_object().key("op").value(d.op).key("text").value(directive_text(d, true)).end_object();
  w.end_array();
}

// --dump-plan DIR: graph, directives, every plan and the predicted timeline. Returns the names written.
std::vector<std::string> dump_plan(const std::string& dir_name, const CompileResult& result) {
  std::filesystem::path dir(dir_name);
  std::filesystem::create_directories(dir);
  std::vector<std::string> names;
  auto put = [&](const std::string& name, const std::string& text) {
    write_file(dir / name, text);
    names.push_back(name);
  };
  put("graph.txt", graph_to_text(result.graph));
  put("graph.dot", graph_to_dot(result.graph));
  std::string dirs;
  for (const auto& d : result.applied) dirs += directive_text(d, true) + "\n";
  put("directives.txt", dirs);
  for (size_t s = 0; s < result.bodies.size(); ++s) {
    Plan bound = bind_plan(result.bodies[s], result.bodies[s].sets[s][0]);
    put(cat("plan_set", s, ".txt"), plan_to_text(bound));
    const std::vector<uint8_t> bytes = serialize_plan(result.bodies[s]);  // as rank 0 sends it
    put(cat("plan_set", s, ".bin"), std::string(bytes.begin(), bytes.end()));
  }
  put("timeline.json", predicted_timeline_json(result));
  return names;
}

}  // namespace

int dry_run(const CliOptions& opts, int world_size) {
  const int world = opts.world > 0 ? opts.world : world_size;
  JobSpec spec = load_and_check(opts, world);
  CompileResult result;
  compile_job(spec, world, result);
  DryRunFacts facts;
  facts.world = world;
  // Counted-row buffers (routed tokens) are sized by a bound: say which one.
  for (size_t i = 0; i < result.model.segments.size(); ++i) {
    Segment seg = result.model.segments[i];
    seg.shards = result.graph.segment_shards[i];
    const SegmentSizes z = segment_sizes(seg, result.model.dims, result.graph.samples_per_microbatch);
    if (z.ragged_parts == 0 || z.ragged_width == 0) continue;
    facts.routed.segment = seg.name;
    facts.routed.row_bytes = sizeof(float) * size_t(z.ragged_width);  // the width is in 4-byte words
    facts.routed.rows = (z.input_bytes - size_t(z.ragged_parts) * 4) / facts.routed.row_bytes;
    facts.routed.capacity = spec.model.moe_capacity_factor > 0;
    facts.routed.shards = seg.shards;
    break;  // every MoE layer has the same bound
  }
  // rank 0 sends each body once; the set broadcasts it
  const double serialize_start = now_seconds();
  for (const Plan& p : result.bodies) {
    const std::vector<uint8_t> body = serialize_plan(p);
    deserialize_plan(body.data(), body.size());  // what each rank reads must pass the plan check
    facts.plan_bytes.push_back(body.size());
    facts.total_bytes += body.size();
  }
  facts.serialize_seconds = now_seconds() - serialize_start;
  facts.serialize_resident = resident_bytes();
  if (!opts.json) print_summary(spec, result, facts);
  if (!opts.dump_plan.empty()) {
    facts.dump_files = dump_plan(opts.dump_plan, result);
    if (!opts.json)
      std::printf("wrote graph.txt, graph.dot, directives.txt, timeline.json (predicted) and %zu plans (text and "
                  "binary) to %s\n", result.bodies.size(), opts.dump_plan.c_str());
  }
  std::optional<FitReport> fit;
  if (opts.fit_memory_bytes > 0) fit = fit_memory(spec, world, result.graph, opts.fit_memory_bytes);
  if (!opts.json) {
    if (fit) print_fit_report(*fit);
    return 0;
  }
  JsonWriter w;
  summary_json(w, spec, result, facts);
  if (!opts.dump_plan.empty()) {
    w.key("dump_plan").begin_object().key("dir").value(opts.dump_plan).key("files").begin_array();
    for (const std::string& f : facts.dump_files) w.value(f);
    w.end_array().end_object();
  }
  if (fit) fit_report_json(w.key("fit_memory"), *fit);
  w.end_object();
  std::printf("%s\n", w.str().c_str());
  return 0;
}

}  // namespace piper
