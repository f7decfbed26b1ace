// Lowering's buffers: parameter buckets (full or sharded, with their gradients and optimizer moments), and per
// boundary and microbatch the activations, their gradients, the segments' stashes and the workspace.
#include <algorithm>
#include <cstdio>
#include <string>

#include "compile/lowerer.hpp"
#include "util/error.hpp"

namespace piper::lowering {

// Replicated: more than one rank holds the same parameters (the set, or the copies of one slice).
bool Lowerer::replicated(const Bucket& b) const {
  const Region& r = g_.regions[size_t(b.region)];
  return r.zero >= 0 && bucket_copies(g_, b) > 1;
}

// How segment `seg` of a tensor-parallel group holds model parameter `param`.
ParamSplit Lowerer::split_of(int param, const Region& r) const {
  for (int s = r.seg_begin; s < r.seg_end; ++s) {
    const Segment& seg = segs_[size_t(s)];
    for (size_t slot = 0; slot < seg.params.size(); ++slot)
      if (seg.params[slot] == param && seg.shards > 1 && seg.type->tp_split)
        return seg.type->tp_split(m_.dims, int(slot), seg.shards);
  }
  return ParamSplit::copy();
}

// The group of a bucket's replicas: the whole set, or the replicas holding the same slice.
GroupRef Lowerer::replica_group(const PlanBucket& pb, const std::string& stream) const {
  if (pb.slices > 1) return {GroupRef::Kind::SetStride, {set_, pb.slices}, stream};
  return {GroupRef::Kind::DeviceSet, {set_}, stream};
}

void Lowerer::make_buckets() {
  for (size_t gb = 0; gb < g_.buckets.size(); ++gb) {
    const Bucket& b = g_.buckets[gb];
    const Region& r = g_.regions[size_t(b.region)];
    if (r.device_set != set_) continue;
    PlanBucket pb;
    pb.region = b.region;
    pb.numel = b.numel;
    pb.tied_copy = b.tied_copy;
    // sliced: each rank holds, computes and updates only its slice (whole experts, or a tensor-parallel group's
    // pieces), reduced over the copies of that slice
    pb.slices = b.slices;
    PIPER_CHECK(b.numel % pb.slices == 0, "sharded bucket ", gb, " of ", b.numel, " parameters in ", pb.slices,
                " slices");
    const int64_t numel = pb.slice_numel();
    pb.zero = replicated(b) ? r.zero : -1;
    pb.group_size = replicated(b) ? n_ / pb.slices : 1;
    pb.padded = (numel + pb.group_size - 1) / pb.group_size * pb.group_size;
    if (replicated(b)) {
      pb.group = group_id(replica_group(pb, r.dp_stream));
      pb.shard_optimizer = r.zero >= 1;
      pb.shard_grads = r.zero >= 2;
      pb.shard_params = r.zero >= 3;
    }
    const uint64_t full = uint64_t(pb.padded) * sizeof(float);
    const uint64_t shard = full / uint64_t(pb.group_size);
    const std::string nm = cat("bucket", gb);
    if (pb.shard_params) {
      pb.param_shard_buf = new_buffer(shard, BufferKind::Param, true, nm + ".param_shard");
    } else {
      pb.param_buf = new_buffer(full, BufferKind::Param, true, nm + ".param");
    }
    if (pb.shard_grads) {
      pb.grad_shard_buf = new_buffer(shard, BufferKind::Grad, true, nm + ".grad_shard");
    } else {
      pb.grad_buf = new_buffer(full, BufferKind::Grad, true, nm + ".grad");
      p_.buffers[size_t(pb.grad_buf)].zero_from = uint64_t(numel) * sizeof(float);
    }
    const uint64_t opt = pb.shard_optimizer ? shard : full;
    pb.m_buf = new_buffer(opt, BufferKind::OptState, true, nm + ".adam_m");
    pb.v_buf = new_buffer(opt, BufferKind::OptState, true, nm + ".adam_v");
    bucket_index_[int(gb)] = int(p_.buckets.size());
    int64_t offset = 0;
    // tensor-parallel pieces: slice t holds piece t of every parameter, in the bucket's order
    for (int piece = b.tp_pieces ? 0 : -1; piece < (b.tp_pieces ? pb.slices : 0); ++piece) {
      for (int param : b.params) {
        PlanParam pp;
        pp.model_param = param;
        pp.bucket = int(p_.buckets.size());
        pp.offset = offset;
        pp.home = !b.tied_copy;
        pp.piece = piece;
        int64_t elements = m_.params[size_t(param)].numel;
        if (piece >= 0) {
          const ParamSplit split = split_of(param, r);
          PIPER_CHECK(split.split() && split.outer * split.inner * pb.slices == elements, "parameter ",
                      m_.params[size_t(param)].name, " does not split into ", pb.slices, " pieces");
          pp.split_outer = split.outer;
          pp.split_inner = split.inner;
          elements /= pb.slices;
        }
        offset += elements;
        p_.plan_params.push_back(pp);
      }
    }
    p_.buckets.push_back(pb);
  }
}

int Lowerer::graph_bucket_of_param(int param) const {
  for (const auto& [gb, pbi] : bucket_index_)
    for (int q : g_.buckets[size_t(gb)].params)
      if (q == param) return gb;
  PIPER_CHECK(false, "parameter ", m_.params[size_t(param)].name, " has no bucket on set ", set_);
  return -1;
}

const PlanBucket& Lowerer::plan_bucket(int gb) const {
  auto it = bucket_index_.find(gb);
  PIPER_CHECK(it != bucket_index_.end(), "bucket ", gb, " is not on set ", set_);
  return p_.buckets[size_t(it->second)];
}

// `in` waits for reduce-scatter `rs`; a reduce-scatter of a transient gradient buffer waited for frees it.
void Lowerer::wait_for_reduce_scatter(Instr& in, int32_t rs) {
  if (std::find(in.waits.begin(), in.waits.end(), rs) == in.waits.end()) in.waits.push_back(rs);
  auto it = std::find(unwaited_reduce_scatters_.begin(), unwaited_reduce_scatters_.end(), rs);
  if (it != unwaited_reduce_scatters_.end()) {
    unwaited_reduce_scatters_.erase(it);
    --grad_buffers_alive_;
  }
}

// Before `in` allocates the transient gradient buffer `gbuf` of bucket gb: at most the region's
// grad_buckets_in_flight such buffers are alive at once, so it waits for the oldest reduce-scatters
// posted (not for ones still to come: their buffers are still being written).
void Lowerer::limit_grad_buffers(Instr& in, int gb, int gbuf) {
  if (!grad_buffers_started_.insert(gbuf).second) return;  // allocated by an earlier instruction
  const int limit = g_.regions[size_t(g_.buckets[size_t(gb)].region)].grad_buckets_in_flight;
  while (grad_buffers_alive_ >= limit && !unwaited_reduce_scatters_.empty())
    wait_for_reduce_scatter(in, unwaited_reduce_scatters_.front());
  ++grad_buffers_alive_;
}

// Gradient buffer a compute node of microbatch `mb` writes for bucket gb.
int Lowerer::grad_target(int gb, int mb) {
  const PlanBucket& pb = plan_bucket(gb);
  if (!pb.shard_grads) return pb.grad_buf;
  int id = keyed_buffer('G', gb, mb, uint64_t(pb.padded) * sizeof(float), BufferKind::Grad,
                        cat("bucket", gb, ".grad.mb", mb));
  p_.buffers[size_t(id)].zero_from = uint64_t(pb.slice_numel()) * sizeof(float);
  return id;
}

int Lowerer::param_source(int gb, size_t op_index) {
  const PlanBucket& pb = plan_bucket(gb);
  if (!pb.shard_params) return pb.param_buf;
  auto it = instance_for_op_.find({op_index, gb});
  PIPER_CHECK(it != instance_for_op_.end(), "no parameter gather for bucket ", gb, " before op ", op_index);
  return it->second;
}

bool Lowerer::on_this_set(int segment) const {
  for (const auto& r : g_.regions)
    if (segment >= r.seg_begin && segment < r.seg_end) return r.device_set == set_;
  return false;
}

// Elements of the activation at `boundary` (the input of that segment): what the segment before it
// writes, at most (a bound where the size varies with routing).
int64_t Lowerer::full_elems(int boundary) const {
  size_t bytes = segment_sizes(segs_[size_t(boundary)], m_.dims, b_).input_bytes;
  if (boundary > 0) bytes = std::max(bytes, segment_sizes(segs_[size_t(boundary) - 1], m_.dims, b_).out_bytes);
  return int64_t((bytes + sizeof(float) - 1) / sizeof(float));
}

int64_t Lowerer::act_elems(int boundary) const {
  return in_parts(boundary) ? full_elems(boundary) / g_.sets[size_t(set_)].tp : full_elems(boundary);
}

// The whole of a boundary held in parts, for one use: 'G' the forward's input, 'H' the backward's (gathered
// again), 'E' the backward's output gradient; 'P' a forward's partial output and 'Q' a backward's partial input
// gradient, each before its reduce-scatter.
int Lowerer::whole_buf(char tag, int boundary, int mb) {
  static const std::map<char, const char*> names{
      {'G', "act%d.mb%d.gathered"}, {'H', "act%d.mb%d.regathered"}, {'E', "dact%d.mb%d.gathered"},
      {'P', "act%d.mb%d.partial"}, {'Q', "dact%d.mb%d.partial"}};
  char name[64];
  std::snprintf(name, sizeof name, names.at(tag), boundary, mb);
  return keyed_buffer(tag, boundary, mb, uint64_t(full_elems(boundary)) * sizeof(float), BufferKind::Activation, name);
}

int Lowerer::act_buf(int boundary, int mb) {
  return keyed_buffer('A', boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                      cat("act", boundary, ".mb", mb));
}

// What an all-to-all delivers at a boundary: 'X' activations, 'Y' their gradients.
int Lowerer::exchanged_buf(char tag, int boundary, int mb) {
  return keyed_buffer(tag, boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                      cat(tag == 'X' ? "act" : "dact", boundary, ".mb", mb, ".exchanged"));
}

int Lowerer::act_grad_buf(int boundary, int mb) {
  return keyed_buffer('D', boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                      cat("dact", boundary, ".mb", mb));
}

// Whether a bf16 run holds the segment's stash in bf16 (ComputeArgs::stash_bf16): a type with a stash layout,
// not recomputed, whose stash no other segment reads.
bool Lowerer::stash_in_bf16(int seg) const {
  const Segment& s = segs_[size_t(seg)];
  if (spec_.job.precision != "bf16" || !s.type->stash_layout || recomputed(seg) || s.type->data != DataSlot::None)
    return false;
  for (size_t o = 0; o < segs_.size(); ++o)
    if (segs_[o].type->link_offset != 0 && int(o) + segs_[o].type->link_offset == seg) return false;
  return true;
}

// And its input with it (kStashHoldsInput), where the input is an activation of its own: not gathered from parts,
// not exchanged rows.
bool Lowerer::input_in_stash(int seg) const {
  return stash_in_bf16(seg) && segs_[size_t(seg)].type->reads_input && !in_parts(seg) &&
         !exchanged(TensorRef::Kind::Act, seg);
}

// How such a stash is held: its pieces, each the type's layout, then the input where input_in_stash.
HeldStash Lowerer::held(int seg) const {
  return held_stash(segs_[size_t(seg)], m_.dims, b_, input_in_stash(seg), p_.held_pieces);
}

// When this set's passes go by pieces: a view may take a twelfth (kHeldViewShare) of one microbatch's held stashes.
HeldPieceRule Lowerer::held_piece_rule() const {
  HeldPieceRule rule;
  rule.min_rows = held_piece_rows(spec_);
  uint64_t held = 0;
  for (size_t s = 0; s < segs_.size(); ++s)
    if (on_this_set(int(s)) && stash_in_bf16(int(s)))
      held += held_stash(segs_[s], m_.dims, b_, input_in_stash(int(s)), rule).held_bytes();  // one piece each
  rule.view_limit = held / kHeldViewShare;
  return rule;
}

// The stash kept from the forward to the backward: all of it, or under selective recompute its kept part; in
// bf16 where stash_in_bf16.
int Lowerer::stash_buf(int seg, int mb) {
  auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
  uint64_t bytes = selective(seg) ? sz.stash_kept_bytes : sz.stash_bytes;
  if (stash_in_bf16(seg)) bytes = held(seg).held_bytes();
  return keyed_buffer('S', seg, mb, bytes, BufferKind::Activation, cat("stash", seg, ".mb", mb));
}

// What a recomputed segment's forward writes and drops: its whole stash (full), or the recomputed part.
int Lowerer::forward_only_stash(int seg, int mb) {
  auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
  const uint64_t bytes = selective(seg) ? sz.stash_bytes - sz.stash_kept_bytes : sz.stash_bytes;
  return keyed_buffer('T', seg, mb, bytes, BufferKind::Activation, cat("stash", seg, ".mb", mb, ".forward"));
}

// Selective recompute: the recomputed part of the stash, from the rerun to the backward weight.
int Lowerer::stash_tail_buf(int seg, int mb) {
  auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
  return keyed_buffer('U', seg, mb, sz.stash_bytes - sz.stash_kept_bytes, BufferKind::Activation,
                      cat("stash", seg, ".mb", mb, ".tail"));
}

// Where a rerun's output goes: the activation it recomputes is still held (the next segment's backward reads it).
int Lowerer::rerun_output(int seg, int mb) {
  return keyed_buffer('O', seg, mb, uint64_t(full_elems(seg + 1)) * sizeof(float), BufferKind::Activation,
                      cat("act", seg + 1, ".mb", mb, ".rerun"));
}

int Lowerer::wstash_buf(int seg, int mb) {
  auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
  return keyed_buffer('W', seg, mb, sz.wstash_bytes, BufferKind::Activation, cat("wstash", seg, ".mb", mb));
}

void Lowerer::make_workspace() {
  uint64_t ws = 0, scratch = 0;
  bool needs_scratch = false;
  const int threads = std::max(1, spec_.job.threads);
  for (const auto& r : g_.regions) {
    if (r.device_set != set_) continue;
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = segs_[size_t(s)];
      ws = std::max<uint64_t>(ws, segment_sizes(seg, m_.dims, b_).workspace_bytes);
      if (seg.type->scratch_floats) {
        needs_scratch = true;
        if (seg.type->scratch_estimate) scratch = std::max(scratch, seg.type->scratch_estimate(m_.dims, b_, threads));
      }
    }
  }
  p_.workspace_buf = new_buffer(std::max<uint64_t>(ws, 4), BufferKind::Workspace, true, "workspace");
  // The backend sizes the scratch at run time; this is the estimate.
  if (needs_scratch) p_.scratch_buf = new_buffer(std::max<uint64_t>(scratch, 4), BufferKind::Workspace, true, "scratch");
}

}  // namespace piper::lowering
