// The plan check (check_plan in plan.hpp): what a rank reads must be a plan the executor can run without
// reading or writing outside a buffer — indices in range, counts consistent, the model its dimensions build.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <type_traits>
#include <variant>

#include "model/family.hpp"
#include "model/segment_type.hpp"
#include "plan/owned_slices.hpp"
#include "plan/plan.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

using u128 = unsigned __int128;

class PlanCheck {
 public:
  explicit PlanCheck(const Plan& p) : p_(p) {}

  void run() {
    job_fields();
    model();
    layout();
    buffers_and_buckets();
    instructions();
  }

 private:
  const Plan& p_;
  std::string where_;   // the part being checked, for messages
  int64_t replicas_ = 1;  // ranks of this plan's device set: the binding may pick any of them
  std::vector<int32_t> slot_;  // model parameter → plan parameter, or -1
  std::map<int32_t, int32_t> counts_on_host_;  // ragged buffers whose counts earlier instructions bring to the host

  template <typename... Args>
  void require(bool ok, const Args&... what) const {
    if (!ok) throw SystemError(cat("corrupt plan: ", where_, where_.empty() ? "" : ": ", what...));
  }
  // An index into a table of n entries.
  void index(int64_t i, size_t n, const char* what) const {
    require(i >= 0 && uint64_t(i) < n, what, " ", i, " out of range (", n, " in the plan)");
  }
  bool in_range(int64_t i, size_t n) const { return i >= 0 && uint64_t(i) < n; }

  // ---------------------------------------------------------------- job-wide fields
  void job_fields() {
    where_ = "job";
    require(p_.steps >= 0 && p_.log_every >= 1 && p_.max_skipped >= 0 && p_.checkpoint_every >= 0 &&
                p_.checkpoint_keep >= 0 && p_.threads >= 0 && p_.threads <= 1024,
            "steps, log_every, max_skipped, checkpoint or threads out of range");
    require(p_.precision == Precision::Fp32 || p_.precision == Precision::Bf16, "precision out of range");
    require(p_.held_pieces.min_rows >= 1 && p_.held_pieces.min_rows <= (int64_t(1) << 40), "held_pieces out of range");
  require(std::isfinite(p_.watchdog_s) && p_.watchdog_s >= 0 && p_.watchdog_s <= 1e9, "watchdog_s out of range");
  require(std::isfinite(p_.peak_tflops) && p_.peak_tflops >= 0 && p_.peak_tflops <= 1e6, "peak_tflops out of range");
    const OptimizerConfig& o = p_.optimizer;
    auto in = [](double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x <= hi; };
    require(o.kind == "adamw" && in(o.lr, 0, 10) && o.lr > 0 && in(o.min_lr, 0, o.lr) && in(o.beta1, 0, 1) &&
                in(o.beta2, 0, 1) && in(o.eps, 0, 1) && o.eps > 0 && in(o.weight_decay, 0, 10) &&
                in(o.grad_clip, 0, INFINITY) && o.warmup_steps >= 0 && o.decay_steps >= 0 &&
                uint8_t(o.schedule) <= uint8_t(LrSchedule::Wsd) && in(o.decay_fraction, 0, 1),
            "optimizer settings out of range");
    const DataConfig& d = p_.data;
    require(d.kind == DataConfig::Kind::Tokens || d.kind == DataConfig::Kind::Synthetic, "unknown data kind");
    require(d.batch >= 1 && (d.token_bytes == 0 || d.token_bytes == 1 || d.token_bytes == 2 || d.token_bytes == 4),
            "data batch or token width out of range");
    require(d.vocab == p_.dims.vocab && d.seq_len == p_.dims.seq_len && d.d_in == p_.dims.d_in &&
                d.n_classes == p_.dims.n_classes,
            "data settings differ from the model's");
    const DataConfig& e = p_.eval_data;
    require(p_.eval_every >= 0 && p_.eval_batches >= 0 && (p_.eval_every == 0) == (p_.eval_batches == 0),
            "eval every or batches out of range");
    require(p_.eval_every == 0 || (e.kind == DataConfig::Kind::Tokens && d.kind == DataConfig::Kind::Tokens &&
                                   e.batch == d.batch && e.vocab == d.vocab && e.seq_len == d.seq_len &&
                                   (e.token_bytes == 0 || e.token_bytes == 1 || e.token_bytes == 2 ||
                                    e.token_bytes == 4)),
            "eval data settings differ from the training data's");
  }

