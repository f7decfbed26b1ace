// Reads a job file (TOML) into a validated JobSpec. Every error is a UserError that names the file,
// line:column, the key, what was found and what was expected; nothing is written before validation ends.
#pragma once
#include <string>
#include <vector>

#include "config/job.hpp"

namespace piper {

// Loads `path`, applies `--set key.path=value` overrides (in order), validates everything.
JobSpec load_job(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from text already in memory; `name` is used in messages in place of a file name.
JobSpec load_job_text(const std::string& text, const std::string& name,
                      const std::vector<std::string>& overrides = {});

// Only the [model] table of a job's text (the other tables are not read), with every check of load_job.
ModelSpec load_model_text(const std::string& text, const std::string& name);

}  // namespace piper
