// The training loop of one rank: executor, resume, steps, per-step output, metrics, checkpoints, and the
// end-of-run memory report (measured next to the compiler's estimate).
#pragma once
#include <mpi.h>

#include "app/cli.hpp"
#include "plan/plan.hpp"

namespace piper {

// Collective over `world`. Returns the exit code.
int train(const Plan& plan, const CliOptions& opts, MPI_Comm world);

}  // namespace piper
