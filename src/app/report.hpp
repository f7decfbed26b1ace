// End-of-run reports: memory by kind per rank (measured next to the compiler's estimate), and a check
// that every parameter held on several ranks (data-parallel replicas, tied copies) is bit-identical.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/executor.hpp"

namespace piper {

// One rank's memory by buffer kind: measured by the runtime and estimated by the compiler, in bytes.
struct RankMemory {
  uint64_t held[kBufferKinds] = {0};            // measured, held between steps
  uint64_t peak[kBufferKinds] = {0};            // measured peak
  uint64_t estimated_peak[kBufferKinds] = {0};
  uint64_t estimated_steady[kBufferKinds] = {0};  // estimated, held between steps
  uint64_t peak_total = 0, estimated_peak_total = 0;
};

// Collective. Rank 0 prints a table and one "memory rank=..." line per rank for scripts, and returns every
// rank's numbers (the other ranks: none).
std::vector<RankMemory> report_memory(Executor& ex, MPI_Comm world);

struct ReplicaCheck {
  bool identical = true;
  int copies_compared = 0;  // copies on other ranks compared with their first holder's (rank 0's count)
  std::string differing_parameter;  // when not identical (rank 0): the first that differs ...
  int differing_ranks[2] = {-1, -1};  // ... and between which ranks
};

// Collective. Not identical (and rank 0 prints which parameter differs between which ranks) when copies of
// a parameter disagree. Sharded parameters are compared as the replicas gather them.
ReplicaCheck check_replicas(Executor& ex, MPI_Comm world);

// Collective. Rank 0 prints every rank's `text`, in rank order.
void print_in_rank_order(const std::string& text, MPI_Comm world);

}  // namespace piper
