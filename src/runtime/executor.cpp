// Executor: stream threads, waits, posting and completing communication, and the per-instruction work
// (segment kernels, data loading, AdamW on owned ranges, the step sync). See executor.hpp.
#include "runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "backend/ragged_rows.hpp"
#include "model/segment_type.hpp"
#include "plan/owned_slices.hpp"
#include "runtime/communicator_order.hpp"
#include "runtime/learning_rate.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"
#include "util/timer.hpp"

namespace piper {

namespace {

struct Aborted {};

void backoff(int& round) {
  if (round < 64) {
    std::this_thread::yield();
  } else {
    int us = std::min(200, 5 << std::min(5, (round - 64) / 16));
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  ++round;
}

// `p` moved on by `bytes` (null stays null).
template <class T>
T* bytes_after(T* p, size_t bytes) {
  return p ? reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes) : p;
}

}  // namespace

Executor::Executor(const Plan& plan, Backend& backend, MPI_Comm world, Kernels* kernels)
    : plan_(plan), backend_(backend), k_(kernels ? *kernels : backend.kernels()), world_(world), store_(plan, backend) {
  t0_ = now_seconds();
  k_.set_matmul_precision(plan_.precision);
  for (const auto& instr : plan_.instrs)
    if (op_is_compute(instr.op) && instr.compute().stash_bf16) {
      const ComputeArgs& c = instr.compute();
      const bool input = (c.stash_bf16 & kStashHoldsInput) != 0;
      held_stashes_.try_emplace({c.segment, c.samples, input},
                                held_stash(plan_.segments[size_t(c.segment)], plan_.dims, c.samples, input,
                                           plan_.held_pieces));
    }
  if (plan_.scratch_buf >= 0) {
    // the largest backend scratch any segment of this plan needs
    size_t floats = 1;
    for (const auto& in : plan_.instrs)
      if (op_is_compute(in.op))
        floats = std::max(floats, segment_scratch_floats(k_, plan_.segments[size_t(in.compute().segment)], plan_.dims,
                                                         in.compute().samples));
    store_.resize(plan_.scratch_buf, floats * sizeof(float));
  }
  bool needs_data = false;
  for (const auto& in : plan_.instrs)
    if (in.op == Op::Forward && plan_.segments[size_t(in.compute().segment)].type->data != DataSlot::None)
      needs_data = true;
  if (needs_data) data_ = std::make_unique<DataLoader>(plan_.data);
  if (needs_data && plan_.eval_every > 0) eval_data_ = std::make_unique<DataLoader>(plan_.eval_data);
  if (data_) data_identity_ = data_->identity();
  else if (plan_.data.kind == DataConfig::Kind::Tokens) data_identity_ = file_identity(plan_.data.path);

  param_slot_.assign(plan_.params.size(), -1);
  for (size_t i = 0; i < plan_.plan_params.size(); ++i) {  // of a parameter in pieces, the piece of this replica's slice
    const PlanParam& pp = plan_.plan_params[i];
    if (pp.piece < 0 || pp.piece == slice_of(plan_.buckets[size_t(pp.bucket)], plan_.replica))
      param_slot_[size_t(pp.model_param)] = int32_t(i);
  }

  touched_.resize(plan_.instrs.size());
  std::vector<int32_t> reads, writes;
  for (size_t i = 0; i < plan_.instrs.size(); ++i) {
    instr_accesses(plan_.instrs[i], reads, writes);
    auto& t = touched_[i];
    t = reads;
    t.insert(t.end(), writes.begin(), writes.end());
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
  }
  event_index_.assign(plan_.instrs.size(), -1);
  flight_index_.assign(plan_.instrs.size(), 0);
  done_ = std::make_unique<std::atomic<int64_t>[]>(plan_.instrs.size());
  for (size_t i = 0; i < plan_.instrs.size(); ++i) done_[i].store(0);

  // every routing segment of the model has its block on every rank, so the step sync's sums line up
  routing_offset_.assign(plan_.segments.size(), -1);
  for (size_t i = 0; i < plan_.segments.size(); ++i)
    if (const SegmentType* t = plan_.segments[i].type; t && t->routed_experts) {
      routing_offset_[i] = int64_t(routing_size_);
      routing_size_ += size_t(routing_stats_size(t->routed_experts(plan_.dims)));
    }
  scalar_count_ = kRoutingAt + routing_size_;
  scalars_ = static_cast<double*>(backend_.allocate(scalar_count_ * sizeof(double)));
  backend_.zero(scalars_, scalar_count_ * sizeof(double));
  device_sums_.assign(scalar_count_, 0.0);
  // the ragged buffers whose counts reach the host: exchanged ones and those read by a counts instruction
  host_counts_.resize(plan_.buffers.size());
  for (const auto& in : plan_.instrs) {
    if (in.op == Op::AllToAll) host_counts_[size_t(in.all_to_all().buf)].assign(size_t(in.all_to_all().parts), 0);
    if (in.op == Op::ReadCounts) host_counts_[size_t(in.counts().buf)].assign(size_t(in.counts().parts), 0);
  }
  int64_t moved = 1;  // device room for the step of the largest parameter moved by statistics
  for (const ParamSpec& spec : plan_.params)
    if (spec.statistics_segment >= 0) moved = std::max(moved, spec.numel);
  statistics_delta_dev_ = static_cast<float*>(backend_.allocate(size_t(moved) * sizeof(float)));
  statistics_delta_bytes_ = size_t(moved) * sizeof(float);
  make_communicators();
  backend_.prepare_events(int(plan_.instrs.size()));

  streams_.resize(plan_.streams.size());
  for (size_t s = 0; s < streams_.size(); ++s) {
    streams_[s].id = int(s);
    streams_[s].ctx = backend_.make_stream(plan_.streams[s]);
    streams_[s].flight = std::make_unique<FlightRecorder>();
  }
  for (size_t i = 0; i < plan_.instrs.size(); ++i) streams_[plan_.instrs[i].stream].instrs.push_back(int32_t(i));
  for (auto& s : streams_) s.thread = std::thread([this, &s] { stream_main(s); });
  if (plan_.watchdog_s > 0) {
    std::vector<const FlightRecorder*> recorders;
    for (const auto& s : streams_) recorders.push_back(s.flight.get());
    watchdog_ = std::make_unique<Watchdog>(plan_, std::move(recorders), world_, plan_.watchdog_s);
  }
}

Executor::~Executor() {
  watchdog_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_start_.notify_all();
  for (auto& s : streams_)
    if (s.thread.joinable()) s.thread.join();
  // Torn down in the order they were set up, which every rank shares (communicator_order.hpp): where a
  // teardown waits for the other members (NCCL), two ranks in different orders would wait for each other.
  for (size_t g : group_order_) groups_[g].reset();
  groups_.clear();
  p2p_.reset();
  backend_.release(scalars_, scalar_count_ * sizeof(double));
  backend_.release(statistics_delta_dev_, statistics_delta_bytes_);
}

void Executor::make_communicators() {
  const int my_set = plan_.set;
  groups_.resize(plan_.groups.size());
  for (const GroupRef& g : plan_.all_groups) {
    int color = MPI_UNDEFINED, key = plan_.rank;
    switch (g.kind) {
      case GroupRef::Kind::World: color = 0; break;
      case GroupRef::Kind::DeviceSet:
        if (g.sets[0] == my_set) { color = 0; key = plan_.replica; }
        break;
      case GroupRef::Kind::AcrossSets:
        for (size_t i = 0; i < g.sets.size(); ++i)
          if (g.sets[i] == my_set) { color = plan_.replica; key = int(i); }
        break;
      case GroupRef::Kind::SetBlock:  // the replicas [j·k, (j+1)·k) of the set
        if (g.sets[0] == my_set) { color = plan_.replica / g.sets[1]; key = plan_.replica % g.sets[1]; }
        break;
      case GroupRef::Kind::SetStride:  // the replicas i, i + k, i + 2k, ... of the set
        if (g.sets[0] == my_set) { color = plan_.replica % g.sets[1]; key = plan_.replica / g.sets[1]; }
        break;
    }
    MPI_Comm c = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(world_, color, key, &c));
    if (c == MPI_COMM_NULL) continue;
    auto it = std::find(plan_.groups.begin(), plan_.groups.end(), g);
    if (it == plan_.groups.end()) {
      MPI_Comm_free(&c);
      continue;
    }
    const size_t index = size_t(it - plan_.groups.begin());
    groups_[index] = backend_.make_communicator(c, world_);
    group_order_.push_back(index);
  }
  MPI_Comm p2p;
  MPI_CHECK(MPI_Comm_dup(world_, &p2p));
  p2p_ = backend_.make_point_to_point(p2p, world_);
  // every channel of the plan, before the first step, in the order every rank agrees on
  p2p_->connect(plan_peer_channels(plan_));
}

