// Versioned binary form of a plan (what rank 0 sends each rank over MPI). Field by field, little-endian
// as the machine stores it; a version mismatch or truncation is an error, never a guess.
#include "plan/plan.hpp"

#include <cstddef>

#include "model/segment_type.hpp"
#include "util/bytes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

constexpr uint32_t kMagic = 0x50495052;  // "PIPR"
// Bytes of an instruction with empty lists: its header (op, stream, node, mb, the waits' length) and the
// smallest payload (a step sync: group and span count). A count of more than the bytes left can hold is
// corrupt (checked before anything is reserved).
constexpr size_t kInstrMinBytes = 1 + 1 + 4 + 4 + 4 + 4 + 4;
constexpr size_t kSpanBytes = 4 + 8 + 8 + 1 + 4;

void put_optimizer(ByteWriter& w, const OptimizerConfig& o) {
  w.put_string(o.kind);
  for (double x : {o.lr, o.min_lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_clip}) w.put(x);
  w.put(o.warmup_steps);
  w.put(o.decay_steps);
  w.put(uint8_t(o.schedule));
  w.put(o.decay_fraction);
}

OptimizerConfig get_optimizer(ByteReader& r) {
  OptimizerConfig o;
  o.kind = r.get_string();
  for (double* x : {&o.lr, &o.min_lr, &o.beta1, &o.beta2, &o.eps, &o.weight_decay, &o.grad_clip}) *x = r.get<double>();
  o.warmup_steps = r.get<int64_t>();
  o.decay_steps = r.get<int64_t>();
  o.schedule = LrSchedule(r.get<uint8_t>());
  o.decay_fraction = r.get<double>();
  return o;
}

void put_data(ByteWriter& w, const DataConfig& d) {
  w.put(uint8_t(d.kind));
  w.put_string(d.path);
  for (int x : {d.vocab, d.seq_len, int(d.sequential), d.batch, d.d_in, d.n_classes, d.token_bytes})
    w.put<int32_t>(x);
  w.put(d.seed);
}

DataConfig get_data(ByteReader& r) {
  DataConfig d;
  d.kind = DataConfig::Kind(r.get<uint8_t>());
  d.path = r.get_string();
  d.vocab = r.get<int32_t>();
  d.seq_len = r.get<int32_t>();
  d.sequential = r.get<int32_t>() != 0;
  d.batch = r.get<int32_t>();
  d.d_in = r.get<int32_t>();
  d.n_classes = r.get<int32_t>();
  d.token_bytes = r.get<int32_t>();
  d.seed = r.get<uint64_t>();
  return d;
}

// Each payload's fields, in one order for writing and reading: io(field) is called for every field.
template <typename Io, typename... Fields>
void fields(Io& io, Fields&... f) {
  (io(f), ...);
}
template <typename Io>
void payload_fields(ComputeArgs& a, Io io) {
  fields(io, a.segment, a.sample_offset, a.samples, a.in, a.out, a.stash, a.stash_tail, a.wstash, a.dout, a.din, a.link,
         a.loss_scale, a.pbuf, a.gbuf, a.overwrite, a.alike_block, a.stash_bf16,
         a.stash_view);
}
template <typename Io>
void payload_fields(UpdateArgs& a, Io io) {
  fields(io, a.bucket, a.buf, a.src, a.m, a.v, a.flags, a.offset, a.src_offset, a.count);
}
template <typename Io>
void payload_fields(MessageArgs& a, Io io) {
  fields(io, a.peer_set, a.tag, a.buf, a.offset, a.count);
}
template <typename Io>
void payload_fields(CollectiveArgs& a, Io io) {
  fields(io, a.bucket, a.group, a.buf, a.src, a.tmp, a.wire, a.flags, a.offset, a.src_offset, a.count);
}
template <typename Io>
void payload_fields(AllToAllArgs& a, Io io) {
  fields(io, a.group, a.buf, a.src, a.parts, a.row_width, a.rows);
}
template <typename Io>
void payload_fields(StepSyncArgs& a, Io io) {
  fields(io, a.group, a.spans);
}
template <typename Io>
void payload_fields(CountsArgs& a, Io io) {
  fields(io, a.buf, a.parts);
}

