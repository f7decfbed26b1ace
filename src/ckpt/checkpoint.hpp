// HDF5 checkpoints: logical (unsharded) tensors by name — parameters and AdamW moments — plus the step,
// data position, seed, job text, layout and a checksum as attributes (docs/checkpoint-format.md). Saving
// gathers each rank's owned slices on rank 0, which writes a temporary file, syncs and verifies it and
// renames it; loading lets every rank read exactly the ranges it holds, under any strategy.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/folder.hpp"
#include "ckpt/verify.hpp"
#include "runtime/executor.hpp"

namespace piper {

// Collective over `world`. `steps_done` is the number of completed steps (the next step to run). Rank 0
// writes `dir/.step_N.h5.tmp`, fsyncs it, verifies it, renames it to step_N.h5 and fsyncs `dir`. Returns
// 0 on every rank, or the exit code of a failed save after rank 0 printed why: kExitFailure for a write
// error (a full disk: "No space left on device", naming the file), kExitNonFinite when a tensor holds a
// non-finite value. The temporary file is then removed; older checkpoints are untouched.
[[nodiscard]] int save_checkpoint(Executor& ex, int64_t steps_done, const std::string& dir, MPI_Comm world);

// Saves a run's checkpoints into `dir` and prunes them to `keep` (0: all). Synchronous: save() returns once
// the file is written, verified and renamed. Asynchronous: save() copies the state into rank 0's host memory
// (the same gather) and returns; a thread of rank 0 writes, verifies, renames and prunes while training goes
// on. The next save() and finish() first wait for that thread: a failed write surfaces there, as the exit
// code of the call on every rank. The rename still happens only when the file is complete and verified.
class CheckpointSaver {
 public:
  CheckpointSaver(std::string dir, int keep, bool async, MPI_Comm world);
  ~CheckpointSaver();  // waits for a write still running (no collective: for error paths)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;
  // Collective. 0, or the exit code of a failed save (this one, or the previous asynchronous one).
  [[nodiscard]] int save(Executor& ex, int64_t steps_done);
  // Collective. Waits for the asynchronous write still running; 0 or its exit code.
  [[nodiscard]] int finish();

 private:
  struct Pending;
  int wait_rank0();
  std::string dir_;
  int keep_ = 0;
  bool async_ = false;
  MPI_Comm comm_;
  int rank_ = 0;
  std::unique_ptr<Pending> pending_;
};

// Every rank reads its ranges. Returns the number of completed steps stored in the file. Throws
// UserError (naming the file, and the tensor) when the file cannot be read or does not fit the model.
// It checks the format only: verify_checkpoint (rank 0, before) checks the rest.
int64_t load_checkpoint(Executor& ex, const std::string& path);

// "dir/step_00000100.h5"
std::string checkpoint_path(const std::string& dir, int64_t steps_done);

}  // namespace piper