  // ---------------------------------------------------------------- model
  // The parameters and segments must be exactly what the family builds from the plan's dimensions, and
  // those dimensions what its job-file keys accept: the kernels size everything from the dimensions.
  void model() {
    where_ = "model";
    require(!p_.segments.empty(), "no segments");
    const Family* family = nullptr;
    for (const Family* f : families())
      if (std::find(f->segment_types.begin(), f->segment_types.end(), p_.segments[0].type) != f->segment_types.end())
        family = f;
    require(family != nullptr, "segment 0 has no segment type");
    require((p_.data.kind == DataConfig::Kind::Tokens) == family->reads_tokens,
            "data kind does not suit model family ", family->kind);
    const ModelDims& d = p_.dims;
    if (std::optional<KeyProblem> problem = check_model_keys(family->keys, d))
      require(false, "dimensions a job file could not have: ", problem->message);
    Model built;
    try {
      const ParamBudget budget(p_.params.size());  // a model with more parameters is not this plan's
      built = family->build(spec_from_keys(family->keys, family->kind, d));
    } catch (const UserError& e) {
      require(false, "dimensions a job file could not have: ", e.what());
    }
    require(d.bf16_matmul_inputs == (p_.precision == Precision::Bf16),
            "activations for matmuls held in ", d.bf16_matmul_inputs ? "bf16" : "fp32", " in a ",
            precision_name(p_.precision), " plan");
    built.dims.bf16_matmul_inputs = d.bf16_matmul_inputs;
    require(built.dims == d, "dimensions differ from what model.kind = \"", family->kind, "\" derives from them");
    require(built.params == p_.params, "parameters differ from what the model's dimensions give");
    require(built.segments.size() == p_.segments.size(), "segments differ from what the model's dimensions give");
    for (size_t i = 0; i < p_.segments.size(); ++i) {
      const Segment &a = p_.segments[i], &b = built.segments[i];
      require(a.type == b.type && a.name == b.name && a.layer == b.layer && a.params == b.params &&
                  a.fwd_flops_per_sample == b.fwd_flops_per_sample && a.tail_flops_per_sample == b.tail_flops_per_sample,
              "segment ", i, " differs from what the model's dimensions give");
      if (a.type->tp_split && a.shards > 1) {  // a tensor-parallel group's part
        const std::string why = a.type->tp_refusal ? a.type->tp_refusal(d, a.shards) : std::string();
        require(why.empty(), "segment ", i, " split over ", a.shards, " ranks: ", why);
        continue;
      }
      const int units = a.type->shard_units ? a.type->shard_units(d) : 1;
      require(a.shards >= 1 && units % a.shards == 0, "segment ", i, " in ", a.shards, " shards of ", units, " units");
    }
  }

  // ---------------------------------------------------------------- ranks, sets, groups, streams
  int64_t group_size(const GroupRef& g) const {
    switch (g.kind) {
      case GroupRef::Kind::World: return p_.world;
      case GroupRef::Kind::DeviceSet: return int64_t(p_.sets[size_t(g.sets[0])].size());
      case GroupRef::Kind::AcrossSets: return int64_t(g.sets.size());
      case GroupRef::Kind::SetBlock: return g.sets[1];
      case GroupRef::Kind::SetStride: return int64_t(p_.sets[size_t(g.sets[0])].size()) / g.sets[1];
    }
    return 0;
  }

