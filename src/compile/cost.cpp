// Cost model rates and per-instruction durations (see cost.hpp).
#include "compile/cost.hpp"

#include "util/error.hpp"

namespace piper {

CostModel CostModel::from_spec(const CostSpec& spec) {
  CostModel c;
  c.name = spec.preset_given || spec.preset == "cpu" ? spec.preset : spec.preset + " (the preset of backend = \"cuda\")";
  if (spec.preset == "h100" || spec.preset == "h200") {
    // fp32 without tensor cores (what the CUDA backend runs), NVLink 4 inside a node.
    c.flops = spec.preset == "h100" ? 5.0e13 : 5.5e13;
    c.memory_bandwidth = spec.preset == "h100" ? 3.0e12 : 4.5e12;
    c.p2p_bandwidth = 4.0e11;
    c.collective_bandwidth = 3.5e11;
    c.latency = 1.0e-5;
  }
  if (spec.flops > 0) c.flops = spec.flops;
  if (spec.p2p_bandwidth > 0) c.p2p_bandwidth = spec.p2p_bandwidth;
  if (spec.collective_bandwidth > 0) c.collective_bandwidth = spec.collective_bandwidth;
  if (spec.latency > 0) c.latency = spec.latency;
  c.uniform = spec.uniform;
  return c;
}

std::string CostModel::describe() const {
  if (uniform) return "uniform (F = BI = BW = 1, B = 2 time units, communication free)";
  return cat(name, ": ", flops / 1e12, " TFLOP/s, p2p ", p2p_bandwidth / 1e9, " GB/s, collectives ",
             collective_bandwidth / 1e9, " GB/s, latency ", latency * 1e6, " us");
}

double CostModel::seconds(const Plan& p, const Instr& in, int group_size, double share) const {
  const OpInfo& op = op_info(in.op);
  switch (op.cost) {
    case CostRule::Flops: {
      if (uniform) return op.flops_factor * share;
      const ComputeArgs& c = in.compute();
      return instr_forward_flops(p, in) * c.samples * op.flops_factor / flops;
    }
    case CostRule::MemoryPasses: return uniform ? 0.0 : double(in.update().count) * 4 * sizeof(float) / memory_bandwidth;
    case CostRule::Latency: return uniform ? 0.0 : latency;
    case CostRule::Message: return uniform ? 0.0 : latency + double(in.message().count) * sizeof(float) / p2p_bandwidth;
    case CostRule::Collective:
      if (uniform || group_size <= 1) return 0.0;
      return latency * (group_size - 1) + instr_send_bytes(in, group_size) / collective_bandwidth;
  }
  return 0;
}

}  // namespace piper
