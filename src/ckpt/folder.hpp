// The checkpoint folder: one job at a time (an flock on `.lock`), stale temporary files, the list of
// checkpoints, which one --resume takes, and pruning to checkpoint.keep.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

// Takes an exclusive lock on `dir/.lock` (flock, non-blocking) and writes this host, pid and job name
// into it; the lock holds until the process ends. Throws UserError naming the holder when another job
// has it; then nothing in `dir` was changed.
void lock_checkpoint_folder(const std::string& dir, const std::string& job_name);

// Removes the temporary files `.step_*.h5.tmp` that an interrupted save left; returns their paths.
// Call it only while holding the folder's lock.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

// The files step_*.h5 in `dir`, newest first (by the step in the name; names without a number last).
std::vector<std::string> list_checkpoints(const std::string& dir);

struct ResumeChoice {
  std::string path;                   // "" when --resume auto found no checkpoint file at all
  int64_t step = 0;
  std::vector<std::string> warnings;  // newer files skipped (each with why), a version-1 file's lack of checksum
};

// --resume `resume` ("auto" or a path): verifies the file (verify.hpp). `auto` takes the newest file of
// `dir` that verifies, not counting the files in `refused`, and warns about each newer one. With
// `check_data` false a version-3 file's tensors are not read here (the ranks that load it check each
// block they read). Throws UserError when a given path does not verify, or when `dir` holds checkpoint
// files and none verifies (listing each with why).
ResumeChoice choose_resume_checkpoint(const std::string& resume, const std::string& dir, bool check_data = true,
                                      const std::vector<std::string>& refused = {});

// What pruning did to the folder, for rank 0 to report.
struct PruneResult {
  std::vector<std::string> removed;  // this job's checkpoints past the newest `keep` that verify
  std::vector<std::string> moved;    // "FROM -> TO: why", for each damaged or foreign file moved aside
};

// The folder damaged and foreign files are moved into: `dir/damaged`.
std::string damaged_folder(const std::string& dir);

// Prunes `dir` to the newest `keep` checkpoints of this job (keep = 0: does nothing). Only files step_N.h5
// that verify (structure and checksum; a version-3 file's blocks by their recorded hashes, not read) and
// were written by a job named `job_name` count; `newest_verified` (the file just written) always counts and
// is never removed. A file that fails to verify, or is in `known_damaged` (its data failed to load), and a
// checkpoint of another job are moved into damaged_folder(dir), never deleted; names without a step number
// are left alone. Returns what it removed and moved.
PruneResult prune_checkpoints(const std::string& dir, int keep, const std::string& job_name,
                              const std::string& newest_verified, const std::vector<std::string>& known_damaged = {});

}  // namespace piper
