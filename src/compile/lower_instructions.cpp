// Lowering's instructions: the compute of each segment op (with its parameter gathers, receives and reruns), and
// the communication nodes (messages, reductions, exchanges, gathers, ties, the step's sync) and the updates.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/ragged_rows.hpp"
#include "compile/lowerer.hpp"
#include "util/error.hpp"

namespace piper::lowering {

void Lowerer::plan_segment_ops(const std::vector<int>& sequence) {
  for (int id : index_.gathers[size_t(set_)]) {
    const Node& n = g_.nodes[size_t(id)];
    if (n.purpose == CommPurpose::Activation) {  // a backward's input held in parts: for each of its readers
      for (int ei : index_.out[size_t(id)]) regather_.emplace(g_.edges[size_t(ei)].to, n.id);
    } else {
      gather_node_[{n.gather_for, n.bucket}] = n.id;
    }
  }
  for (int id : sequence) {
    const Node& n = g_.nodes[size_t(id)];
    if (!is_compute(n.kind)) continue;
    const Region& r = g_.regions[size_t(n.region)];
    if (n.kind == NodeKind::F) {
      for (int s = r.seg_begin; s < r.seg_end; ++s) ops_.push_back({id, s});
    } else if (n.kind == NodeKind::R) {  // its reruns go with the backward it serves, segment by segment
      for (int ei : index_.out[size_t(id)])
        if (g_.edges[size_t(ei)].kind == EdgeKind::Data) {
          const int backward = g_.edges[size_t(ei)].to;
          rerun_of_[backward] = id;
          gathers_of_[id] = backward;  // the backward's parameter gathers serve its reruns
        }
    } else {
      auto rerun = rerun_of_.find(id);
      for (int s = r.seg_end - 1; s >= r.seg_begin; --s) {
        // a segment's forward again just before its backward: one rerun stash alive at a time
        if (rerun != rerun_of_.end() && recomputed(s)) ops_.push_back({rerun->second, s});
        ops_.push_back({id, s});
      }
    }
  }
}

// A gradient reduction can start as soon as the last backward segment writing its bucket is done, not
// only after the whole backward node: that is what lets it overlap the rest of the backward pass.
void Lowerer::plan_early_reductions(const std::vector<int>& sequence) {
  std::map<int, size_t> position;
  for (size_t i = 0; i < sequence.size(); ++i) position[sequence[i]] = i;
  const auto& in = index_.in;
  for (int id : sequence) {
    const Node& c = g_.nodes[size_t(id)];
    if (c.purpose != CommPurpose::Gradient || c.bucket < 0) continue;
    int last = -1;
    for (int ei : in[size_t(id)]) {
      int w = g_.edges[size_t(ei)].from;
      if (!position.count(w)) continue;
      if (last < 0 || position[w] > position[last]) last = w;
    }
    if (last < 0 || !is_compute(g_.nodes[size_t(last)].kind)) continue;
    const Region& r = g_.regions[size_t(g_.nodes[size_t(last)].region)];
    const auto& params = g_.buckets[size_t(c.bucket)].params;
    int lowest = -1;  // backward runs segments downwards: the lowest one using the bucket finishes it
    for (int s = r.seg_begin; s < r.seg_end && lowest < 0; ++s)
      for (int p : segs_[size_t(s)].params)
        if (std::find(params.begin(), params.end(), p) != params.end()) lowest = s;
    if (lowest < 0) continue;
    early_[{last, lowest}].push_back(id);
    hoisted_.insert(id);
  }
}

// Receives by the position (among this set's compute nodes) of their first consumer.
void Lowerer::plan_receives(const std::vector<int>& sequence) {
  std::map<int, size_t> compute_position;
  for (int id : sequence)
    if (is_compute(g_.nodes[size_t(id)].kind)) compute_position.emplace(id, compute_position.size());
  const auto& out = index_.out;
  for (int id : sequence) {
    if (g_.nodes[size_t(id)].kind != NodeKind::RECV) continue;
    size_t first = SIZE_MAX;
    for (int ei : out[size_t(id)]) {
      const int to = g_.edges[size_t(ei)].to;
      auto it = compute_position.find(to);
      if (it != compute_position.end()) first = std::min(first, it->second);
      if (g_.nodes[size_t(to)].kind == NodeKind::ALL_GATHER && g_.nodes[size_t(to)].gather_for < 0) {
        // a part, gathered just before the first of its readers (in compute order, as the group's stream runs)
        hoisted_.insert(to);
        for (int ej : out[size_t(to)]) {
          const int reader = g_.edges[size_t(ej)].to;
          regather_.emplace(reader, to);
          auto jt = compute_position.find(reader);
          if (jt != compute_position.end()) first = std::min(first, jt->second);
        }
      }
    }
    PIPER_CHECK(first != SIZE_MAX, "receive ", g_.nodes[size_t(id)].label(), " has no consumer on set ", set_);
    receives_for_[first].push_back(id);
  }
}

// A receive starts when the compute before it is done: its stream holds nothing else to wait on, and would
// otherwise post (and allocate) every receive of the step at once, ahead of the plan and its memory estimate.
void Lowerer::issue_receives(size_t compute_index) {
  auto it = receives_for_.find(compute_index);
  if (it == receives_for_.end()) return;
  for (int id : it->second) emit_node(g_.nodes[size_t(id)], last_compute_);
  receives_for_.erase(it);
}

// Sharded buckets the segment op needs: gathered (on the gather stream) ahead of the op, one gather per
// run of consecutive ops using the bucket — the forward-to-backward turn keeps its copy, a bucket used
// again later (the tied embedding at the head) is gathered again rather than held in between.
void Lowerer::issue_gathers(size_t op_index) {
  const SegOp& op = ops_[op_index];
  if (g_.nodes[size_t(op.node)].kind == NodeKind::BW) return;  // weight gradients never read the weights
  for (int param : segs_[size_t(op.segment)].params) {
    int gb = graph_bucket_of_param(param);
    if (!plan_bucket(gb).shard_params || instance_for_op_.count({op_index, gb}))
      continue;
    auto cur = gathered_.find(gb);
    if (cur != gathered_.end() && cur->second.last + 1 >= op_index) {
      cur->second.last = op_index;
      instance_for_op_[{op_index, gb}] = cur->second.buf;
      continue;
    }
    auto owner = gathers_of_.find(op.node);
    auto node = gather_node_.find({owner != gathers_of_.end() ? owner->second : op.node, gb});
    PIPER_CHECK(node != gather_node_.end(), "no parameter gather node for bucket ", gb);
    const PlanBucket& pb = plan_bucket(gb);
    int buf = new_buffer(uint64_t(pb.padded) * sizeof(float), BufferKind::Param, false,
                         cat("bucket", gb, ".gathered.op", op_index));
    gathered_[gb] = Gathered{buf, op_index};
    instance_for_op_[{op_index, gb}] = buf;
    // A prefetch starts when the compute before it is done: one use ahead, never the whole step ahead.
    gather_target_ = buf;
    emit_node(g_.nodes[size_t(node->second)], last_compute_);
  }
}

// The gather of a backward's input held in parts, just before the first op that reads it (the backward, or the
// rerun of its forward), when the compute before it is done.
void Lowerer::issue_regather(size_t op_index) {
  const SegOp& op = ops_[op_index];
  auto owner = gathers_of_.find(op.node);
  const int reader = owner != gathers_of_.end() ? owner->second : op.node;
  for (auto [it, end] = regather_.equal_range(reader); it != end; ++it)
    if (regathered_.insert(it->second).second) emit_node(g_.nodes[size_t(it->second)], last_compute_);
}

bool Lowerer::segment_uses(const SegOp& op, int gb) const {
  for (int param : segs_[size_t(op.segment)].params)
    if (graph_bucket_of_param(param) == gb) return true;
  return false;
}

Op Lowerer::compute_op(NodeKind kind) {
  switch (kind) {
    case NodeKind::F: return Op::Forward;
    case NodeKind::B: return Op::Backward;
    case NodeKind::BI: return Op::BackwardInput;
    case NodeKind::BW: return Op::BackwardWeight;
    case NodeKind::R: return Op::Recompute;
    default: PIPER_CHECK(false, "not a compute node");
  }
  return Op::Forward;
}

void Lowerer::emit_compute(size_t op_index) {
  const SegOp& op = ops_[op_index];
  const Node& n = g_.nodes[size_t(op.node)];
  const Segment& seg = segs_[size_t(op.segment)];
  const int mb = n.mb < 0 ? 0 : n.mb;
  if (n.kind == NodeKind::F) emit_read_counts(n, op.segment, mb);
  Instr instr(compute_op(n.kind));
  instr.node = n.id;
  instr.mb = mb;
  instr.stream = uint8_t(stream_id("compute"));
  ComputeArgs& in = std::get<ComputeArgs>(instr.args);
  in.segment = op.segment;
  in.samples = b_;
  in.sample_offset = mb * b_;
  in.loss_scale = float(1.0 / (double(g_.global_batch) * m_.dims.rows_per_sample));
  const bool input = !reads_data(seg);
  // A recomputed segment's forward stash lives only through the forward and the rerun writes the one kept (full);
  // under selective recompute the forward keeps the kept part and drops the tail, which the rerun writes again.
  const bool full = recomputed(op.segment) && !selective(op.segment);
  in.stash = n.kind == NodeKind::F && full ? forward_only_stash(op.segment, mb) : stash_buf(op.segment, mb);
  if (selective(op.segment))
    in.stash_tail = n.kind == NodeKind::F ? forward_only_stash(op.segment, mb) : stash_tail_buf(op.segment, mb);
  if (seg.type->link_offset != 0) {
    const int partner = op.segment + seg.type->link_offset;
    PIPER_CHECK(partner >= 0 && size_t(partner) < segs_.size(), "segment ", seg.name, " links outside the model");
    if (!on_this_set(partner))
      throw UserError(cat("segments '", segs_[size_t(partner)].name, "' and '", seg.name,
                          "' share state and must be placed on the same device set; cut the model elsewhere"));
    in.link = stash_buf(partner, mb);
  }
  if (input) in.in = exchanged(TensorRef::Kind::Act, op.segment) ? exchanged_buf('X', op.segment, mb) : act_buf(op.segment, mb);
  if (input && in_parts(op.segment)) in.in = whole_buf(n.kind == NodeKind::F ? 'G' : 'H', op.segment, mb);
  if (stash_in_bf16(op.segment)) {  // the stash (and input) in bf16, used in fp32 in a view of this pass only
    const bool holds_input = input_in_stash(op.segment);
    in.stash_bf16 = kStashBf16 | (holds_input ? kStashHoldsInput : 0);
    in.stash_view = keyed_buffer('V', op.segment, mb * 8 + int(n.kind), held(op.segment).view_bytes(),
                                 BufferKind::Activation,
                                 cat("stash", op.segment, ".mb", mb, ".view.", n.kind == NodeKind::F    ? "F"
                                                                              : n.kind == NodeKind::B  ? "B"
                                                                              : n.kind == NodeKind::BI ? "BI"
                                                                                                       : "BW"));
    if (holds_input && n.kind != NodeKind::F) in.in = -1;
  }
  if (n.kind == NodeKind::F && !is_head(seg))
    in.out = in_parts(op.segment + 1) ? whole_buf('P', op.segment + 1, mb) : act_buf(op.segment + 1, mb);
  if (n.kind == NodeKind::R && !is_head(seg) && !selective(op.segment)) in.out = rerun_output(op.segment, mb);
  if (n.kind != NodeKind::F && n.kind != NodeKind::R) {
    if (!is_head(seg))
      in.dout = exchanged(TensorRef::Kind::ActGrad, op.segment + 1) ? exchanged_buf('Y', op.segment + 1, mb)
                : in_parts(op.segment + 1)                           ? whole_buf('E', op.segment + 1, mb)
                                                                     : act_grad_buf(op.segment + 1, mb);
    if (input && n.kind != NodeKind::BW)
      in.din = in_parts(op.segment) ? whole_buf('Q', op.segment, mb) : act_grad_buf(op.segment, mb);
    if (n.kind == NodeKind::BI || n.kind == NodeKind::BW) in.wstash = wstash_buf(op.segment, mb);
  }
  const bool reads_params = n.kind != NodeKind::BW;
  const bool writes_grads = n.kind == NodeKind::B || n.kind == NodeKind::BW;
  // A tensor-parallel group runs a segment it does not split (nor spread as experts, which see routed rows) alike
  // on every rank: one rank's weight gradients, loss and statistics count. A loss segment split over the group
  // adds the whole loss on every rank: one counts.
  const int group = g_.sets[size_t(set_)].tp;
  const bool split = seg.shards > 1 && seg.type->tp_split;
  if (group > 1 && ((!split && !seg.type->shard_units) || seg.type->computes_loss)) in.alike_block = group;
  const auto& params = seg.params;
  for (size_t i = 0; i < params.size(); ++i) {
    int gb = graph_bucket_of_param(params[i]);
    in.pbuf.push_back(reads_params ? param_source(gb, op_index) : -1);
    if (writes_grads) {
      int gbuf = grad_target(gb, mb);
      in.gbuf.push_back(gbuf);
      in.overwrite.push_back(grad_written_.insert({gbuf, params[i]}).second ? 1 : 0);
      // At most one microbatch's full gradients per bucket: the next one is written only after the
      // previous one has been reduce-scattered.
      auto prev = last_reduce_scatter_.find(gb);
      if (plan_bucket(gb).shard_grads && prev != last_reduce_scatter_.end()) wait_for_reduce_scatter(instr, prev->second);
      if (plan_bucket(gb).shard_grads) limit_grad_buffers(instr, gb, gbuf);
    } else {
      in.gbuf.push_back(-1);
      in.overwrite.push_back(0);
    }
  }
  last_compute_ = int32_t(p_.instrs.size());
  p_.instrs.push_back(std::move(instr));
}

// A segment reading ragged rows that no exchange delivers (its experts are all here) learns their counts
// from a read on its stream, just before its forward: the host waits there, where plans and traces show it.
void Lowerer::emit_read_counts(const Node& n, int segment, int mb) {
  const Segment& seg = segs_[size_t(segment)];
  if (reads_data(seg) || exchanged(TensorRef::Kind::Act, segment)) return;
  const int parts = segment_sizes(seg, m_.dims, b_).ragged_parts;
  if (parts <= 0) return;
  Instr instr(Op::ReadCounts);
  instr.node = n.id;
  instr.mb = mb;
  instr.stream = uint8_t(stream_id("compute"));
  std::get<CountsArgs>(instr.args) = CountsArgs{act_buf(segment, mb), parts};
  p_.instrs.push_back(std::move(instr));
}

Op Lowerer::comm_op(const Node& n) {
  switch (n.kind) {
    case NodeKind::SEND: return Op::Send;
    case NodeKind::RECV: return Op::Recv;
    case NodeKind::ALL_REDUCE: return n.purpose == CommPurpose::StepSync ? Op::StepSync : Op::AllReduce;
    case NodeKind::REDUCE_SCATTER: return Op::ReduceScatter;
    case NodeKind::ALL_TO_ALL: return Op::AllToAll;
    case NodeKind::ALL_GATHER: return Op::AllGather;
    default: PIPER_CHECK(false, "cannot lower ", n.label());
  }
  return Op::Send;
}

void Lowerer::emit_node(const Node& n, int32_t after) {
  if (n.kind == NodeKind::UPDATE) return emit_updates(n);
  Instr in(comm_op(n));
  in.node = n.id;
  if (after >= 0) in.waits.push_back(after);  // pacing: not before this instruction is done
  in.mb = n.mb;
  in.stream = uint8_t(stream_id(n.stream));
  switch (in.op) {
    case Op::Send:
    case Op::Recv: {
      MessageArgs& m = std::get<MessageArgs>(in.args);
      m.peer_set = n.peer_set;
      m.tag = n.kind == NodeKind::SEND ? n.id : n.pair;
      m.buf = n.tensor.kind == TensorRef::Kind::Act ? act_buf(n.tensor.index, n.mb) : act_grad_buf(n.tensor.index, n.mb);
      m.count = act_elems(n.tensor.index);
      break;
    }
    case Op::StepSync: return emit_step_sync(in);
    case Op::AllReduce:
      if (n.purpose == CommPurpose::TiedGradient) return emit_tie(n, in);
      emit_all_reduce(n, std::get<CollectiveArgs>(in.args));
      break;
    case Op::ReduceScatter: emit_reduce_scatter(n, std::get<CollectiveArgs>(in.args)); break;
    case Op::AllToAll: emit_all_to_all(n, std::get<AllToAllArgs>(in.args)); break;
    case Op::AllGather: emit_all_gather(n, std::get<CollectiveArgs>(in.args)); break;
    default: PIPER_CHECK(false, "cannot lower ", n.label());
  }
  p_.instrs.push_back(std::move(in));
}

void Lowerer::emit_all_reduce(const Node& n, CollectiveArgs& in) {
  if (n.purpose == CommPurpose::Activation) {  // partial activations (or their gradients) of a tensor-parallel group
    const int boundary = n.tensor.index;
    in.group = group_id({GroupRef::Kind::SetBlock, {set_, g_.sets[size_t(set_)].tp}, n.stream});
    in.buf = n.tensor.kind == TensorRef::Kind::Act ? act_buf(boundary, n.mb) : act_grad_buf(boundary, n.mb);
    in.count = act_elems(boundary);
    return;
  }
  const PlanBucket& pb = plan_bucket(n.bucket);
  in.bucket = bucket_index_.at(n.bucket);
  in.group = pb.group;
  in.buf = pb.grad_buf;
  in.count = pb.padded;
  wire_in_bf16(n, in, uint64_t(in.count));
}

// job.grad_reduce = "bf16": a gradient reduction travels and sums in bf16, staged in a transient wire buffer
// of `values` bf16 (an all-reduce's count; a reduce-scatter's group·count sent and count received).
void Lowerer::wire_in_bf16(const Node& n, CollectiveArgs& in, uint64_t values) {
  if (spec_.job.grad_reduce != "bf16") return;
  in.flags |= kFlagBf16Wire;
  in.wire = new_buffer(values * sizeof(uint16_t), BufferKind::Comm, false,
                       cat("bucket", n.bucket, n.mb >= 0 ? cat(".mb", n.mb) : std::string(), ".bf16_wire"));
}

void Lowerer::emit_reduce_scatter(const Node& n, CollectiveArgs& in) {
  if (n.purpose == CommPurpose::Activation) {  // a partial activation (or gradient) summed into this rank's rows
    const int b = n.tensor.index;
    const bool forward = n.tensor.kind == TensorRef::Kind::Act;
    in.group = group_id({GroupRef::Kind::SetBlock, {set_, g_.sets[size_t(set_)].tp}, n.stream});
    in.src = whole_buf(forward ? 'P' : 'Q', b, n.mb);
    in.buf = forward ? act_buf(b, n.mb) : act_grad_buf(b, n.mb);
    in.count = act_elems(b);
    return;
  }
  const PlanBucket& pb = plan_bucket(n.bucket);
  in.bucket = bucket_index_.at(n.bucket);
  in.group = pb.group;
  in.count = shard_count(pb);
  const uint64_t shard_bytes = uint64_t(in.count) * sizeof(float);
  if (!pb.shard_grads) {  // in place into the full gradient buffer's own shard, through a scratch
    in.src = pb.grad_buf;
    in.buf = pb.grad_buf;
    in.flags |= kFlagBufShard;
    in.tmp = new_buffer(shard_bytes, BufferKind::Comm, false, cat("bucket", n.bucket, ".rs_scratch"));
  } else {  // one microbatch's full gradients into the persistent shard
    last_reduce_scatter_[n.bucket] = int32_t(p_.instrs.size());
    unwaited_reduce_scatters_.push_back(int32_t(p_.instrs.size()));
    in.src = grad_target(n.bucket, n.mb);
    in.buf = pb.grad_shard_buf;
    if (!shard_written_.insert(pb.grad_shard_buf).second) {
      in.flags |= kFlagAccumulate;
      in.tmp = new_buffer(shard_bytes, BufferKind::Comm, false, cat("bucket", n.bucket, ".rs_scratch.mb", n.mb));
    }
  }
  wire_in_bf16(n, in, uint64_t(in.count) * uint64_t(pb.group_size + 1));
}

// The routed rows of a boundary, from what its producer wrote to what its consumer reads.
void Lowerer::emit_all_to_all(const Node& n, AllToAllArgs& in) {
  const int boundary = n.tensor.index;
  const bool forward = n.tensor.kind == TensorRef::Kind::Act;
  const Region& r = g_.regions[size_t(n.region)];
  const int k = slices_of(r);  // the ranks of this rank's expert group
  in.group = group_id(k < n_ ? GroupRef{GroupRef::Kind::SetBlock, {set_, k}, n.stream}
                             : GroupRef{GroupRef::Kind::DeviceSet, {set_}, n.stream});
  in.src = forward ? act_buf(boundary, n.mb) : act_grad_buf(boundary, n.mb);
  in.buf = exchanged_buf(forward ? 'X' : 'Y', boundary, n.mb);
  // the layout of the sharded side's rows
  const SegmentSizes z = segment_sizes(segs_[size_t(r.seg_begin)], m_.dims, b_);
  PIPER_CHECK(z.ragged_parts > 0, "exchange at a segment without counted rows");
  in.parts = z.ragged_parts;
  in.row_width = z.ragged_width;
  in.rows = RaggedRows::rows_in(z.input_bytes, z.ragged_parts, z.ragged_width) / k;
}

void Lowerer::emit_all_gather(const Node& n, CollectiveArgs& in) {
  if (n.purpose == CommPurpose::Activation) {  // a tensor-parallel group's parts of an activation
    const int k = g_.sets[size_t(set_)].tp, b = n.tensor.index;
    const bool forward = n.tensor.kind == TensorRef::Kind::Act;
    in.group = group_id({GroupRef::Kind::SetBlock, {set_, k}, n.stream});
    if (!in_parts(b)) {  // each rank wrote its part in place (an output made of parts)
      in.buf = act_buf(b, n.mb);
      in.count = act_elems(b) / k;
      return;
    }
    in.src = forward ? act_buf(b, n.mb) : act_grad_buf(b, n.mb);  // this rank's rows
    in.buf = whole_buf(!forward ? 'E' : (n.gather_for >= 0 ? 'H' : 'G'), b, n.mb);
    in.count = act_elems(b);
    return;
  }
  const PlanBucket& pb = plan_bucket(n.bucket);
  in.bucket = bucket_index_.at(n.bucket);
  in.count = shard_count(pb);
  if (pb.shard_params) {
    in.group = group_id(replica_group(pb, n.stream));
    in.src = pb.param_shard_buf;
    in.buf = gather_target_;
    // a bf16 run's bucket of matmul operands travels rounded to bf16, as its matmuls would round it
    const auto& params = g_.buckets[size_t(n.bucket)].params;
    if (g_.bf16 && std::all_of(params.begin(), params.end(),
                               [&](int p) { return m_.params[size_t(p)].bf16_operand; })) {
      in.flags |= kFlagBf16Wire;
      in.wire = new_buffer(uint64_t(in.count) * uint64_t(pb.group_size) * sizeof(uint16_t), BufferKind::Comm, false,
                           cat("bucket", n.bucket, ".bf16_gather.", p_.instrs.size()));
    }
  } else {
    in.group = pb.group;
    in.src = -1;  // in place: this rank's shard already sits at its place in the full buffer
    in.buf = pb.param_buf;
  }
}

// The gradient range this rank owns after reduction (what it updates and counts in the norm).
Span Lowerer::owned_grads(const PlanBucket& pb) const {
  if (pb.zero < 0) return Span{pb.grad_buf, 0, pb.padded, false};
  if (pb.shard_grads) return Span{pb.grad_shard_buf, 0, shard_count(pb), false};
  return Span{pb.grad_buf, 0, shard_count(pb), true, pb.slices};
}

void Lowerer::emit_tie(const Node& n, Instr& instr) {
  int local = -1;
  for (size_t i = 0; i < n.tie_sets.size(); ++i)
    if (n.tie_sets[i] == set_) local = n.tie_buckets[i];
  const PlanBucket& pb = plan_bucket(local);
  Span s = owned_grads(pb);
  if (pb.zero == 0) s = Span{pb.grad_buf, 0, pb.padded, false};  // all-reduced: every replica has all of it
  CollectiveArgs& in = std::get<CollectiveArgs>(instr.args);
  in.bucket = bucket_index_.at(local);
  in.group = group_id({GroupRef::Kind::AcrossSets, std::vector<int32_t>(n.tie_sets.begin(), n.tie_sets.end()), n.stream});
  in.buf = s.buf;
  in.count = s.count;
  if (s.per_replica) in.flags |= kFlagBufShard;
  p_.instrs.push_back(std::move(instr));
}

void Lowerer::emit_step_sync(Instr& instr) {
  instr.stream = uint8_t(stream_id("compute"));
  StepSyncArgs& in = std::get<StepSyncArgs>(instr.args);
  in.group = group_id({GroupRef::Kind::World, {}, "compute"});
  for (const auto& pb : p_.buckets) {
    if (pb.tied_copy) continue;
    Span s = owned_grads(pb);
    if (pb.zero == 0) s = Span{pb.grad_buf, 0, shard_count(pb), true, pb.slices};  // each part on one replica
    in.spans.push_back(s);
  }
  p_.instrs.push_back(std::move(instr));
}

void Lowerer::emit_updates(const Node& n) {
  for (size_t i = 0; i < p_.buckets.size(); ++i) {
    const PlanBucket& pb = p_.buckets[i];
    if (pb.region != n.region) continue;
    Instr instr(Op::Update);
    instr.node = n.id;
    instr.stream = uint8_t(stream_id("compute"));
    UpdateArgs& in = std::get<UpdateArgs>(instr.args);
    in.bucket = int(i);
    in.m = pb.m_buf;
    in.v = pb.v_buf;
    if (!pb.shard_optimizer) {
      in.buf = pb.param_buf;
      in.src = pb.grad_buf;
      in.count = pb.padded;
    } else {
      in.count = shard_count(pb);
      in.flags |= kFlagBucketShard;
      if (pb.shard_params) in.buf = pb.param_shard_buf;
      else { in.buf = pb.param_buf; in.flags |= kFlagBufShard; }
      if (pb.shard_grads) in.src = pb.grad_shard_buf;
      else { in.src = pb.grad_buf; in.flags |= kFlagSrcShard; }
    }
    p_.instrs.push_back(std::move(instr));
  }
}

}  // namespace piper::lowering