Communicator& Executor::group(int32_t g) {
  PIPER_CHECK(g >= 0 && size_t(g) < groups_.size() && groups_[size_t(g)], "rank ", plan_.rank, " is not in group ", g);
  return *groups_[size_t(g)];
}

int64_t Executor::shard_offset(uint8_t flags, uint8_t flag, int64_t count, int32_t bucket) const {
  if (!(flags & flag)) return 0;
  return replica_shift(flags, flag, index_in_group(plan_.buckets[size_t(bucket)], plan_.replica), count);
}

void Executor::init_parameters() {
  std::vector<float> host;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const PlanBucket& pb = plan_.buckets[b];
    const BucketRange owned = owned_range(pb, plan_.replica, pb.shard_params);
    float* dst = store_.f(pb.shard_params ? pb.param_shard_buf : pb.param_buf);  // from owned.lo
    for_each_param_piece(plan_, int32_t(b), owned, [&](const ParamPiece& piece) {
      host.resize(size_t(piece.count()));
      const ParamSpec& spec = plan_.params[size_t(piece.pp->model_param)];
      for_each_element_run(*piece.pp, pb.slices, piece.param_begin(), piece.count(),
                           [&](int64_t element, int64_t at, int64_t n) {
                             init_param_range(spec, plan_.seed, element, n, host.data() + (at - piece.param_begin()));
                           });
      k_.upload(dst + (piece.begin - owned.lo), host.data(), size_t(piece.count()) * sizeof(float));
    });
  }
}

