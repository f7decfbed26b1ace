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

// Collective. Rank 0 prints mean times per step for every rank (`steps` steps summed in `total`).
void report_times(const Plan& plan, const StepTimes& total, int64_t steps, MPI_Comm world);

}  // namespace piper