struct FieldWriter {
  ByteWriter& w;
  template <typename T>
  void operator()(const T& x) { w.put(x); }
  template <typename T>
  void operator()(const std::vector<T>& v) { w.put_vector(v); }
  void operator()(const std::vector<Span>& spans) {
    w.put<uint32_t>(uint32_t(spans.size()));
    for (const auto& s : spans) {
      w.put(s.buf);
      w.put(s.offset);
      w.put(s.count);
      w.put<uint8_t>(s.per_replica);
      w.put(s.slices);
    }
  }
};

struct FieldReader {
  ByteReader& r;
  template <typename T>
  void operator()(T& x) { x = r.get<T>(); }
  template <typename T>
  void operator()(std::vector<T>& v) { v = r.get_vector<T>(); }
  void operator()(std::vector<Span>& spans) {
    const uint32_t n = r.get_count(kSpanBytes);
    for (uint32_t i = 0; i < n; ++i) {
      Span s;
      s.buf = r.get<int32_t>();
      s.offset = r.get<int64_t>();
      s.count = r.get<int64_t>();
      s.per_replica = r.get<uint8_t>() != 0;
      s.slices = r.get<int32_t>();
      spans.push_back(s);
    }
  }
};

void put_instr(ByteWriter& w, const Instr& in) {
  w.put(uint8_t(in.op));
  w.put(in.stream);
  w.put(in.node);
  w.put(in.mb);
  w.put_vector(in.waits);
  InstrArgs args = in.args;  // payload_fields walks mutable fields for both directions
  std::visit([&](auto& a) { payload_fields(a, FieldWriter{w}); }, args);
}

Instr get_instr(ByteReader& r) {
  const uint8_t op = r.get<uint8_t>();
  if (op >= kOpCount) throw SystemError(cat("plan: unknown op ", int(op)));
  Instr in(Op{op});
  in.stream = r.get<uint8_t>();
  in.node = r.get<int32_t>();
  in.mb = r.get<int32_t>();
  in.waits = r.get_vector<int32_t>();
  std::visit([&](auto& a) { payload_fields(a, FieldReader{r}); }, in.args);
  return in;
}

void put_group(ByteWriter& w, const GroupRef& g) {
  w.put(uint8_t(g.kind));
  w.put_vector(g.sets);
  w.put_string(g.stream);
}

GroupRef get_group(ByteReader& r) {
  GroupRef g;
  g.kind = GroupRef::Kind(r.get<uint8_t>());
  g.sets = r.get_vector<int32_t>();
  g.stream = r.get_string();
  return g;
}

}  // namespace

