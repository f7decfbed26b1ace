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

// Removes all but the newest `keep` checkpoints (keep = 0: keep all), never `newest_verified` (the file
// just written and verified), whatever the files named as newer hold, nor a name without a step number.
void prune_checkpoints(const std::string& dir, int keep, const std::string& newest_verified);

}  // namespace piper