StepMetrics Executor::run_step(int64_t step) {
  step_ = step;
  lr_ = learning_rate(plan_.optimizer, step);
  store_.begin_step();
  backend_.zero(scalars_, scalar_count_ * sizeof(double));
  for (auto& st : streams_) st.events.clear();
  const double start = now_seconds() - t0_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++epoch_;
    ++generation_;
    finished_ = 0;
  }
  if (watchdog_) watchdog_->arm(step);
  cv_start_.notify_all();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return finished_ == int(streams_.size()); });
  }
  if (watchdog_) watchdog_->disarm();
  if (error_) std::rethrow_exception(error_);
  metrics_.lr = lr_;
  std::vector<TraceEvent> events;
  for (const auto& st : streams_) events.insert(events.end(), st.events.begin(), st.events.end());
  last_times_ = step_times(plan_, events, start, now_seconds() - t0_, group_sizes());
  return metrics_;
}

StepMetrics Executor::run_eval_step(int64_t batch) {
  const int64_t step = step_;
  std::swap(data_, eval_data_);  // ranks without data read none either way
  evaluating_ = true;
  auto back = [&] {
    evaluating_ = false;
    std::swap(data_, eval_data_);
    step_ = step;
  };
  try {
    StepMetrics m = run_step(batch);
    back();
    return m;
  } catch (...) {
    back();
    throw;
  }
}

std::vector<TraceEvent> Executor::take_events() {
  std::vector<TraceEvent> all;
  for (auto& s : streams_) {
    all.insert(all.end(), s.events.begin(), s.events.end());
    s.events.clear();
  }
  return all;
}

std::vector<int> Executor::group_sizes() const {
  std::vector<int> sizes(groups_.size(), 1);
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g]) sizes[g] = groups_[g]->size();
  return sizes;
}

void Executor::stream_main(Stream& s) {
  int64_t seen = 0;
  backend_.bind(s.ctx.get());
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return shutdown_ || generation_ != seen; });
      if (shutdown_) return;
      seen = generation_;
    }
    try {
      run_stream_step(s);
    } catch (const Aborted&) {
      s.pending.clear();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      abort_ = true;
      for (size_t i = 0; i < plan_.instrs.size(); ++i) {
        done_[i].store(-1);
        done_[i].notify_all();
      }
      s.pending.clear();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    cv_done_.notify_all();
  }
}

void Executor::run_stream_step(Stream& s) {
  for (int32_t i : s.instrs) {
    const Instr& in = plan_.instrs[size_t(i)];
    for (int32_t j : in.waits) {
      s.flight->waiting(i, j);
      wait_for(s, j);
      backend_.wait(s.ctx.get(), j);
    }
    if (!in.waits.empty()) s.flight->waiting(-1, -1);
    if (abort_) throw Aborted{};
    for (int32_t b : touched_[size_t(i)]) store_.acquire(b, s.ctx.get());
    execute(s, i);
    poll(s);
  }
  int round = 0;
  while (!s.pending.empty()) {
    if (abort_) throw Aborted{};
    poll(s);
    if (!s.pending.empty()) backoff(round);
  }
  // the step ends when its device work does (checkpoints and the next step's first uses read it)
  backend_.synchronize(s.ctx.get());
}

