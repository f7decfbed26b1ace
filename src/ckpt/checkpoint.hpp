// HDF5 checkpoints: logical (unsharded) tensors by name — parameters and AdamW moments — plus the step,
// data position, seed, job text and layout as attributes (docs/checkpoint-format.md). Saving gathers
// each rank's owned slices on rank 0, which writes a temporary file and renames it when complete;
// loading lets every rank read exactly the ranges it holds, under any strategy.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "runtime/executor.hpp"

namespace piper {

// Collective over `world`. `steps_done` is the number of completed steps (the next step to run).
void save_checkpoint(Executor& ex, int64_t steps_done, const std::string& dir, MPI_Comm world);

// Every rank reads its ranges. Returns the number of completed steps stored in the file.
// Throws UserError (naming the file and tensor) when the checkpoint does not fit the model.
int64_t load_checkpoint(Executor& ex, const std::string& path);

// Newest complete checkpoint (step_*.h5) in `dir`, or "" when there is none.
std::string latest_checkpoint(const std::string& dir);

// "dir/step_00000100.h5"
std::string checkpoint_path(const std::string& dir, int64_t steps_done);

// Removes all but the newest `keep` checkpoints (keep = 0: keep all).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace piper