  void group(const GroupRef& g) {
    switch (g.kind) {
      case GroupRef::Kind::World: require(g.sets.empty(), "a world group names sets"); break;
      case GroupRef::Kind::DeviceSet:
        require(g.sets.size() == 1, "a device-set group names ", g.sets.size(), " sets");
        index(g.sets[0], p_.sets.size(), "device set");
        break;
      case GroupRef::Kind::AcrossSets: {
        require(!g.sets.empty(), "a group across sets names none");
        std::set<int32_t> seen;
        for (int32_t s : g.sets) {
          index(s, p_.sets.size(), "device set");
          require(seen.insert(s).second, "a group names device set ", s, " twice");
          // one member per set, at the same replica index in each
          require(p_.sets[size_t(s)].size() == p_.sets[size_t(g.sets[0])].size(),
                  "a group across sets of different sizes");
        }
        break;
      }
      case GroupRef::Kind::SetBlock:
      case GroupRef::Kind::SetStride: {
        require(g.sets.size() == 2, "a block or stride group names ", g.sets.size(), " numbers, not {set, k}");
        index(g.sets[0], p_.sets.size(), "device set");
        const int64_t n = int64_t(p_.sets[size_t(g.sets[0])].size());
        require(g.sets[1] >= 1 && g.sets[1] <= n && n % g.sets[1] == 0, "blocks of ", g.sets[1], " in a set of ", n);
        break;
      }
      default: require(false, "unknown group kind ", int(g.kind));
    }
  }

  bool has_this_set(const GroupRef& g) const {
    if (g.kind == GroupRef::Kind::World) return true;
    if (g.kind == GroupRef::Kind::SetBlock || g.kind == GroupRef::Kind::SetStride) return g.sets[0] == p_.set;
    return std::find(g.sets.begin(), g.sets.end(), p_.set) != g.sets.end();
  }

  void layout() {
    where_ = "layout";
    require(p_.world >= 1 && p_.world <= (1 << 24), "world of ", p_.world, " ranks");
    require(!p_.sets.empty(), "no device sets");
    std::vector<uint8_t> seen(size_t(p_.world), 0);
    for (size_t s = 0; s < p_.sets.size(); ++s) {
      require(!p_.sets[s].empty(), "device set ", s, " is empty");
      for (int32_t r : p_.sets[s]) {
        index(r, size_t(p_.world), "rank");
        require(!seen[size_t(r)], "rank ", r, " is in two device sets");
        seen[size_t(r)] = 1;
      }
    }
    index(p_.set, p_.sets.size(), "device set");
    replicas_ = int64_t(p_.sets[size_t(p_.set)].size());
    index(p_.rank, size_t(p_.world), "rank");
    index(p_.replica, size_t(replicas_), "replica");
    require(p_.microbatches >= 1 && p_.samples_per_replica >= 1, "microbatches or samples per replica below 1");
    require(p_.data_sharing >= 1 && p_.data_sharing <= p_.world, "replicas sharing samples: ", p_.data_sharing);
    for (const auto& set : p_.sets)
      require(set.size() % size_t(p_.data_sharing) == 0, "a set of ", set.size(), " ranks in blocks of ", p_.data_sharing,
              " sharing samples");
    for (size_t i = 0; i < p_.all_groups.size(); ++i) {
      where_ = cat("group ", i, " of the job");
      group(p_.all_groups[i]);
    }
    for (size_t i = 0; i < p_.groups.size(); ++i) {
      where_ = cat("group ", i);
      group(p_.groups[i]);
      require(has_this_set(p_.groups[i]), "a group this device set uses does not hold it");
      require(std::find(p_.all_groups.begin(), p_.all_groups.end(), p_.groups[i]) != p_.all_groups.end(),
              "a group missing from the job's groups");
    }
    where_ = "layout";
    require(p_.streams.size() <= 256, p_.streams.size(), " streams");
    require(p_.instrs.empty() || !p_.streams.empty(), "instructions but no stream");
  }

