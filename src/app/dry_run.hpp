// --dry-run: compile and verify the job for --world N ranks on one process, report each distinct plan's size
// and estimated memory (as text, or with --json one JSON document), and (--dump-plan DIR) write graph and plans.
#pragma once
#include "app/cli.hpp"

namespace piper {

// Runs on one process; returns the exit code. Throws UserError for a bad job.
int dry_run(const CliOptions& opts, int world_size);

}  // namespace piper
