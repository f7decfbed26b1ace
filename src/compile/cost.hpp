// The cost model: how long each instruction takes on a device and link, from FLOPs and bytes. Presets
// for this CPU and for H100/H200 with NVLink inside a node and InfiniBand across nodes; a [cost] section
// overrides any rate. The uniform model (F = BI = BW = 1, B = 2, everything else free) is for reasoning
// about schedules.
#pragma once
#include <string>

#include "config/job.hpp"
#include "plan/plan.hpp"

namespace piper {

struct CostModel {
  std::string name = "cpu";
  double flops = 1.0e11;               // FLOP/s of one rank's compute
  double memory_bandwidth = 2.0e10;    // bytes/s, for the optimizer's elementwise update
  double p2p_bandwidth = 5.0e9;        // bytes/s between neighbouring ranks
  double collective_bandwidth = 5.0e9; // bytes/s per rank in ring collectives
  double latency = 5.0e-6;             // seconds per message or collective step
  bool uniform = false;

  static CostModel from_spec(const CostSpec& spec);
  // Seconds for one instruction of plan `p`; `group_size` for collectives; `share`: the instruction's
  // part of its region's pass (uniform model).
  double seconds(const Plan& p, const Instr& in, int group_size, double share) const;
  std::string describe() const;
};

}  // namespace piper