std::vector<uint8_t> serialize_plan(const Plan& p) {
  ByteWriter w;
  w.put(kMagic);
  w.put(kPlanVersion);
  // job-wide
  w.put_string(p.job_name);
  w.put_string(p.job_text);
  w.put_string(p.backend);
  w.put<uint8_t>(uint8_t(p.precision));
  w.put(p.held_pieces.min_rows);
  w.put(p.held_pieces.view_limit);
  w.put(p.seed);
  w.put(p.steps);
  w.put(p.watchdog_s);
  w.put(p.log_every);
  w.put(p.peak_tflops);
  w.put<uint8_t>(p.skip_nonfinite ? 1 : 0);
  w.put(p.max_skipped);
  w.put_string(p.checkpoint_dir);
  w.put(p.checkpoint_every);
  w.put<int32_t>(p.checkpoint_keep);
  w.put<uint8_t>(p.checkpoint_async ? 1 : 0);
  w.put<uint32_t>(uint32_t(p.allow_changes.size()));
  for (const auto& a : p.allow_changes) w.put_string(a);
  w.put_string(p.model_keys);
  w.put<int32_t>(p.threads);
  put_optimizer(w, p.optimizer);
  put_data(w, p.data);
  w.put(p.eval_every);
  w.put(p.eval_batches);
  put_data(w, p.eval_data);
  w.put(p.dims);
  w.put<uint32_t>(uint32_t(p.params.size()));
  for (const auto& ps : p.params) {
    w.put_string(ps.name);
    w.put_vector(ps.shape);
    w.put(ps.numel);
    w.put(uint8_t(ps.init));
    w.put(ps.init_std);
    w.put<uint8_t>(ps.decay);
    w.put<uint8_t>(ps.bf16_operand);
    w.put(ps.statistics_segment);
  }
  w.put<uint32_t>(uint32_t(p.segments.size()));
  for (const auto& s : p.segments) {
    w.put_string(s.type->name);
    w.put_string(s.name);
    w.put<int32_t>(s.layer);
    w.put_vector(s.params);
    w.put(s.fwd_flops_per_sample);
    w.put(s.tail_flops_per_sample);
    w.put<int32_t>(s.shards);
  }
  w.put<int32_t>(p.world);
  w.put<uint32_t>(uint32_t(p.sets.size()));
  for (const auto& s : p.sets) w.put_vector(s);
  w.put<uint32_t>(uint32_t(p.all_groups.size()));
  for (const auto& g : p.all_groups) put_group(w, g);
  w.put<int32_t>(p.microbatches);
  w.put<int32_t>(p.samples_per_replica);
  w.put<int32_t>(p.data_sharing);
  // body
  w.put<int32_t>(p.set);
  w.put<uint32_t>(uint32_t(p.streams.size()));
  for (const auto& s : p.streams) w.put_string(s);
  w.put<uint32_t>(uint32_t(p.buffers.size()));
  for (const auto& b : p.buffers) {
    w.put(b.bytes);
    w.put(b.zero_from);
    w.put(uint8_t(b.kind));
    w.put<uint8_t>(b.persistent);
    w.put(b.uses);
    w.put_string(b.name);
  }
  w.put_vector(p.plan_params);
  w.put<uint32_t>(uint32_t(p.buckets.size()));
  for (const auto& b : p.buckets) w.put(b);
  w.put<uint32_t>(uint32_t(p.groups.size()));
  for (const auto& g : p.groups) put_group(w, g);
  w.put<uint32_t>(uint32_t(p.instrs.size()));
  for (const auto& in : p.instrs) put_instr(w, in);
  w.put(p.workspace_buf);
  w.put(p.scratch_buf);
  w.put(p.memory);
  w.put(p.predicted_step);
  w.put(p.predicted_bubble);
  // binding
  w.put<int32_t>(p.rank);
  w.put<int32_t>(p.replica);
  return std::move(w.bytes());
}

