// Lowering: for each device set, walks its node sequence and emits per-segment instructions with their
// buffers — activations per boundary and microbatch, stashes, parameter buckets (full or sharded),
// gradients, optimizer moments — then derives cross-stream waits and buffer uses (the compiler estimates memory
// after simulating every rank's plan).
#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "backend/ragged_rows.hpp"
#include "compile/compile.hpp"
#include "compile/finalize.hpp"
#include "compile/sequence.hpp"
#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "plan/owned_slices.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// What every set's lowering looks up in the whole graph, built once: the edges into and out of each node,
// and per device set its all-to-all exchanges and its prefetched parameter gathers. (Scanning the graph
// once per set made lowering grow with stages × nodes.)
struct GraphIndex {
  std::vector<std::vector<int>> in, out;
  std::vector<std::vector<int>> exchanges, gathers;  // [device set] -> node ids

  explicit GraphIndex(const Graph& g) : in(g.in_edges()), out(g.out_edges()), exchanges(g.sets.size()),
                                        gathers(g.sets.size()) {
    for (const auto& n : g.nodes) {
      if (n.removed || n.device_set < 0 || size_t(n.device_set) >= g.sets.size()) continue;
      if (n.kind == NodeKind::ALL_TO_ALL) exchanges[size_t(n.device_set)].push_back(n.id);
      if (n.gather_for >= 0) gathers[size_t(n.device_set)].push_back(n.id);
    }
  }
};

class Lowerer {
 public:
  Lowerer(const Graph& g, const GraphIndex& index, const std::vector<Segment>& segs, const JobSpec& spec, int set)
      : g_(g), index_(index), m_(*g.model), segs_(segs), spec_(spec), set_(set) {
    n_ = int(g.sets[size_t(set)].ranks.size());
    b_ = g.samples_per_microbatch;
    for (int id : index.exchanges[size_t(set)]) {  // boundaries whose activations (or gradients) are exchanged here
      const Node& n = g.nodes[size_t(id)];
      exchanged_.insert({int(n.tensor.kind), n.tensor.index});
    }
  }

  Plan run(const std::vector<int>& sequence) {
    p_.set = set_;
    p_.held_pieces = held_piece_rule();
    stream_id("compute");
    make_buckets();
    make_workspace();
    plan_segment_ops(sequence);
    plan_early_reductions(sequence);
    plan_receives(sequence);
    size_t next_op = 0;
    size_t compute_index = 0;
    for (int id : sequence) {
      const Node& n = g_.nodes[size_t(id)];
      if (is_compute(n.kind)) {
        // Receives are posted one compute node ahead of their consumer (and not before the compute before them
        // is done): early enough to overlap, late enough to keep each channel in the order the receiver consumes.
        issue_receives(compute_index);
        issue_receives(compute_index + 1);
        ++compute_index;
        while (next_op < ops_.size() && issued_with(ops_[next_op], id)) {
          issue_gathers(next_op);
          if (next_op + 1 < ops_.size()) issue_gathers(next_op + 1);  // prefetch one use ahead
          issue_regather(next_op);
          emit_compute(next_op);
          auto early = early_.find({ops_[next_op].node, ops_[next_op].segment});
          if (early != early_.end())
            for (int c : early->second) emit_node(g_.nodes[size_t(c)]);
          ++next_op;
        }
      } else if (!hoisted_.count(id) && n.kind != NodeKind::RECV) {
        emit_node(n);
      }
    }
    PIPER_CHECK(next_op == ops_.size(), "lowering left compute unissued");
    finalize_plan(p_);
    return std::move(p_);
  }

 private:
  struct SegOp {
    int node;
    int segment;
  };
  // Whether `op` is issued while the sequence is at node `id`: its own ops, and the reruns it interleaves.
  bool issued_with(const SegOp& op, int id) const {
    if (op.node == id) return true;
    auto rerun = rerun_of_.find(id);
    return rerun != rerun_of_.end() && rerun->second == op.node;
  }

