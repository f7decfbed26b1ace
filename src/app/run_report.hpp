// --report-json FILE: what a run prints at its end (time per step, memory by kind, the replica check and,
// with --profile, the per-kernel tables), every rank's, as one JSON document that rank 0 writes.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "app/report.hpp"
#include "app/trace_file.hpp"
#include "backend/profiling_kernels.hpp"

namespace piper {

// What rank 0 gathered at the end of the run.
struct RunReport {
  std::string job, backend;
  std::string precision = "fp32", matmul_path;  // job.precision; with bf16, how the matmuls ran
  int world = 1;
  int64_t first_step = 0, last_step = 0;  // the run trained steps first_step..last_step (1-based)
  TimeReport times;
  std::vector<RankMemory> memory;    // per rank
  std::vector<std::string> profiles;  // per rank, JSON objects (profile_json); empty without --profile
  ReplicaCheck replicas;
};

// One rank's profile as a JSON object: totals, then kernels, regions and matmul shapes by time.
std::string profile_json(const KernelProfile& p);

// Collective: every rank's `json`, in rank order, on rank 0 (empty on the others).
std::vector<std::string> gather_json(const std::string& json, MPI_Comm world);

// Rank 0. Throws SystemError naming the file when it cannot be written.
void write_run_report(const std::string& path, const RunReport& r);

}  // namespace piper
