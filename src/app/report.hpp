// End-of-run reports: memory by kind per rank (measured next to the compiler's estimate), and a check
// that every parameter held on several ranks (data-parallel replicas, tied copies) is bit-identical.
#pragma once
#include <mpi.h>

#include <string>

#include "runtime/executor.hpp"

namespace piper {

// Collective. Rank 0 prints a table and one "memory rank=..." line per rank for scripts.
void report_memory(Executor& ex, MPI_Comm world);

// Collective. Returns false (and rank 0 prints which parameter differs between which ranks) when copies
// of a parameter disagree. Sharded parameters are compared as the replicas gather them.
bool check_replicas(Executor& ex, MPI_Comm world);

// Collective. Rank 0 prints every rank's `text`, in rank order.
void print_in_rank_order(const std::string& text, MPI_Comm world);

}  // namespace piper