  const Graph& g_;
  const GraphIndex& index_;
  const Model& m_;
  const std::vector<Segment>& segs_;          // the model's segments, with their shard counts
  std::set<std::pair<int, int>> exchanged_;   // (tensor kind, boundary) exchanged by an all-to-all
  const JobSpec& spec_;
  int set_;
  int n_;  // replicas in this set
  int b_;  // samples per microbatch
  Plan p_;
  std::map<std::string, int> streams_;
  std::map<std::tuple<char, int, int>, int> keyed_;
  std::map<int, int> bucket_index_;     // graph bucket → plan bucket
  std::vector<SegOp> ops_;
  std::map<std::pair<int, int>, int> gather_node_;  // (compute node, graph bucket) → gather node
  std::map<int, int> gathers_of_;                   // R node → the backward node whose gathers it uses
  // compute node → a gather of a boundary held in parts that it reads, issued just before it: the backward's input
  // again, or a received part
  std::multimap<int, int> regather_;
  std::set<int> regathered_;                        // those issued
  std::map<int, int> rerun_of_;                     // backward node → its R node (whose ops sit among its own)
  struct Gathered {
    int buf;       // instance holding the bucket's full parameters
    size_t last;   // last segment op using it so far
  };
  std::map<int, Gathered> gathered_;                      // graph bucket → its current instance
  std::map<std::pair<size_t, int>, int> instance_for_op_;  // (segment op, graph bucket) → instance
  int gather_target_ = -1;                                // instance the next emitted gather fills
  std::set<std::pair<int, int>> grad_written_;      // (gradient buffer, model param)
  std::set<int> shard_written_;                     // gradient shard buffers written this step
  std::map<std::pair<int, int>, std::vector<int>> early_;  // (compute node, segment) → reductions issued after it
  std::set<int> hoisted_;                                  // reductions issued early
  int32_t last_compute_ = -1;                              // index of the last compute instruction
  std::map<size_t, std::vector<int>> receives_for_;        // consumer's compute position → receives
  std::map<int, int32_t> last_reduce_scatter_;             // graph bucket → its latest reduce-scatter
  // Full-gradient buffers of one microbatch (ZeRO 2 and 3) come and go: allocated by the first backward
  // that writes them, freed when their reduce-scatter completes. `grad_buffers_alive_` counts those
  // allocated and not yet known to be freed; `unwaited_reduce_scatters_` holds, oldest first, the posted
  // reduce-scatters of such buffers that no instruction has waited for yet.
  std::set<int> grad_buffers_started_;
  int grad_buffers_alive_ = 0;
  std::deque<int32_t> unwaited_reduce_scatters_;

  int stream_id(const std::string& name) {
    auto it = streams_.find(name);
    if (it != streams_.end()) return it->second;
    int id = int(p_.streams.size());
    p_.streams.push_back(name);
    streams_[name] = id;
    return id;
  }

  int group_id(const GroupRef& ref) {
    for (size_t i = 0; i < p_.groups.size(); ++i)
      if (p_.groups[i] == ref) return int(i);
    p_.groups.push_back(ref);
    return int(p_.groups.size()) - 1;
  }

  int new_buffer(uint64_t bytes, BufferKind kind, bool persistent, std::string name) {
    PlanBuffer b;
    b.bytes = bytes;
    b.kind = kind;
    b.persistent = persistent;
    b.name = std::move(name);
    p_.buffers.push_back(std::move(b));
    return int(p_.buffers.size()) - 1;
  }

  int keyed_buffer(char tag, int a, int b, uint64_t bytes, BufferKind kind, const std::string& name) {
    auto key = std::make_tuple(tag, a, b);
    auto it = keyed_.find(key);
    if (it != keyed_.end()) return it->second;
    int id = new_buffer(bytes, kind, false, name);
    keyed_[key] = id;
    return id;
  }

