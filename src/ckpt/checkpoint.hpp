// HDF5 checkpoints: logical (unsharded) tensors by name — parameters and AdamW moments — plus the step,
// data position, seed, job text, layout and a checksum as attributes (docs/checkpoint-format.md). Saving
// lets every rank write the slices it owns into one temporary file, which rank 0 completes and renames;
// loading lets every rank read exactly the ranges it holds, under any strategy.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/folder.hpp"
#include "ckpt/verify.hpp"
#include "plan/state_view.hpp"
#include "util/error.hpp"

namespace piper {

// Collective over `world`. `steps_done` is the number of completed steps (the next step to run). Every
// rank writes the slices it owns into `dir/.step_N.h5.tmp` (parallel_save.hpp); rank 0 completes it,
// renames it to step_N.h5 and fsyncs `dir`. Returns 0 on every rank, or the exit code of a failed save
// after rank 0 printed why: kExitFailure for a write error (a full disk: "No space left on device", naming
// the file), kExitNonFinite when a tensor holds a non-finite value. The temporary file is then removed;
// older checkpoints are untouched.
[[nodiscard]] int save_checkpoint(const StateView& state, int64_t steps_done, const std::string& dir, MPI_Comm world);

// Saves a run's checkpoints into `dir` and prunes them to `keep` (0: all). Synchronous: save() returns once
// the file is written, checked and renamed. Asynchronous: save() lays the file out, copies each rank's own
// slices into its host memory and returns; a thread of every rank writes them while training goes on, and
// the file is completed (checksums, rename, pruning) by the first poll() after every rank's thread is done,
// or by the next save() or finish(), which wait for it. A failed write surfaces there, as the exit code of
// the call on every rank. The rename still happens only when the file is complete.
class CheckpointSaver {
 public:
  CheckpointSaver(std::string dir, int keep, bool async, MPI_Comm world);
  ~CheckpointSaver();  // waits for a write still running (no collective: for error paths)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;
  // Collective. 0, or the exit code of a failed save (this one, or the previous asynchronous one).
  [[nodiscard]] int save(const StateView& state, int64_t steps_done);
  // Collective, once a step: completes an asynchronous save whose writes are done on every rank; 0 or its
  // exit code. Without a save in flight it does nothing (and communicates nothing).
  [[nodiscard]] int poll();
  // Collective. Waits for the asynchronous write still running and completes it; 0 or its exit code.
  [[nodiscard]] int finish();
  // Files of `dir` whose data failed to load (--resume auto went past them): pruning moves them aside.
  void set_damaged(std::vector<std::string> paths) { damaged_ = std::move(paths); }

 private:
  struct Pending;
  int complete_pending();
  void prune(const std::string& job_name, int64_t steps_done);  // rank 0, after a save completed
  std::string dir_;
  int keep_ = 0;
  bool async_ = false;
  MPI_Comm comm_;
  int rank_ = 0;
  std::vector<std::string> damaged_;
  std::unique_ptr<Pending> pending_;
};

// What a rank throws when another rank refused the checkpoint (and printed why): nothing to print here.
class CheckpointLoadAbandoned : public UserError {
 public:
  using UserError::UserError;
};

// Every rank reads its ranges. Returns the number of completed steps stored in the file. Throws
// UserError (naming the file, and the tensor) when the file cannot be read or does not fit the model.
// It checks the format only: verify_checkpoint (rank 0, before) checks the rest.
int64_t load_checkpoint(const StateView& state, const std::string& path);

// "dir/step_00000100.h5"
std::string checkpoint_path(const std::string& dir, int64_t steps_done);

}  // namespace piper