  // ---------------------------------------------------------------- buffers, buckets, parameters
  // Buffer `b` holds floats [first + shard_of × max replica, ... + count) for every replica of the set.
  // Floats [first, first + count) of buffer b, or with per_replica the range of every replica among those
  // holding the same slice of a bucket of `slices` (replica / slices moves it by count).
  void floats(int32_t b, int64_t first, int64_t count, bool per_replica, const char* role, int32_t slices = 1) const {
    index(b, p_.buffers.size(), role);
    require(first >= 0 && count >= 0, role, " range ", first, "+", count, " is negative");
    require(slices >= 1 && replicas_ % slices == 0, role, ": ", slices, " slices in a set of ", replicas_);
    const int64_t positions = replicas_ / slices;
    const u128 end = u128(uint64_t(first)) + (per_replica ? u128(uint64_t(positions - 1)) * uint64_t(count) : 0) +
                     u128(uint64_t(count));
    require(end * sizeof(float) <= p_.buffers[size_t(b)].bytes, role, " buffer ", b, " (",
            p_.buffers[size_t(b)].bytes, " bytes) is too small for floats ", first, "+", count,
            per_replica ? " per replica" : "");
  }
  void bytes(int32_t b, uint64_t need, const char* role) const {
    index(b, p_.buffers.size(), role);
    require(p_.buffers[size_t(b)].bytes >= need, role, " buffer ", b, " holds ", p_.buffers[size_t(b)].bytes,
            " bytes, needs ", need);
  }

  void buffers_and_buckets() {
    for (size_t i = 0; i < p_.buffers.size(); ++i) {
      where_ = cat("buffer ", i);
      require(int(p_.buffers[i].kind) < kBufferKinds, "unknown kind ", int(p_.buffers[i].kind));
    }
    where_ = "buffers";
    if (p_.workspace_buf >= 0 || !p_.instrs.empty()) {
      index(p_.workspace_buf, p_.buffers.size(), "workspace buffer");
      require(p_.buffers[size_t(p_.workspace_buf)].persistent, "the workspace is not persistent");
    }
    if (p_.scratch_buf != -1) {
      index(p_.scratch_buf, p_.buffers.size(), "scratch buffer");
      require(p_.buffers[size_t(p_.scratch_buf)].persistent, "the scratch is not persistent");
    }
    for (size_t i = 0; i < p_.buckets.size(); ++i) {
      where_ = cat("bucket ", i);
      const PlanBucket& b = p_.buckets[i];
      require(b.slices >= 1 && b.slices <= replicas_ && replicas_ % b.slices == 0 && b.numel >= 0 &&
                  b.numel % b.slices == 0,
              b.slices, " slices of ", b.numel, " parameters in a set of ", replicas_);
      require(b.padded >= b.slice_numel() && b.group_size >= 1 && b.padded % b.group_size == 0 && b.zero >= -1 &&
                  b.zero <= 3,
              "sizes out of range");
      require(b.group == -1 || in_range(b.group, p_.groups.size()), "group ", b.group, " out of range");
      if (b.group >= 0) require(group_size(p_.groups[size_t(b.group)]) == b.group_size, "group size differs");
      require(b.group_size == 1 || b.group_size * b.slices == replicas_, "group of ", b.group_size, " of ", b.slices,
              " slices in a set of ", replicas_);
      const int64_t shard = shard_elements(b);
      floats(b.shard_params ? b.param_shard_buf : b.param_buf, 0, b.shard_params ? shard : b.padded, false,
             "parameter");
      floats(b.shard_grads ? b.grad_shard_buf : b.grad_buf, 0, b.shard_grads ? shard : b.padded, false, "gradient");
      floats(b.m_buf, 0, b.shard_optimizer ? shard : b.padded, false, "first moment");
      floats(b.v_buf, 0, b.shard_optimizer ? shard : b.padded, false, "second moment");
    }
    slot_.assign(p_.params.size(), -1);
    for (size_t i = 0; i < p_.plan_params.size(); ++i) {
      where_ = cat("plan parameter ", i);
      const PlanParam& pp = p_.plan_params[i];
      index(pp.model_param, p_.params.size(), "model parameter");
      index(pp.bucket, p_.buckets.size(), "bucket");
      const PlanBucket& pb = p_.buckets[size_t(pp.bucket)];
      // a parameter is placed once, or once per piece (each in its slice, cut the same way)
      const int64_t whole = p_.params[size_t(pp.model_param)].numel;
      if (pp.piece < 0) {
        require(slot_[size_t(pp.model_param)] < 0, "model parameter ", pp.model_param, " placed twice");
      } else {
        require(pb.slices > 1 && pp.piece < pb.slices && pp.split_outer > 0 && pp.split_inner > 0 &&
                    pp.split_outer <= whole && pp.split_inner <= whole / pp.split_outer &&
                    pp.split_outer * pp.split_inner * pb.slices == whole && pb.slice_numel() > 0 &&
                    pp.offset / pb.slice_numel() == pp.piece,
                "piece ", pp.piece, " (", pp.split_outer, " x ", pp.split_inner, ") of parameter ", pp.model_param,
                " does not cut its ", whole, " elements into the bucket's ", pb.slices, " slices");
        const int32_t first = slot_[size_t(pp.model_param)];
        require(first < 0 || (p_.plan_params[size_t(first)].piece >= 0 &&
                              pp.offset % pb.slice_numel() == p_.plan_params[size_t(first)].offset % pb.slice_numel()),
                "model parameter ", pp.model_param, " placed twice");
      }
      if (slot_[size_t(pp.model_param)] < 0) slot_[size_t(pp.model_param)] = int32_t(i);
      // inside the bucket, or inside one slice of a sliced bucket
      const int64_t numel = pp.piece < 0 ? whole : whole / pb.slices;
      const int64_t span = pb.slices > 1 ? pb.slice_numel() : pb.padded;
      const int64_t at = pb.slices > 1 && span > 0 ? pp.offset % span : pp.offset;
      require(pp.offset >= 0 && numel >= 0 && numel <= span && at <= span - numel &&
                  (pb.slices == 1 || pp.offset < pb.numel),
              "parameter range ", pp.offset, "+", numel, " outside its bucket (or slice) of ", span);
    }
  }