void Executor::wait_for(Stream& s, int32_t j) {
  int round = 0;
  while (true) {
    int64_t v = done_[size_t(j)].load(std::memory_order_acquire);
    if (v == epoch_) return;
    if (abort_ || v < 0) throw Aborted{};
    if (!s.pending.empty()) {
      poll(s);
      backoff(round);
    } else {
      done_[size_t(j)].wait(v, std::memory_order_acquire);
    }
  }
}

void Executor::poll(Stream& s) {
  for (size_t k = 0; k < s.pending.size();) {
    if (!s.pending[k].handle->test()) {
      ++k;
      continue;
    }
    int32_t i = s.pending[k].instr;
    s.pending.erase(s.pending.begin() + long(k));
    const Instr& in = plan_.instrs[size_t(i)];
    if (op_info(in.op).kind == OpKind::Collective) finish_collective(in.op, in.collective());
    complete(s, i);
  }
}

void Executor::complete(Stream& s, int32_t i) {
  // Done for the host: issued (compute) or observed finished (communication). Device work that follows
  // it on other streams is ordered after this event (wait in run_stream_step, buffer reuse).
  backend_.record(s.ctx.get(), i);
  for (int32_t b : touched_[size_t(i)]) store_.release_use(b, s.id, i);
  const double t = now_seconds();
  s.events[size_t(event_index_[size_t(i)])].end = t - t0_;
  s.flight->finish(flight_index_[size_t(i)], t);
  done_[size_t(i)].store(epoch_, std::memory_order_release);
  done_[size_t(i)].notify_all();
}

void Executor::execute(Stream& s, int32_t i) {
  const Instr& in = plan_.instrs[size_t(i)];
  event_index_[size_t(i)] = int32_t(s.events.size());
  const double t = now_seconds();
  s.events.push_back({i, step_, t - t0_, 0});
  flight_index_[size_t(i)] = s.flight->start(i, step_, t);
  StreamContext* ctx = s.ctx.get();
  auto post = [&](std::unique_ptr<CommHandle> h) { s.pending.push_back({i, std::move(h)}); };
  switch (in.op) {
    case Op::Forward:
    case Op::Backward:
    case Op::BackwardInput:
    case Op::BackwardWeight:
    case Op::Recompute:
      run_compute(in.op, in.compute());
      break;
    case Op::Update: run_update(in.update()); break;
    case Op::StepSync: run_step_sync(in.step_sync()); break;
    case Op::ReadCounts: {
      const CountsArgs& c = in.counts();
      k_.begin_region("read counts");
      k_.download(host_counts_[size_t(c.buf)].data(), RaggedRows(store_.f(c.buf), c.parts).counts,
                  size_t(c.parts) * sizeof(int32_t));
      break;
    }
    case Op::Send: {
      const MessageArgs& m = in.message();
      post(p2p_->send(store_.f(m.buf) + m.offset, size_t(m.count), plan_.peer_rank(m.peer_set), m.tag, ctx));
      return;
    }
    case Op::Recv: {
      const MessageArgs& m = in.message();
      post(p2p_->recv(store_.f(m.buf) + m.offset, size_t(m.count), plan_.peer_rank(m.peer_set), m.tag, ctx));
      return;
    }
    case Op::AllReduce: {
      const CollectiveArgs& c = in.collective();
      float* buf = store_.f(c.buf) + c.offset + shard_offset(c.flags, kFlagBufShard, c.count, c.bucket);
      if (c.flags & kFlagBf16Wire) {  // wire(count) in bf16, read back into buf once reduced (finish_collective)
        auto* wire = static_cast<uint16_t*>(store_.acquire(c.wire));
        k_.to_bf16(wire, buf, size_t(c.count));
        post(group(c.group).all_reduce_bf16(wire, size_t(c.count), ctx));
      } else {
        post(group(c.group).all_reduce(buf, size_t(c.count), ctx));
      }
      return;
    }
    case Op::ReduceScatter: {
      const CollectiveArgs& c = in.collective();
      const float* src = store_.f(c.src) + c.src_offset;
      if (c.flags & kFlagBf16Wire) {  // wire: the group's n·count sent in bf16, then this rank's count received
        auto* wire = static_cast<uint16_t*>(store_.acquire(c.wire));
        const size_t sent = size_t(group(c.group).size()) * size_t(c.count);
        k_.to_bf16(wire, src, sent);
        post(group(c.group).reduce_scatter_bf16(wire, wire + sent, size_t(c.count), ctx));
        return;
      }
      float* dst = c.tmp >= 0 ? store_.f(c.tmp)
                              : store_.f(c.buf) + c.offset + shard_offset(c.flags, kFlagBufShard, c.count, c.bucket);
      post(group(c.group).reduce_scatter(src, dst, size_t(c.count), ctx));
      return;
    }
    case Op::AllToAll: {
      const AllToAllArgs& a = in.all_to_all();
      post(group(a.group).all_to_all_rows(store_.f(a.src), store_.f(a.buf), a.parts, a.row_width, ctx,
                                          host_counts_[size_t(a.buf)].data()));
      return;
    }
    case Op::AllGather: {
      const CollectiveArgs& c = in.collective();
      const float* src =
          c.src >= 0 ? store_.f(c.src) + c.src_offset + shard_offset(c.flags, kFlagSrcShard, c.count, c.bucket) : nullptr;
      if (c.flags & kFlagBf16Wire) {  // wire(n·count) in bf16, this rank's share at its place; read back when gathered
        auto* wire = static_cast<uint16_t*>(store_.acquire(c.wire));
        uint16_t* mine = wire + size_t(group(c.group).rank()) * size_t(c.count);
        k_.to_bf16(mine, src, size_t(c.count));
        post(group(c.group).all_gather_bf16(nullptr, wire, size_t(c.count), ctx));
        return;
      }
      post(group(c.group).all_gather(src, store_.f(c.buf) + c.offset, size_t(c.count), ctx));
      return;
    }
  }
  if (synchronous_) backend_.synchronize(ctx);  // device times in the timeline, at the cost of overlap
  complete(s, i);
}

