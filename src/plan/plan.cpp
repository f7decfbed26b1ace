// Plan helpers: names of ops and buffer kinds, group resolution for this rank, and the text dump.
#include "plan/plan.hpp"

#include <algorithm>
#include <sstream>

#include "model/segment_type.hpp"
#include "util/error.hpp"

namespace piper {

double instr_forward_flops(const Plan& p, const Instr& in) {
  const ComputeArgs& c = in.compute();
  const Segment& s = p.segments[size_t(c.segment)];
  const double flops = in.op == Op::Recompute && c.stash_tail >= 0 ? s.tail_flops_per_sample : s.fwd_flops_per_sample;
  return s.shards > 1 && s.type->tp_split ? flops / s.shards : flops;
}

const char* buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Param: return "parameters";
    case BufferKind::Grad: return "gradients";
    case BufferKind::OptState: return "optimizer";
    case BufferKind::Activation: return "activations";
    case BufferKind::Comm: return "communication";
    case BufferKind::Workspace: return "workspace";
  }
  return "?";
}

std::string GroupRef::str() const {
  std::string s;
  switch (kind) {
    case Kind::World: s = "world"; break;
    case Kind::DeviceSet: s = cat("set", sets.at(0)); break;
    case Kind::AcrossSets: {
      s = "across(";
      for (size_t i = 0; i < sets.size(); ++i) s += cat(i ? "," : "", "set", sets[i]);
      s += ")";
      break;
    }
    case Kind::SetBlock: s = cat("set", sets.at(0), ".block", sets.at(1)); break;
    case Kind::SetStride: s = cat("set", sets.at(0), ".stride", sets.at(1)); break;
  }
  return s + "/" + stream;
}

std::vector<int32_t> Plan::group_ranks(const GroupRef& g) const {
  std::vector<int32_t> out;
  switch (g.kind) {
    case GroupRef::Kind::World:
      for (int r = 0; r < world; ++r) out.push_back(r);
      break;
    case GroupRef::Kind::DeviceSet: out = sets[size_t(g.sets[0])]; break;
    case GroupRef::Kind::AcrossSets:
      for (int32_t s : g.sets) out.push_back(sets[size_t(s)][size_t(replica)]);
      break;
    case GroupRef::Kind::SetBlock:
    case GroupRef::Kind::SetStride: {
      const std::vector<int32_t>& set = sets[size_t(g.sets[0])];
      const int k = g.sets[1];
      for (size_t i = 0; i < set.size(); ++i)
        if (g.kind == GroupRef::Kind::SetBlock ? int(i) / k == replica / k : int(i) % k == replica % k)
          out.push_back(set[i]);
      break;
    }
  }
  return out;
}

void Instr::set_op(Op o) {
  op = o;
  switch (op_info(o).kind) {
    case OpKind::Compute: args = ComputeArgs{}; break;
    case OpKind::Update: args = UpdateArgs{}; break;
    case OpKind::PointToPoint: args = MessageArgs{}; break;
    case OpKind::Collective: args = CollectiveArgs{}; break;
    case OpKind::AllToAll: args = AllToAllArgs{}; break;
    case OpKind::StepSync: args = StepSyncArgs{}; break;
    case OpKind::HostRead: args = CountsArgs{}; break;
  }
}

int32_t Instr::group() const {
  if (auto* c = std::get_if<CollectiveArgs>(&args)) return c->group;
  if (auto* a = std::get_if<AllToAllArgs>(&args)) return a->group;
  if (auto* s = std::get_if<StepSyncArgs>(&args)) return s->group;
  return -1;
}

int32_t Instr::bucket() const {
  if (auto* c = std::get_if<CollectiveArgs>(&args)) return c->bucket;
  if (auto* u = std::get_if<UpdateArgs>(&args)) return u->bucket;
  return -1;
}

namespace {

// The label of each payload kind after the op's own ("F", "SEND", ...).
struct InstrLabel {
  const Plan& p;
  const Instr& in;
  std::string buffer(int32_t b) const { return b >= 0 ? p.buffers[size_t(b)].name : std::string("?"); }
  std::string operator()(const ComputeArgs& a) const {
    return cat(" ", a.segment >= 0 ? p.segments[size_t(a.segment)].name : std::string(), " mb", in.mb);
  }
  std::string operator()(const UpdateArgs& a) const { return cat(" bucket", a.bucket); }
  std::string operator()(const StepSyncArgs&) const { return ""; }
  std::string operator()(const MessageArgs& a) const {
    return cat(" ", buffer(a.buf), in.op == Op::Send ? " -> rank " : " <- rank ", p.peer_rank(a.peer_set));
  }
  std::string operator()(const CollectiveArgs& a) const {
    if (in.op == Op::AllReduce) return cat(" bucket", a.bucket, " ", p.groups[size_t(a.group)].str());
    return cat(" bucket", a.bucket, in.op == Op::ReduceScatter && in.mb >= 0 ? cat(" mb", in.mb) : "");
  }
  std::string operator()(const AllToAllArgs& a) const { return cat(" ", buffer(a.src), " -> ", buffer(a.buf)); }
  std::string operator()(const CountsArgs& a) const { return cat(" ", buffer(a.buf)); }
};

}  // namespace

std::string instr_label(const Plan& p, const Instr& in) {
  return op_info(in.op).label + std::visit(InstrLabel{p, in}, in.args);
}

