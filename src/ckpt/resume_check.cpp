// Resume checks (see resume_check.hpp).
#include "ckpt/resume_check.hpp"

#include <algorithm>

#include "data/data.hpp"
#include "model/family.hpp"
#include "util/error.hpp"

namespace piper {

RunRecord run_record(const Plan& plan, const FileIdentity* data) {
  RunRecord r;
  r.has_seed = true;
  r.seed = int64_t(plan.seed);
  r.sampler = plan.data.sequential ? "sequential" : "random";
  r.model = plan.model_keys;
  if (plan.data.kind == DataConfig::Kind::Tokens) {
    const FileIdentity id = data ? *data : file_identity(plan.data.path);
    r.has_data = true;
    r.data_path = plan.data.path;
    r.data_bytes = id.bytes;
    r.data_hash = id.hash;
  }
  return r;
}

std::vector<std::string> check_resume(const RunRecord& ck, const RunRecord& job, const std::vector<std::string>& allowed,
                                      const std::string& path) {
  struct Change {
    std::string setting, was, now;
  };
  std::vector<Change> changes;
  std::vector<std::string> older_keys;
  if (ck.has_seed && ck.seed != job.seed) changes.push_back({"job.seed", cat(ck.seed), cat(job.seed)});
  if (!ck.sampler.empty() && job.has_data && ck.sampler != job.sampler)  // synthetic data has no sampler
    changes.push_back({"data.sampler", cat("\"", ck.sampler, "\""), cat("\"", job.sampler, "\"")});
  auto data_text = [](const RunRecord& r) {
    return cat("'", r.data_path, "' (", r.data_bytes, " bytes, ", r.data_hash, ")");
  };
  if (ck.has_data && job.has_data && (ck.data_bytes != job.data_bytes || ck.data_hash != job.data_hash))
    changes.push_back({"data.path", data_text(ck), data_text(job)});
  if (!ck.model.empty()) {
    const auto was = parse_model_keys_text(ck.model), now = parse_model_keys_text(job.model);
    auto value = [](const std::vector<std::pair<std::string, std::string>>& kv, const std::string& key) {
      for (const auto& [k, v] : kv)
        if (k == key) return v;
      return std::string("(none)");
    };
    std::vector<std::string> keys;
    for (const auto* kv : {&was, &now})
      for (const auto& [k, v] : *kv)
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    std::vector<std::string> newer;  // keys of the job's family that the checkpoint predates
    for (const std::string& k : keys) {
      if (value(was, k) == value(now, k)) continue;
      if (value(was, k) == "(none)" && value(was, "kind") == value(now, "kind")) newer.push_back(k);
      else changes.push_back({"model." + k, value(was, k), value(now, k)});
    }
    for (const std::string& k : newer)
      older_keys.push_back(cat("--resume ", path, ": the checkpoint does not record model.", k, " (written before ",
                               "the key existed): resuming with the job's value ", value(now, k)));
  }

  std::vector<std::string> warnings = older_keys;
  std::string refused, names;
  for (const Change& c : changes) {
    std::string line = cat(c.setting, ": checkpoint ", c.was, ", job ", c.now);
    if (std::find(allowed.begin(), allowed.end(), c.setting) != allowed.end()) {
      warnings.push_back(cat("--resume ", path, ": ", line, " (resuming with the job's value: checkpoint.allow_changes "
                             "names ", c.setting, ")"));
    } else {
      refused += cat("\n  ", line);
      names += cat(names.empty() ? "" : ", ", "\"", c.setting, "\"");
    }
  }
  if (!refused.empty())
    throw UserError(cat("--resume ", path, ": the checkpoint was trained with other settings than this job:", refused,
                        "\n  to continue with the job's settings anyway, add them to the job's [checkpoint] table: "
                        "allow_changes = [", names, "]"));
  if (ck.model.empty())
    warnings.push_back(cat("--resume ", path, ": the checkpoint does not record its model and data file (written by an "
                           "older piper): they cannot be checked against this job; only job.seed and data.sampler are"));
  return warnings;
}

}  // namespace piper