  // ---------------------------------------------------------------- instructions
  // A parameter (or its gradient) of segment parameter i read through buffer b at the bucket offset; of a
  // sliced bucket only the replicas holding its slice have it, at the offset within the slice.
  void param_range(int32_t b, const PlanParam& pp, const char* role) const {
    const PlanBucket& pb = p_.buckets[size_t(pp.bucket)];
    const int64_t numel = pp.piece < 0 ? p_.params[size_t(pp.model_param)].numel
                                       : p_.params[size_t(pp.model_param)].numel / pb.slices;
    if (pb.slices == 1) return floats(b, pp.offset, numel, false, role);
    if (pb.slice_numel() > 0) floats(b, pp.offset % pb.slice_numel(), numel, false, role);
  }

  void compute(const Instr& instr, const ComputeArgs& in) {
    const Op op = instr.op;
    index(in.segment, p_.segments.size(), "segment");
    const Segment& seg = p_.segments[size_t(in.segment)];
    const SegmentType& type = *seg.type;
    const bool fwd = op == Op::Forward || op == Op::Recompute;
    const bool bwd_input = op == Op::Backward || op == Op::BackwardInput;
    const bool bwd_weight = op == Op::BackwardWeight;
    const bool writes_grads = op == Op::Backward || bwd_weight;
    require(in.samples >= 1 && in.sample_offset >= 0 && int64_t(in.sample_offset) + in.samples <= p_.samples_per_replica,
            "samples ", in.sample_offset, "+", in.samples, " outside the replica's ", p_.samples_per_replica);
    require(std::isfinite(in.loss_scale), "loss scale is not finite");
    require(in.stash_bf16 == 0 || in.stash_bf16 == kStashBf16 || in.stash_bf16 == (kStashBf16 | kStashHoldsInput),
            "stash_bf16 is ", int(in.stash_bf16));
    require(in.alike_block >= 1 && in.alike_block <= p_.data_sharing &&
                p_.data_sharing % in.alike_block == 0,
            "alike in blocks of ", in.alike_block, " replicas, of ", p_.data_sharing, " sharing samples");
    // The executor dereferences every buffer field set; those the instruction does not declare would
    // escape its waits and use counts.
    if (fwd) require(in.dout == -1 && in.din == -1, "a forward with gradient buffers");
    if (!fwd) require(in.out == -1, "a backward with an output buffer");
    if (bwd_weight) require(in.din == -1, "a weight backward with an input-gradient buffer");
    const size_t np = seg.params.size();
    require(in.pbuf.size() == np && in.gbuf.size() == np && (in.overwrite.empty() || in.overwrite.size() == np),
            "parameter lists of ", in.pbuf.size(), ", ", in.gbuf.size(), " and ", in.overwrite.size(),
            " entries for a segment of ", np);
    for (size_t i = 0; i < np; ++i) {
      const int32_t slot = slot_[size_t(seg.params[i])];
      require(slot >= 0, "segment parameter ", i, " is not on this device set");
      const PlanParam& pp = p_.plan_params[size_t(slot)];
      if (bwd_weight) require(in.pbuf[i] == -1, "a weight backward reads parameters");
      else param_range(in.pbuf[i], pp, "parameter");
      if (writes_grads) param_range(in.gbuf[i], pp, "gradient");
      else require(in.gbuf[i] == -1, "gradients written by an instruction that writes none");
    }
    // Sizes from the (checked) dimensions, for this instruction's samples.
    require(int64_t(in.samples) * p_.dims.rows_per_sample <= INT32_MAX, in.samples, " samples are too many rows");
    const SegmentSizes z = segment_sizes(seg, p_.dims, in.samples);
    if (in.stash_tail >= 0) {  // selective recompute: the kept part, and the recomputed rest apart
      require(type.rerun_tail && z.stash_kept_bytes > 0, "a split stash for a segment type without one");
      bytes(in.stash, z.stash_kept_bytes, "kept stash");
      bytes(in.stash_tail, z.stash_bytes - z.stash_kept_bytes, "stash tail");
    } else if (in.stash_bf16) {  // held in bf16 (with the input), used in fp32 in the view
      require(p_.precision == Precision::Bf16 && type.stash_layout && op != Op::Recompute && in.link == -1 &&
                  type.data == DataSlot::None,
              "a stash held in bf16 outside a bf16 plan, for a type without a layout, with data, or rerun");
      const bool holds_input = (in.stash_bf16 & kStashHoldsInput) != 0;
      require(!holds_input || type.reads_input, "a stash holding the input of a segment that reads none");
      const HeldStash held = held_stash(seg, p_.dims, in.samples, holds_input, p_.held_pieces);
      const uint64_t input = holds_input ? z.input_bytes : 0;
      const uint64_t piece = held.view_bytes() + held.piece.in_place_bytes();  // as one buffer
      require(uint64_t(held.pieces) * piece == z.stash_bytes + input, "a stash layout of ", held.pieces, " x ", piece,
              " bytes for a stash of ", z.stash_bytes, " and an input of ", input);
      bytes(in.stash, held.held_bytes(), "bf16 stash");
      bytes(in.stash_view, held.view_bytes(), "stash view");
    } else {
      require(in.stash_view == -1, "a stash view for a stash held in fp32");
      bytes(in.stash, z.stash_bytes, "stash");
    }
    if (fwd && type.data != DataSlot::None) {
      const uint64_t n = uint64_t(in.samples);
      const uint64_t data = type.data == DataSlot::Labels     ? n * 4
                            : type.data == DataSlot::Features ? n * uint64_t(p_.dims.d_in) * 4
                                                              : n * uint64_t(p_.dims.seq_len) * 4;
      bytes(in.stash, data, "data stash");
    }
    if (type.reads_input && !fwd && (in.stash_bf16 & kStashHoldsInput))  // read from the stash's view
      require(in.in == -1, "a backward given an input its stash holds");
    else if (type.reads_input)
      bytes(in.in, z.input_bytes, "input");
    if (type.reads_input && z.ragged_parts > 0) {  // SegmentIO::counts: read from the host, never from the device
      auto known = counts_on_host_.find(in.in);
      require(known != counts_on_host_.end() && known->second >= z.ragged_parts,
              "a segment reads ragged rows whose counts no earlier exchange or counts read brings to the host");
    }
    const bool rerun_tail = op == Op::Recompute && in.stash_tail >= 0;  // writes the stash's tail, no output
    if (rerun_tail) require(in.out == -1, "a rerun of a stash's tail with an output buffer");
    else if (fwd && !type.computes_loss) bytes(in.out, z.out_bytes, "output");
    if (!fwd && !type.computes_loss) bytes(in.dout, z.out_bytes, "output gradient");
    if (bwd_input && type.reads_input) bytes(in.din, z.input_bytes, "input gradient");
    if (op == Op::BackwardInput || bwd_weight) bytes(in.wstash, z.wstash_bytes, "weight stash");
    if (type.link_offset != 0) {
      const int64_t partner = int64_t(in.segment) + type.link_offset;
      index(partner, p_.segments.size(), "linked segment");
      bytes(in.link, segment_sizes(p_.segments[size_t(partner)], p_.dims, in.samples).stash_bytes, "linked stash");
    }
    bytes(p_.workspace_buf, z.workspace_bytes, "workspace");
    if (type.scratch_floats) require(p_.scratch_buf >= 0, "a segment that needs the scratch, and no scratch buffer");
  }