// What a finished collective leaves to do here: a bf16 result read back into fp32 (a reduction's into its scratch,
// where there is one), and a reduce-scatter's scratch added or copied into its destination.
void Executor::finish_collective(Op op, const CollectiveArgs& in) {
  float* dst = store_.f(in.buf) + in.offset + shard_offset(in.flags, kFlagBufShard, in.count, in.bucket);
  if (op == Op::AllGather) {
    if (in.flags & kFlagBf16Wire)
      k_.from_bf16(store_.f(in.buf) + in.offset, static_cast<const uint16_t*>(store_.acquire(in.wire)),
                   size_t(group(in.group).size()) * size_t(in.count));
    return;
  }
  if (in.flags & kFlagBf16Wire) {
    const auto* wire = static_cast<const uint16_t*>(store_.acquire(in.wire));
    const size_t received_at = op == Op::AllReduce ? 0 : size_t(group(in.group).size()) * size_t(in.count);
    k_.from_bf16(in.tmp >= 0 ? store_.f(in.tmp) : dst, wire + received_at, size_t(in.count));
  }
  if (op != Op::ReduceScatter || in.tmp < 0) return;
  const float* tmp = store_.f(in.tmp);
  if (in.flags & kFlagAccumulate) k_.accumulate(dst, tmp, size_t(in.count));
  else k_.copy(dst, tmp, size_t(in.count) * sizeof(float));
}

void Executor::load_data(const ComputeArgs& in, void* stash) {
  const Segment& seg = plan_.segments[size_t(in.segment)];
  const int first = plan_.replica / plan_.data_sharing * plan_.samples_per_replica + in.sample_offset;
  const int n = in.samples;
  const DataSlot slot = seg.type->data;
  switch (slot) {
    case DataSlot::Tokens:
    case DataSlot::Targets:
    case DataSlot::Labels: {
      const size_t count = slot == DataSlot::Labels ? size_t(n) : size_t(n) * plan_.dims.seq_len;  // ids
      host_staging_.resize(count * sizeof(int32_t));
      auto* ids = reinterpret_cast<int32_t*>(host_staging_.data());
      if (slot == DataSlot::Labels) data_->labels(step_, first, n, ids);
      else if (slot == DataSlot::Tokens) data_->inputs(step_, first, n, ids);
      else data_->targets(step_, first, n, ids);
      k_.upload(stash, ids, count * sizeof(int32_t));
      break;
    }
    case DataSlot::Features: {
      size_t count = size_t(n) * plan_.dims.d_in;  // (n, d_in)
      host_staging_.resize(count * sizeof(float));
      auto* x = reinterpret_cast<float*>(host_staging_.data());
      data_->features(step_, first, n, x);
      k_.upload(stash, x, count * sizeof(float));
      break;
    }
    case DataSlot::None: break;
  }
}

