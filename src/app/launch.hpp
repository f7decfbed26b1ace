// Start of a job: rank 0 reads the job file, compiles and verifies the plans and scatters them; every
// rank gets its plan. An error on rank 0 is printed once and ends every rank with its exit code.
#pragma once
#include <mpi.h>

#include "app/cli.hpp"
#include "config/job.hpp"
#include "plan/plan.hpp"

namespace piper {

// Thrown to end a rank with an exit code after the message was printed (by rank 0).
struct ExitRequest {
  int code;
};

// Reads, validates and [mesh]-expands the job; checks the data against the model.
JobSpec load_and_check(const CliOptions& opts, int world);

// Collective over `world`. Rank 0 also takes the checkpoint folder's lock for the rest of the process and
// removes the temporary files an interrupted save left there (ckpt/folder.hpp).
Plan launch(const CliOptions& opts, MPI_Comm world);


void print_error(const std::string& what);

}  // namespace piper
