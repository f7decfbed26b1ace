// Simulates every device set's plan together, before launch. It proves that each point-to-point channel
// carries its SENDs and RECVs in the same order on both ends, that all members of a group issue the same
// collectives in the same order, and that no wait-for cycle exists; and, with the cost model, it predicts
// each instruction's start and end, the step time and every rank's bubble. Replicas of a set run the
// same body at the same times, so one replica per set stands for all.
#pragma once
#include <string>
#include <vector>

#include "compile/cost.hpp"
#include "plan/plan.hpp"

namespace piper {

struct SimSpan {
  int32_t instr;
  double start, end;
};

struct Simulation {
  double step_time = 0;
  std::vector<double> busy;    // per set: compute (forward, backward, update) seconds
  std::vector<double> bubble;  // per set: 1 - busy / step_time
  std::vector<std::vector<SimSpan>> spans;  // per set, in plan order
};

// Who wrote the order of each device set, for messages ("directive #7, job.toml:52").
struct OrderOrigins {
  std::vector<std::string> per_set;
};

// Throws UserError naming the ranks, the instructions and the directives involved when the plans would
// mismatch or deadlock.
Simulation simulate_plans(const std::vector<Plan>& bodies, const CostModel& cost, const OrderOrigins& origins);

}  // namespace piper