void Executor::run_compute(Op op, const ComputeArgs& in) {
  const Segment& seg = plan_.segments[size_t(in.segment)];
  const size_t np = seg.params.size();
  // parameter and gradient pointers, in the segment's order (one pair of arrays per stream thread)
  thread_local std::vector<float*> w, g;
  w.assign(np, nullptr);
  g.assign(np, nullptr);
  for (size_t i = 0; i < np; ++i) {
    const PlanParam& pp = plan_.plan_params[size_t(param_slot_[size_t(seg.params[i])])];
    int64_t at = pp.offset;
    const PlanBucket& pb = plan_.buckets[size_t(pp.bucket)];
    if (pb.slices > 1) {  // only this rank's slice exists here; other slices' parameters stay null
      const BucketRange slice = owned_range(pb, plan_.replica, false);
      if (at < slice.lo || at >= slice.hi) continue;
      at -= slice.lo;
    }
    if (i < in.pbuf.size() && in.pbuf[i] >= 0) w[i] = store_.f(in.pbuf[i]) + at;
    if (i < in.gbuf.size() && in.gbuf[i] >= 0) g[i] = store_.f(in.gbuf[i]) + at;
  }
  SegmentIO io;
  io.samples = in.samples;
  io.shards = std::max(1, seg.shards);
  io.shard = plan_.replica % io.shards;  // the expert group's replicas are consecutive (GroupRef::SetBlock)
  io.w = w.data();
  io.g = g.data();
  io.overwrite = in.overwrite.empty() ? nullptr : in.overwrite.data();
  io.in = in.in >= 0 ? store_.f(in.in) : nullptr;
  io.out = in.out >= 0 ? store_.f(in.out) : nullptr;
  io.stash = store_.acquire(in.stash);
  if (in.stash_tail >= 0) io.stash_tail = store_.acquire(in.stash_tail);
  if (in.link >= 0) io.link = store_.acquire(in.link);
  io.dout = in.dout >= 0 ? store_.f(in.dout) : nullptr;
  io.din = in.din >= 0 ? store_.f(in.din) : nullptr;
  if (in.in >= 0 && !host_counts_[size_t(in.in)].empty()) io.counts = host_counts_[size_t(in.in)].data();
  // a recomputed forward adds its loss and balance loss where nothing reads them, and no routing statistics
  // (as does every replica of a block computing it alike but the first: the first counts them once)
  const bool uncounted = op == Op::Recompute || plan_.replica % in.alike_block != 0;
  io.loss_sum = scalars_ + (uncounted ? kSinkAt : kLossAt);
  io.balance_loss = scalars_ + (uncounted ? kSinkAt : kBalanceAt);
  if (op == Op::Forward && !uncounted && routing_offset_[size_t(in.segment)] >= 0)
    io.routing = scalars_ + kRoutingAt + routing_offset_[size_t(in.segment)];
  io.loss_scale = in.loss_scale;
  if (plan_.scratch_buf >= 0) io.scratch = store_.f(plan_.scratch_buf);
  k_.begin_region(seg.name.c_str());
  if (in.stash_bf16)
    run_held_pieces(op, in, seg, io, held_stashes_.at({in.segment, in.samples, (in.stash_bf16 & kStashHoldsInput) != 0}));
  else
    run_pass(op, in, seg, io, 0);
}

void Executor::run_pass(Op op, const ComputeArgs& in, const Segment& seg, SegmentIO io, size_t wstash_at) {
  float* workspace = store_.f(plan_.workspace_buf);
  const ModelDims& d = plan_.dims;
  const auto wstash = [&] { return in.wstash >= 0 ? store_.f(in.wstash) + wstash_at / sizeof(float) : nullptr; };
  switch (op) {
    case Op::Forward:
      io.workspace = workspace;
      if (seg.type->data != DataSlot::None) load_data(in, io.stash);
      segment_forward(k_, seg, d, io);
      break;
    case Op::Recompute:  // the whole forward again, or (a split stash) only the part selective recompute dropped
      io.workspace = workspace;
      if (in.stash_tail >= 0) {
        seg.type->rerun_tail(k_, seg, d, io);
        break;
      }
      if (seg.type->data != DataSlot::None) load_data(in, io.stash);
      segment_forward(k_, seg, d, io);
      break;
    case Op::Backward: {
      // fused: the weight-gradient inputs live in the workspace, scratch after them
      size_t wst = segment_sizes(seg, d, io.samples).wstash_bytes / sizeof(float);
      io.wstash = workspace;
      io.workspace = workspace + wst;
      segment_backward_input(k_, seg, d, io);
      backward_weight(in, seg, io);
      break;
    }
    case Op::BackwardInput:
      io.wstash = wstash();
      io.workspace = workspace;
      segment_backward_input(k_, seg, d, io);
      break;
    case Op::BackwardWeight:
      io.wstash = wstash();
      backward_weight(in, seg, io);
      break;
    default: break;
  }
}