  // The collective's group and its size.
  int64_t collective_group(int32_t group) const {
    index(group, p_.groups.size(), "group");
    return group_size(p_.groups[size_t(group)]);
  }

  // -1 (none) or an index into a table of n.
  void optional(int64_t i, size_t n, const char* what) const {
    if (i != -1) index(i, n, what);
  }

  void update(const UpdateArgs& in) {
    index(in.bucket, p_.buckets.size(), "bucket");
    require(in.offset >= 0 && in.src_offset >= 0 && in.count >= 0, "negative offset or count");
    const int32_t slices = p_.buckets[size_t(in.bucket)].slices;
    floats(in.buf, in.offset, in.count, in.flags & kFlagBufShard, "parameter", slices);
    floats(in.src, in.src_offset, in.count, in.flags & kFlagSrcShard, "gradient", slices);
    floats(in.m, 0, in.count, false, "first moment");
    floats(in.v, 0, in.count, false, "second moment");
  }

  void message(const MessageArgs& in) {
    index(in.peer_set, p_.sets.size(), "peer device set");
    require(int64_t(p_.sets[size_t(in.peer_set)].size()) == replicas_, "a peer set of another size");
    require(in.tag >= 0, "negative tag");
    require(in.offset >= 0 && in.count >= 0, "negative offset or count");
    require(in.count <= INT32_MAX, "more than 2^31 floats in one message");
    floats(in.buf, in.offset, in.count, false, "message");
  }