namespace {

// One instruction's line of the text dump after its stream and op name: every field its payload has, in
// one order for every kind (segment, mb, bucket, group, peer, buffers, counts, flags, overwrite, waits).
struct InstrText {
  std::ostream& os;
  const Plan& p;
  const Instr& in;
  void buf(const char* role, int32_t id) {
    if (id >= 0) os << " " << role << "=%" << id;
  }
  void head(int32_t segment, int32_t bucket, int32_t group) {
    if (segment >= 0) os << " " << p.segments[size_t(segment)].name;
    if (in.mb >= 0) os << " mb" << in.mb;
    if (bucket >= 0) os << " bucket" << bucket;
    if (group >= 0) os << " group" << group;
  }
  void count_and_flags(int64_t count, uint8_t flags) {
    if (count) os << " count=" << count;
    if (flags) os << " flags=" << int(flags);
  }
  void operator()(const ComputeArgs& a) {
    head(a.segment, -1, -1);
    buf("in", a.in);
    buf("out", a.out);
    buf("stash", a.stash);
    buf("tail", a.stash_tail);
    buf("wstash", a.wstash);
    buf("dout", a.dout);
    buf("din", a.din);
    buf("link", a.link);
    if (a.stash_bf16) {  // held in bf16: the pass's view, and the pieces it goes by
      buf("view", a.stash_view);
      const Segment& seg = p.segments[size_t(a.segment)];
      os << " pieces="
         << held_stash(seg, p.dims, a.samples, (a.stash_bf16 & kStashHoldsInput) != 0, p.held_pieces).pieces;
    }
    if (std::find(a.overwrite.begin(), a.overwrite.end(), 1) != a.overwrite.end()) {
      os << " overwrite=";
      for (uint8_t o : a.overwrite) os << int(o);
    }
  }
  void operator()(const UpdateArgs& a) {
    head(-1, a.bucket, -1);
    buf("buf", a.buf);
    buf("src", a.src);
    count_and_flags(a.count, a.flags);
  }
  void operator()(const MessageArgs& a) {
    head(-1, -1, -1);
    if (a.peer_set >= 0) os << " peer=set" << a.peer_set << " tag=" << a.tag;
    buf("buf", a.buf);
    count_and_flags(a.count, 0);
  }
  void operator()(const CollectiveArgs& a) {
    head(-1, a.bucket, a.group);
    buf("buf", a.buf);
    buf("src", a.src);
    buf("tmp", a.tmp);
    buf("wire", a.wire);
    count_and_flags(a.count, a.flags);
  }
  void operator()(const AllToAllArgs& a) {
    head(-1, -1, a.group);
    buf("buf", a.buf);
    buf("src", a.src);
    if (a.parts) os << " parts=" << a.parts << " width=" << a.row_width << " rows<=" << a.rows;
  }
  void operator()(const StepSyncArgs& a) { head(-1, -1, a.group); }
  void operator()(const CountsArgs& a) {
    head(-1, -1, -1);
    buf("buf", a.buf);
    os << " parts=" << a.parts;
  }
};

}  // namespace

std::string plan_to_text(const Plan& p) {
  std::ostringstream os;
  os << "# plan of device set " << p.set << " (ranks";
  for (int r : p.sets[size_t(p.set)]) os << " " << r;
  os << "), version " << kPlanVersion << "\n";
  os << "# microbatches " << p.microbatches << ", samples per replica " << p.samples_per_replica << "\n";
  if (p.precision != Precision::Fp32) os << "# precision " << precision_name(p.precision) << "\n";
  os << "segments:";
  for (size_t i = 0; i < p.segments.size(); ++i) os << " " << i << "=" << p.segments[i].name << ":" << p.segments[i].type->name;
  os << "\nstreams:";
  for (size_t i = 0; i < p.streams.size(); ++i) os << " " << i << "=" << p.streams[i];
  os << "\ngroups:";
  for (size_t i = 0; i < p.groups.size(); ++i) os << " " << i << "=" << p.groups[i].str();
  os << "\nbuckets:\n";
  for (size_t i = 0; i < p.buckets.size(); ++i) {
    const auto& b = p.buckets[i];
    os << "  bucket " << i << ": region " << b.region << ", " << b.numel << " params (padded " << b.padded << ")";
    if (b.group >= 0) os << ", group " << b.group << " of " << b.group_size << ", zero " << b.zero;
    if (b.tied_copy) os << ", tied copy";
    os << "\n   ";
    for (const auto& pp : p.plan_params)
      if (pp.bucket == int(i)) os << " " << p.params[size_t(pp.model_param)].name << "@" << pp.offset;
    os << "\n";
  }
  os << "buffers:\n";
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const auto& b = p.buffers[i];
    os << "  %" << i << " " << b.name << " " << b.bytes << " B " << buffer_kind_name(b.kind)
       << (b.persistent ? " persistent" : cat(" uses=", b.uses)) << "\n";
  }
  os << "instructions:\n";
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    os << "  " << i << " [" << p.streams[in.stream] << "] " << op_name(in.op);
    std::visit(InstrText{os, p, in}, in.args);
    if (!in.waits.empty()) {
      os << " waits=";
      for (size_t j = 0; j < in.waits.size(); ++j) os << (j ? "," : "") << in.waits[j];
    }
    os << "\n";
  }
  os << "memory estimate (peak bytes by kind):";
  for (int k = 0; k < kBufferKinds; ++k) os << " " << buffer_kind_name(BufferKind(k)) << "=" << p.memory.peak_by_kind[k];
  os << " total=" << p.memory.peak_total << "\n";
  return os.str();
}

}  // namespace piper
