// --trace FILE: one Chrome-trace JSON for the whole job (a process per rank, a thread per stream, a span per
// instruction, flow arrows from each SEND to its RECV) that Perfetto and chrome://tracing open; and the
// per-rank time summary printed at the end of every run.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/executor.hpp"

namespace piper {

// Collective. Every rank formats its events; rank 0 writes the file.
void write_trace(const std::string& path, Executor& ex, const std::vector<TraceEvent>& events, MPI_Comm world);

// One rank's mean times per step, as the end-of-run report prints them.
struct RankTimes {
  double wall_ms = 0, compute_ms = 0, communication_ms = 0;
  double bubble = 0, predicted_bubble = 0;  // idle share of the step: measured, and the cost model's
  double communication_hidden = 0;           // share of the communication time behind compute
  double p2p_bytes = 0, collective_bytes = 0;
  double all_to_all_ms = 0, all_to_all_hidden = 0, all_to_all_exposed_ms = 0;
};

struct TimeReport {
  int64_t steps = 0;        // steps the means cover
  bool all_to_all = false;  // the job has all-to-all exchanges (their times are reported apart)
  std::vector<RankTimes> ranks;  // rank 0: every rank's; empty on the others
};

// Collective. Rank 0 prints mean times per step for every rank (`steps` steps summed in `total`) and
// returns them.
TimeReport report_times(const Plan& plan, const StepTimes& total, int64_t steps, MPI_Comm world);

}  // namespace piper