  // ---------------------------------------------------------------- buckets and parameters
  // Ranks of an expert group over which a sharded region's buckets are sliced (1: not sliced).
  int slices_of(const Region& r) const { return r.shard_directive >= 0 ? r.shard_group : 1; }
  // Replicated: more than one rank holds the same parameters (the set, or the copies of one slice).
  bool replicated(const Bucket& b) const {
    const Region& r = g_.regions[size_t(b.region)];
    return r.zero >= 0 && bucket_copies(g_, b) > 1;
  }
  // How segment `seg` of a tensor-parallel group holds model parameter `param`.
  ParamSplit split_of(int param, const Region& r) const {
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = segs_[size_t(s)];
      for (size_t slot = 0; slot < seg.params.size(); ++slot)
        if (seg.params[slot] == param && seg.shards > 1 && seg.type->tp_split)
          return seg.type->tp_split(m_.dims, int(slot), seg.shards);
    }
    return ParamSplit::copy();
  }
  // The group of a bucket's replicas: the whole set, or the replicas holding the same slice.
  GroupRef replica_group(const PlanBucket& pb, const std::string& stream) const {
    if (pb.slices > 1) return {GroupRef::Kind::SetStride, {set_, pb.slices}, stream};
    return {GroupRef::Kind::DeviceSet, {set_}, stream};
  }

  void make_buckets() {
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

  int graph_bucket_of_param(int param) const {
    for (const auto& [gb, pbi] : bucket_index_)
      for (int q : g_.buckets[size_t(gb)].params)
        if (q == param) return gb;
    PIPER_CHECK(false, "parameter ", m_.params[size_t(param)].name, " has no bucket on set ", set_);
    return -1;
  }

  const PlanBucket& plan_bucket(int gb) const {
    auto it = bucket_index_.find(gb);
    PIPER_CHECK(it != bucket_index_.end(), "bucket ", gb, " is not on set ", set_);
    return p_.buckets[size_t(it->second)];
  }

  int64_t shard_count(const PlanBucket& pb) const { return shard_elements(pb); }

  // `in` waits for reduce-scatter `rs`; a reduce-scatter of a transient gradient buffer waited for frees it.
  void wait_for_reduce_scatter(Instr& in, int32_t rs) {
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
  void limit_grad_buffers(Instr& in, int gb, int gbuf) {
    if (!grad_buffers_started_.insert(gbuf).second) return;  // allocated by an earlier instruction
    const int limit = g_.regions[size_t(g_.buckets[size_t(gb)].region)].grad_buckets_in_flight;
    while (grad_buffers_alive_ >= limit && !unwaited_reduce_scatters_.empty())
      wait_for_reduce_scatter(in, unwaited_reduce_scatters_.front());
    ++grad_buffers_alive_;
  }

  // Gradient buffer a compute node of microbatch `mb` writes for bucket gb.
  int grad_target(int gb, int mb) {
    const PlanBucket& pb = plan_bucket(gb);
    if (!pb.shard_grads) return pb.grad_buf;
    int id = keyed_buffer('G', gb, mb, uint64_t(pb.padded) * sizeof(float), BufferKind::Grad,
                          cat("bucket", gb, ".grad.mb", mb));
    p_.buffers[size_t(id)].zero_from = uint64_t(pb.slice_numel()) * sizeof(float);
    return id;
  }

  int param_source(int gb, size_t op_index) {
    const PlanBucket& pb = plan_bucket(gb);
    if (!pb.shard_params) return pb.param_buf;
    auto it = instance_for_op_.find({op_index, gb});
    PIPER_CHECK(it != instance_for_op_.end(), "no parameter gather for bucket ", gb, " before op ", op_index);
    return it->second;
  }

  // ---------------------------------------------------------------- activations
  bool on_this_set(int segment) const {
    for (const auto& r : g_.regions)
      if (segment >= r.seg_begin && segment < r.seg_end) return r.device_set == set_;
    return false;
  }
  // Elements of the activation at `boundary` (the input of that segment): what the segment before it
  // writes, at most (a bound where the size varies with routing).
  int64_t full_elems(int boundary) const {
    size_t bytes = segment_sizes(segs_[size_t(boundary)], m_.dims, b_).input_bytes;
    if (boundary > 0) bytes = std::max(bytes, segment_sizes(segs_[size_t(boundary) - 1], m_.dims, b_).out_bytes);
    return int64_t((bytes + sizeof(float) - 1) / sizeof(float));
  }
  // Sequence parallelism holds a boundary in parts: a rank of a tensor-parallel group holds its rows.
  bool in_parts(int boundary) const { return g_.in_parts(boundary); }
  int64_t act_elems(int boundary) const {
    return in_parts(boundary) ? full_elems(boundary) / g_.sets[size_t(set_)].tp : full_elems(boundary);
  }
  // The whole of a boundary held in parts, for one use: 'G' the forward's input, 'H' the backward's (gathered
  // again), 'E' the backward's output gradient; 'P' a forward's partial output and 'Q' a backward's partial input
  // gradient, each before its reduce-scatter.
  int whole_buf(char tag, int boundary, int mb) {
    static const std::map<char, const char*> names{
        {'G', "act%d.mb%d.gathered"}, {'H', "act%d.mb%d.regathered"}, {'E', "dact%d.mb%d.gathered"},
        {'P', "act%d.mb%d.partial"}, {'Q', "dact%d.mb%d.partial"}};
    char name[64];
    std::snprintf(name, sizeof name, names.at(tag), boundary, mb);
    return keyed_buffer(tag, boundary, mb, uint64_t(full_elems(boundary)) * sizeof(float), BufferKind::Activation, name);
  }
  int act_buf(int boundary, int mb) {
    return keyed_buffer('A', boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                        cat("act", boundary, ".mb", mb));
  }
  bool exchanged(TensorRef::Kind kind, int boundary) const { return exchanged_.count({int(kind), boundary}) > 0; }
  // What an all-to-all delivers at a boundary: 'X' activations, 'Y' their gradients.
  int exchanged_buf(char tag, int boundary, int mb) {
    return keyed_buffer(tag, boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                        cat(tag == 'X' ? "act" : "dact", boundary, ".mb", mb, ".exchanged"));
  }
  int act_grad_buf(int boundary, int mb) {
    return keyed_buffer('D', boundary, mb, uint64_t(act_elems(boundary)) * sizeof(float), BufferKind::Activation,
                        cat("dact", boundary, ".mb", mb));
  }
  // Whether a bf16 run holds the segment's stash in bf16 (ComputeArgs::stash_bf16): a type with a stash layout,
  // not recomputed, whose stash no other segment reads.
  bool stash_in_bf16(int seg) const {
    const Segment& s = segs_[size_t(seg)];
    if (spec_.job.precision != "bf16" || !s.type->stash_layout || recomputed(seg) || s.type->data != DataSlot::None)
      return false;
    for (size_t o = 0; o < segs_.size(); ++o)
      if (segs_[o].type->link_offset != 0 && int(o) + segs_[o].type->link_offset == seg) return false;
    return true;
  }
  // And its input with it (kStashHoldsInput), where the input is an activation of its own: not gathered from parts,
  // not exchanged rows.
  bool input_in_stash(int seg) const {
    return stash_in_bf16(seg) && segs_[size_t(seg)].type->reads_input && !in_parts(seg) &&
           !exchanged(TensorRef::Kind::Act, seg);
  }
  // How such a stash is held: its pieces, each the type's layout, then the input where input_in_stash.
  HeldStash held(int seg) const {
    return held_stash(segs_[size_t(seg)], m_.dims, b_, input_in_stash(seg), p_.held_pieces);
  }
  // When this set's passes go by pieces: a view may take a twelfth (kHeldViewShare) of one microbatch's held stashes.
  HeldPieceRule held_piece_rule() const {
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
  int stash_buf(int seg, int mb) {
    auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
    uint64_t bytes = selective(seg) ? sz.stash_kept_bytes : sz.stash_bytes;
    if (stash_in_bf16(seg)) bytes = held(seg).held_bytes();
    return keyed_buffer('S', seg, mb, bytes, BufferKind::Activation, cat("stash", seg, ".mb", mb));
  }
  bool recomputed(int seg) const { return g_.segment_recompute[size_t(seg)] != 0; }
  bool selective(int seg) const { return g_.segment_recompute[size_t(seg)] == kRecomputeSelective; }
  // What a recomputed segment's forward writes and drops: its whole stash (full), or the recomputed part.
  int forward_only_stash(int seg, int mb) {
    auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
    const uint64_t bytes = selective(seg) ? sz.stash_bytes - sz.stash_kept_bytes : sz.stash_bytes;
    return keyed_buffer('T', seg, mb, bytes, BufferKind::Activation, cat("stash", seg, ".mb", mb, ".forward"));
  }
  // Selective recompute: the recomputed part of the stash, from the rerun to the backward weight.
  int stash_tail_buf(int seg, int mb) {
    auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
    return keyed_buffer('U', seg, mb, sz.stash_bytes - sz.stash_kept_bytes, BufferKind::Activation,
                        cat("stash", seg, ".mb", mb, ".tail"));
  }
  // Where a rerun's output goes: the activation it recomputes is still held (the next segment's backward reads it).
  int rerun_output(int seg, int mb) {
    return keyed_buffer('O', seg, mb, uint64_t(full_elems(seg + 1)) * sizeof(float), BufferKind::Activation,
                        cat("act", seg + 1, ".mb", mb, ".rerun"));
  }
  int wstash_buf(int seg, int mb) {
    auto sz = segment_sizes(segs_[size_t(seg)], m_.dims, b_);
    return keyed_buffer('W', seg, mb, sz.wstash_bytes, BufferKind::Activation, cat("wstash", seg, ".mb", mb));
  }

  void make_workspace() {
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

  // ---------------------------------------------------------------- compute
  bool reads_data(const Segment& s) const { return !s.type->reads_input; }
  bool is_head(const Segment& s) const { return s.type->computes_loss; }

  void plan_segment_ops(const std::vector<int>& sequence) {
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
  void plan_early_reductions(const std::vector<int>& sequence) {
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
  void plan_receives(const std::vector<int>& sequence) {
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
  void issue_receives(size_t compute_index) {
    auto it = receives_for_.find(compute_index);
    if (it == receives_for_.end()) return;
    for (int id : it->second) emit_node(g_.nodes[size_t(id)], last_compute_);
    receives_for_.erase(it);
  }

  // Sharded buckets the segment op needs: gathered (on the gather stream) ahead of the op, one gather per
  // run of consecutive ops using the bucket — the forward-to-backward turn keeps its copy, a bucket used
  // again later (the tied embedding at the head) is gathered again rather than held in between.
  void issue_gathers(size_t op_index) {
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
  void issue_regather(size_t op_index) {
    const SegOp& op = ops_[op_index];
    auto owner = gathers_of_.find(op.node);
    const int reader = owner != gathers_of_.end() ? owner->second : op.node;
    for (auto [it, end] = regather_.equal_range(reader); it != end; ++it)
      if (regathered_.insert(it->second).second) emit_node(g_.nodes[size_t(it->second)], last_compute_);
  }

  bool segment_uses(const SegOp& op, int gb) const {
    for (int param : segs_[size_t(op.segment)].params)
      if (graph_bucket_of_param(param) == gb) return true;
    return false;
  }

  static Op compute_op(NodeKind kind) {
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

  void emit_compute(size_t op_index) {
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
  void emit_read_counts(const Node& n, int segment, int mb) {
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

  // ---------------------------------------------------------------- everything else
  static Op comm_op(const Node& n) {
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

  void emit_node(const Node& n, int32_t after = -1) {
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

  void emit_all_reduce(const Node& n, CollectiveArgs& in) {
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
  void wire_in_bf16(const Node& n, CollectiveArgs& in, uint64_t values) {
    if (spec_.job.grad_reduce != "bf16") return;
    in.flags |= kFlagBf16Wire;
    in.wire = new_buffer(values * sizeof(uint16_t), BufferKind::Comm, false,
                         cat("bucket", n.bucket, n.mb >= 0 ? cat(".mb", n.mb) : std::string(), ".bf16_wire"));
  }

  void emit_reduce_scatter(const Node& n, CollectiveArgs& in) {
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
  void emit_all_to_all(const Node& n, AllToAllArgs& in) {
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

  void emit_all_gather(const Node& n, CollectiveArgs& in) {
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
  Span owned_grads(const PlanBucket& pb) const {
    if (pb.zero < 0) return Span{pb.grad_buf, 0, pb.padded, false};
    if (pb.shard_grads) return Span{pb.grad_shard_buf, 0, shard_count(pb), false};
    return Span{pb.grad_buf, 0, shard_count(pb), true, pb.slices};
  }

  void emit_tie(const Node& n, Instr& instr) {
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

  void emit_step_sync(Instr& instr) {
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

  void emit_updates(const Node& n) {
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
};

}  // namespace

std::vector<Plan> lower(const Graph& g, const JobSpec& spec) {
  auto sequences = set_sequences(g);
  const GraphIndex index(g);
  std::vector<Segment> segs = g.model->segments;
  for (size_t i = 0; i < segs.size(); ++i) segs[i].shards = g.segment_shards[i];
  std::vector<Plan> bodies;
  for (size_t s = 0; s < g.sets.size(); ++s) {
    Lowerer l(g, index, segs, spec, int(s));
    Plan p = l.run(sequences[s]);
    fill_job_fields(p, spec, g);
    bodies.push_back(std::move(p));
  }
  // Every plan carries the full group table, in one order, for communicator creation.
  std::vector<GroupRef> all;
  for (const auto& b : bodies)
    for (const auto& gr : b.groups)
      if (std::find(all.begin(), all.end(), gr) == all.end()) all.push_back(gr);
  std::sort(all.begin(), all.end());
  for (auto& b : bodies) b.all_groups = all;
  return bodies;
}

}  // namespace piper