// A stash held in bf16 is used in fp32 in the view, a piece of samples at a time: a forward writes the piece's stash
// there and it is stored, a backward reads it back there first; its bf16 activations (runs in place) are written
// and read where they are held. With the input held too, the view keeps it after the stash. Each piece's activations, gradients and BI→BW stash follow the one before; later pieces add to the
// weight gradients the first wrote.
void Executor::run_held_pieces(Op op, const ComputeArgs& in, const Segment& seg, const SegmentIO& io,
                               const HeldStash& held) {
  const int samples = in.samples / held.pieces;
  const SegmentSizes part = segment_sizes(seg, plan_.dims, samples);
  const bool holds_input = (in.stash_bf16 & kStashHoldsInput) != 0;
  float* view = store_.f(in.stash_view);
  float* view_input = holds_input ? view + (held.view_bytes() - part.input_bytes) / sizeof(float) : nullptr;  // last
  // the pieces read the same weights: the kernels may round each once (ended however the loop ends)
  struct KeptWeights {
    Kernels& k;
    bool on;
    ~KeptWeights() {
      if (on) k.keep_weights(false);
    }
  } kept{k_, held.pieces > 1};
  if (kept.on) k_.keep_weights(true);
  for (int piece = 0; piece < held.pieces; ++piece) {
    const size_t at = size_t(piece);
    SegmentIO pio = io;
    pio.samples = samples;
    pio.in = bytes_after(io.in, at * part.input_bytes);
    pio.din = bytes_after(io.din, at * part.input_bytes);
    pio.out = bytes_after(io.out, at * part.out_bytes);
    pio.dout = bytes_after(io.dout, at * part.out_bytes);
    if (piece > 0) pio.overwrite = nullptr;  // adds to what the first piece wrote
    void* held_piece = static_cast<char*>(io.stash) + at * held.piece.packed_bytes();
    pio.stash = view;
    pio.stash_held = held_piece;
    if (op != Op::Forward) {
      load_stash_bf16(held.piece, held_piece, view);
      if (holds_input) pio.in = view_input;
    }
    run_pass(op, in, seg, pio, at * part.wstash_bytes);
    if (op == Op::Forward) {
      if (holds_input) k_.copy(view_input, pio.in, part.input_bytes);
      store_stash_bf16(held.piece, view, held_piece);
    }
  }
}

void Executor::store_stash_bf16(const StashLayout& layout, const float* view, void* held) {
  char* to = static_cast<char*>(held);
  const char* from = reinterpret_cast<const char*>(view);
  for (const StashRun& r : layout.runs) {
    if (r.in_place) {}  // written there by the segment
    else if (r.exact) k_.copy(to, from + r.offset, r.bytes);
    else k_.to_bf16(reinterpret_cast<uint16_t*>(to), reinterpret_cast<const float*>(from + r.offset), r.bytes / 4);
    to += StashLayout::packed_size(r);
  }
}

void Executor::load_stash_bf16(const StashLayout& layout, const void* held, float* view) {
  const char* from = static_cast<const char*>(held);
  char* to = reinterpret_cast<char*>(view);
  for (const StashRun& r : layout.runs) {
    if (r.in_place) {}  // read there by the segment
    else if (r.exact) k_.copy(to + r.offset, from, r.bytes);
    else k_.from_bf16(reinterpret_cast<float*>(to + r.offset), reinterpret_cast<const uint16_t*>(from), r.bytes / 4);
    from += StashLayout::packed_size(r);
  }
}

// The weight gradients, or where another replica of the block computes them, zeros (a first write) or nothing.
void Executor::backward_weight(const ComputeArgs& in, const Segment& seg, const SegmentIO& io) {
  if (plan_.replica % in.alike_block == 0) return segment_backward_weight(k_, seg, plan_.dims, io);
  for (size_t i = 0; i < seg.params.size(); ++i)
    if (io.g[i] && !io.accumulate(int(i)))
      k_.fill(io.g[i], 0.f, size_t(plan_.params[size_t(seg.params[i])].numel));
}

