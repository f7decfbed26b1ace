// Plan helpers: names of ops and buffer kinds, group resolution for this rank, and the text dump.
#include "plan/plan.hpp"

#include <algorithm>
#include <sstream>

#include "model/segment_type.hpp"
#include "util/error.hpp"

namespace piper {

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
  }
  return out;
}

std::string instr_label(const Plan& p, const Instr& in) {
  const OpInfo& op = op_info(in.op);
  auto buffer = [&](int32_t b) { return b >= 0 ? p.buffers[size_t(b)].name : std::string("?"); };
  switch (op.kind) {
    case OpKind::Compute:
      return cat(op.label, " ", in.segment >= 0 ? p.segments[size_t(in.segment)].name : std::string(), " mb", in.mb);
    case OpKind::Update: return cat(op.label, " bucket", in.bucket);
    case OpKind::StepSync: return op.label;
    case OpKind::PointToPoint:
      return cat(op.label, " ", buffer(in.buf), in.op == Op::Send ? " -> rank " : " <- rank ", p.peer_rank(in.peer_set));
    case OpKind::Collective:
      if (in.op == Op::AllReduce) return cat(op.label, " bucket", in.bucket, " ", p.groups[size_t(in.group)].str());
      return cat(op.label, " bucket", in.bucket, in.op == Op::ReduceScatter && in.mb >= 0 ? cat(" mb", in.mb) : "");
    case OpKind::AllToAll: return cat(op.label, " ", buffer(in.src), " -> ", buffer(in.buf));
  }
  return "?";
}

std::string plan_to_text(const Plan& p) {
  std::ostringstream os;
  os << "# plan of device set " << p.set << " (ranks";
  for (int r : p.sets[size_t(p.set)]) os << " " << r;
  os << "), version " << kPlanVersion << "\n";
  os << "# microbatches " << p.microbatches << ", samples per replica " << p.samples_per_replica << "\n";
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
  auto buf = [&](const char* role, int32_t id) {
    if (id >= 0) os << " " << role << "=%" << id;
  };
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    os << "  " << i << " [" << p.streams[in.stream] << "] " << op_name(in.op);
    if (in.segment >= 0) os << " " << p.segments[size_t(in.segment)].name;
    if (in.mb >= 0) os << " mb" << in.mb;
    if (in.bucket >= 0) os << " bucket" << in.bucket;
    if (in.group >= 0) os << " group" << in.group;
    if (in.peer_set >= 0) os << " peer=set" << in.peer_set << " tag=" << in.tag;
    buf("in", in.in);
    buf("out", in.out);
    buf("stash", in.stash);
    buf("wstash", in.wstash);
    buf("dout", in.dout);
    buf("din", in.din);
    buf("link", in.link);
    buf("buf", in.buf);
    buf("src", in.src);
    buf("tmp", in.tmp);
    if (in.count) os << " count=" << in.count;
    if (in.parts) os << " parts=" << in.parts << " width=" << in.row_width << " rows<=" << in.rows;
    if (in.flags) os << " flags=" << int(in.flags);
    if (std::find(in.overwrite.begin(), in.overwrite.end(), 1) != in.overwrite.end()) {
      os << " overwrite=";
      for (uint8_t o : in.overwrite) os << int(o);
    }
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