  // A reduction or gather moves at most 2^31 floats at once.
  void collective(Op op, const CollectiveArgs& in) {
    optional(in.bucket, p_.buckets.size(), "bucket");
    const int64_t g = collective_group(in.group);
    require(in.offset >= 0 && in.src_offset >= 0 && in.count >= 0, "negative offset or count");
    require(in.count <= INT32_MAX, "more than 2^31 floats in one collective");
    const bool buf_shard = in.flags & kFlagBufShard, src_shard = in.flags & kFlagSrcShard;
    const int32_t slices = in.bucket >= 0 ? p_.buckets[size_t(in.bucket)].slices : 1;
    require(!(buf_shard || src_shard) || in.bucket >= 0, "a shard of no bucket");
    if (op == Op::AllReduce) {
      floats(in.buf, in.offset, in.count, buf_shard, "reduced", slices);
    } else if (op == Op::ReduceScatter) {
      floats(in.src, in.src_offset, in.count * g, false, "reduce-scatter source");
      if (in.tmp >= 0) floats(in.tmp, 0, in.count, false, "reduce-scatter scratch");
      floats(in.buf, in.offset, in.count, buf_shard, "reduce-scatter destination", slices);
    } else {
      floats(in.buf, in.offset, in.count * g, false, "gathered");
      if (in.src >= 0) floats(in.src, in.src_offset, in.count, src_shard, "gather source", slices);
    }
    if (in.flags & kFlagBf16Wire) {  // bf16 values: count reduced in place, group·count sent and count received, or
                                     // group·count gathered
      const uint64_t values = op == Op::AllReduce ? 1 : op == Op::ReduceScatter ? uint64_t(g) + 1 : uint64_t(g);
      require(op != Op::AllGather || in.src >= 0, "an all-gather in bf16 without its source");
      bytes(in.wire, uint64_t(in.count) * values * sizeof(uint16_t), "bf16 wire");
    } else {
      require(in.wire == -1, "a bf16 wire for a collective in fp32");
    }
  }