void Executor::run_update(const UpdateArgs& in) {
  // every rank saw the same non-finite sums, or the step evaluates: parameters and moments stay as they were
  if (skip_update_ || evaluating_) return;
  k_.begin_region("optimizer");
  const OptimizerConfig& o = plan_.optimizer;
  AdamWArgs args;
  args.lr = float(lr_);
  args.beta1 = float(o.beta1);
  args.beta2 = float(o.beta2);
  args.eps = float(o.eps);
  args.grad_scale = float(clip_scale_);
  args.step = step_ + 1;
  // [lo, hi): the bucket elements updated, from this replica's slice (the start of the bucket's full buffers),
  // not past its end (the padding of a slice holds none of its parameters)
  const BucketRange slice = owned_range(plan_.buckets[size_t(in.bucket)], plan_.replica, false);
  const int64_t lo = slice.lo + shard_offset(in.flags, kFlagBucketShard, in.count, in.bucket),
                hi = std::min(lo + in.count, slice.hi);
  float* p = store_.f(in.buf) + in.offset + shard_offset(in.flags, kFlagBufShard, in.count, in.bucket);
  float* gr = store_.f(in.src) + in.src_offset + shard_offset(in.flags, kFlagSrcShard, in.count, in.bucket);
  float* m = store_.f(in.m);
  float* v = store_.f(in.v);
  for_each_param_piece(plan_, in.bucket, {lo, hi}, [&](const ParamPiece& piece) {
    const ParamSpec& spec = plan_.params[size_t(piece.pp->model_param)];
    const int64_t at = piece.begin - lo;
    if (spec.statistics_segment >= 0) return move_by_statistics(spec, piece, p + at);
    args.weight_decay = spec.decay ? float(o.weight_decay) : 0.f;
    k_.adamw(p + at, gr + at, m + at, v + at, size_t(piece.count()), args);
  });
}

void Executor::move_by_statistics(const ParamSpec& spec, const ParamPiece& piece, float* p) {
  const int32_t s = spec.statistics_segment;
  const Segment& seg = plan_.segments[size_t(s)];
  PIPER_CHECK(seg.type->statistics_step && routing_offset_[size_t(s)] >= 0, "parameter ", spec.name,
              " follows segment ", seg.name, ", which has no routing statistics");
  statistics_delta_.resize(size_t(spec.numel));
  seg.type->statistics_step(plan_.dims, metrics_.routing.data() + routing_offset_[size_t(s)], statistics_delta_.data());
  k_.upload(statistics_delta_dev_, statistics_delta_.data() + piece.param_begin(), size_t(piece.count()) * sizeof(float));
  k_.accumulate(p, statistics_delta_dev_, size_t(piece.count()));
}

void Executor::run_step_sync(const StepSyncArgs& in) {
  k_.begin_region("step sync");
  for (const auto& s : in.spans) {
    int64_t off = s.offset + (s.per_replica ? int64_t(plan_.replica / s.slices) * s.count : 0);
    k_.sum_squares(scalars_ + kNormAt, store_.f(s.buf) + off, size_t(s.count));
  }
  // cross-entropy, gradient norm², balance loss, stop requests, failures, then the routing statistics
  std::vector<double>& local = sync_local_;
  std::vector<double>& global = sync_global_;
  local.assign(5 + routing_size_, 0.0);
  global.assign(local.size(), 0.0);
  k_.download(device_sums_.data(), scalars_, scalar_count_ * sizeof(double));  // the step's one read of its sums
  local[0] = device_sums_[kLossAt];
  local[1] = device_sums_[kNormAt];
  local[2] = device_sums_[kBalanceAt];
  local[3] = stop_flag_ && stop_flag_->load() != 0 ? 1.0 : 0.0;
  local[4] = failure_flag_ && failure_flag_->load() != 0 ? 1.0 : 0.0;
  std::copy(device_sums_.begin() + kRoutingAt, device_sums_.end(), local.begin() + 5);
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(local.data(), global.data(), int(local.size()), MPI_DOUBLE, MPI_SUM, world_, &r));
  int flag = 0, round = 0;
  while (true) {
    MPI_CHECK(MPI_Test(&r, &flag, MPI_STATUS_IGNORE));
    if (flag) break;
    if (abort_) throw Aborted{};
    backoff(round);
  }
  metrics_.loss = global[0] + global[2];
  metrics_.balance_loss = global[2];
  metrics_.grad_norm = std::sqrt(global[1]);
  metrics_.stop_requested = global[3] > 0;
  metrics_.failure_reported = global[4] > 0;
  metrics_.routing.assign(global.begin() + 5, global.end());
  // A NaN or infinity on any rank makes the sums non-finite on every rank alike.
  metrics_.finite = std::isfinite(global[0]) && std::isfinite(global[1]) && std::isfinite(global[2]);
  skip_update_ = !metrics_.finite;
  const double clip = plan_.optimizer.grad_clip;
  clip_scale_ = (clip > 0 && metrics_.grad_norm > clip) ? clip / (metrics_.grad_norm + 1e-6) : 1.0;
}

}  // namespace piper