Plan deserialize_plan(const uint8_t* data, size_t size) {
  ByteReader r(data, size);
  if (r.get<uint32_t>() != kMagic) throw SystemError("not a plan (bad magic)");
  uint32_t version = r.get<uint32_t>();
  if (version != kPlanVersion)
    throw SystemError(cat("plan version ", version, " but this piper reads version ", kPlanVersion,
                          "; every rank must run the same piper build"));
  Plan p;
  p.job_name = r.get_string();
  p.job_text = r.get_string();
  p.backend = r.get_string();
  p.precision = Precision(r.get<uint8_t>());
  p.held_pieces.min_rows = r.get<int64_t>();
  p.held_pieces.view_limit = r.get<uint64_t>();
  p.seed = r.get<uint64_t>();
  p.steps = r.get<int64_t>();
  p.watchdog_s = r.get<double>();
  p.log_every = r.get<int64_t>();
  p.peak_tflops = r.get<double>();
  p.skip_nonfinite = r.get<uint8_t>() != 0;
  p.max_skipped = r.get<int64_t>();
  p.checkpoint_dir = r.get_string();
  p.checkpoint_every = r.get<int64_t>();
  p.checkpoint_keep = r.get<int32_t>();
  p.checkpoint_async = r.get<uint8_t>() != 0;
  const uint32_t n_allowed = r.get_count(4);
  for (uint32_t i = 0; i < n_allowed; ++i) p.allow_changes.push_back(r.get_string());
  p.model_keys = r.get_string();
  p.threads = r.get<int32_t>();
  p.optimizer = get_optimizer(r);
  p.data = get_data(r);
  p.eval_every = r.get<int64_t>();
  p.eval_batches = r.get<int64_t>();
  p.eval_data = get_data(r);
  p.dims = get_model_dims(r);
  uint32_t np = r.get_count(4 + 8 + 8 + 1 + 4 + 1 + 4);
  for (uint32_t i = 0; i < np; ++i) {
    ParamSpec ps;
    ps.name = r.get_string();
    ps.shape = r.get_vector<int64_t>();
    ps.numel = r.get<int64_t>();
    ps.init = InitKind(r.get<uint8_t>());
    ps.init_std = r.get<float>();
    ps.decay = r.get<uint8_t>() != 0;
    ps.bf16_operand = r.get<uint8_t>() != 0;
    ps.statistics_segment = r.get<int32_t>();
    p.params.push_back(std::move(ps));
  }
  uint32_t ns = r.get_count(4 + 4 + 4 + 8 + 8 + 8 + 4);
  for (uint32_t i = 0; i < ns; ++i) {
    Segment s;
    std::string type = r.get_string();
    s.type = find_segment_type(type);
    if (!s.type) throw SystemError(cat("plan names segment type '", type, "' that this piper does not know"));
    s.name = r.get_string();
    s.layer = r.get<int32_t>();
    s.params = r.get_vector<int>();
    s.fwd_flops_per_sample = r.get<double>();
    s.tail_flops_per_sample = r.get<double>();
    s.shards = r.get<int32_t>();
    p.segments.push_back(std::move(s));
  }
  p.world = r.get<int32_t>();
  uint32_t nsets = r.get_count(8);
  for (uint32_t i = 0; i < nsets; ++i) p.sets.push_back(r.get_vector<int32_t>());
  uint32_t ng = r.get_count(1 + 8 + 4);
  for (uint32_t i = 0; i < ng; ++i) p.all_groups.push_back(get_group(r));
  p.microbatches = r.get<int32_t>();
  p.samples_per_replica = r.get<int32_t>();
  p.data_sharing = r.get<int32_t>();
  p.set = r.get<int32_t>();
  uint32_t nstreams = r.get_count(4);
  for (uint32_t i = 0; i < nstreams; ++i) p.streams.push_back(r.get_string());
  uint32_t nb = r.get_count(8 + 8 + 1 + 1 + 4 + 4);
  for (uint32_t i = 0; i < nb; ++i) {
    PlanBuffer b;
    b.bytes = r.get<uint64_t>();
    b.zero_from = r.get<uint64_t>();
    b.kind = BufferKind(r.get<uint8_t>());
    b.persistent = r.get<uint8_t>() != 0;
    b.uses = r.get<int32_t>();
    b.name = r.get_string();
    p.buffers.push_back(std::move(b));
  }
  p.plan_params = r.get_vector<PlanParam>({offsetof(PlanParam, home)});
  uint32_t nbk = r.get_count(sizeof(PlanBucket));
  for (uint32_t i = 0; i < nbk; ++i)
    p.buckets.push_back(r.get<PlanBucket>({offsetof(PlanBucket, shard_params), offsetof(PlanBucket, shard_grads),
                                           offsetof(PlanBucket, shard_optimizer), offsetof(PlanBucket, tied_copy)}));
  uint32_t ngr = r.get_count(1 + 8 + 4);
  for (uint32_t i = 0; i < ngr; ++i) p.groups.push_back(get_group(r));
  uint32_t ni = r.get_count(kInstrMinBytes);
  p.instrs.reserve(ni);
  for (uint32_t i = 0; i < ni; ++i) p.instrs.push_back(get_instr(r));
  p.workspace_buf = r.get<int32_t>();
  p.scratch_buf = r.get<int32_t>();
  p.memory = r.get<MemoryEstimate>();
  p.predicted_step = r.get<double>();
  p.predicted_bubble = r.get<double>();
  p.rank = r.get<int32_t>();
  p.replica = r.get<int32_t>();
  if (!r.done()) throw SystemError("plan has trailing bytes");
  check_plan(p);
  return p;
}

}  // namespace piper