  void all_to_all(const AllToAllArgs& in) {
    const int64_t g = collective_group(in.group);
    require(in.parts >= g && in.parts % g == 0, in.parts, " parts over a group of ", g);
    require(in.row_width >= 1 && in.rows >= 0, "row width or rows out of range");
    bytes(in.src, uint64_t(in.parts) * 4, "exchange source");
    bytes(in.buf, uint64_t(in.parts) * 4, "exchange destination");
    counts_on_host_[in.buf] = in.parts;
  }

  void read_counts(const CountsArgs& in) {
    require(in.parts >= 1, in.parts, " counts read");
    bytes(in.buf, uint64_t(in.parts) * 4, "counts read");
    counts_on_host_[in.buf] = in.parts;
  }

  void step_sync(const StepSyncArgs& in) {
    optional(in.group, p_.groups.size(), "group");
    for (const Span& s : in.spans) floats(s.buf, s.offset, s.count, s.per_replica, "gradient norm", s.slices);
  }

  void instruction(size_t i) {
    const Instr& in = p_.instrs[i];
    require(size_t(in.op) < kOpCount, "unknown op ", int(in.op));
    require(in.args.index() == size_t(op_info(in.op).kind), "a payload of another kind than its op");
    index(in.stream, p_.streams.size(), "stream");
    // Every buffer the payload names is none or in range, whatever the op reads (printers and traces read them all).
    in.operands([&](uint32_t, int32_t b) { optional(b, p_.buffers.size(), "buffer"); });
    for (int32_t j : in.waits) require(j >= 0 && size_t(j) < i, "waits for instruction ", j, ", not an earlier one");
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<A, ComputeArgs>) compute(in, a);
          else if constexpr (std::is_same_v<A, UpdateArgs>) update(a);
          else if constexpr (std::is_same_v<A, MessageArgs>) message(a);
          else if constexpr (std::is_same_v<A, CollectiveArgs>) collective(in.op, a);
          else if constexpr (std::is_same_v<A, AllToAllArgs>) all_to_all(a);
          else if constexpr (std::is_same_v<A, CountsArgs>) read_counts(a);
          else step_sync(a);
        },
        in.args);
  }

  void instructions() {
    std::vector<int64_t> uses(p_.buffers.size(), 0);
    std::vector<int32_t> reads, writes;
    for (size_t i = 0; i < p_.instrs.size(); ++i) {
      where_ = cat("instruction ", i, " (", op_name(p_.instrs[i].op), ")");
      instruction(i);
      instr_accesses(p_.instrs[i], reads, writes);
      std::vector<int32_t> all = reads;
      all.insert(all.end(), writes.begin(), writes.end());
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      for (int32_t b : all) {
        index(b, p_.buffers.size(), "buffer");
        ++uses[size_t(b)];
      }
    }
    // A transient buffer is freed after its `uses`-th use in a step: a wrong count frees it while in use.
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      where_ = cat("buffer ", b);
      require(p_.buffers[b].uses == uses[b], "used by ", uses[b], " instructions, counted ", p_.buffers[b].uses);
    }
  }
};

}  // namespace

void check_plan(const Plan& plan) { PlanCheck(plan).run(); }

}  // namespace piper
