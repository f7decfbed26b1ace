// What one rank did during a step, instruction by instruction: start and end times (posting and
// completion for communication), and what follows from them — busy compute time, communication time,
// and how much of the communication ran while compute was busy.
#pragma once
#include <cstdint>
#include <vector>

#include "plan/plan.hpp"

namespace piper {

struct TraceEvent {
  int32_t instr = -1;
  int64_t step = 0;
  double start = 0, end = 0;  // seconds since the run's common origin
};

struct StepTimes {
  double wall = 0;          // step start to end on this rank
  double compute = 0;       // union of compute, update and step-sync-free work
  double communication = 0; // union of posted-to-completed communication
  double hidden = 0;        // communication time during which compute was busy
  double all_to_all = 0;        // union of posted-to-completed all-to-all exchanges
  double all_to_all_hidden = 0; // of which compute was busy
  double p2p_bytes = 0;         // bytes this rank sent point-to-point
  double collective_bytes = 0;  // bytes this rank sent in collectives (ring-algorithm volume)
  StepTimes& operator+=(const StepTimes& o);
};

// Times of one step from its events (all streams of one rank).
StepTimes step_times(const Plan& plan, const std::vector<TraceEvent>& events, double step_start, double step_end,
                     const std::vector<int>& group_sizes);

}  // namespace piper
