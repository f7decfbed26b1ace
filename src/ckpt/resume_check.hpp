// What a checkpoint records about the run that wrote it (seed, sampler, data file, model keys) and the
// comparison --resume makes with the job: a difference is an error unless checkpoint.allow_changes names
// the setting; strategy and layout never count (any strategy loads any checkpoint).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data.hpp"
#include "plan/plan.hpp"

namespace piper {

// The run's settings as checkpoint root attributes hold them (docs/checkpoint-format.md). A checkpoint of
// an older piper lacks some: has_* false, strings empty.
struct RunRecord {
  bool has_seed = false;
  int64_t seed = 0;              // "seed"
  std::string sampler;           // "sampler": random | sequential
  std::string model;             // "model": model_keys_text, "kind=gpt vocab=256 ..."
  bool has_data = false;         // a token file (absent for synthetic data)
  std::string data_path;         // "data_path": as the job named it; reported, not compared
  int64_t data_bytes = 0;        // "data_bytes"
  std::string data_hash;         // "data_hash": FileIdentity::hash
};

// The record of the job this plan runs, with `data` the identity of the token file it reads (taken when
// the run opened it); null reads the first and last MiB of the file data.path names now.
RunRecord run_record(const Plan& plan, const FileIdentity* data = nullptr);

// Compares the checkpoint's record with the job's. Returns the warnings to print: changes that
// `allowed` (checkpoint.allow_changes) names, and what an older checkpoint cannot tell. Throws UserError
// naming every other difference: the setting, the checkpoint's value and the job's.
std::vector<std::string> check_resume(const RunRecord& checkpoint, const RunRecord& job,
                                      const std::vector<std::string>& allowed, const std::string& path);

}  // namespace piper
