// The checkpoint folder (see folder.hpp): listing, the choice of the checkpoint to resume from, and
// pruning.
#include "ckpt/folder.hpp"

#include <algorithm>
#include <filesystem>

#include "ckpt/verify.hpp"
#include "util/error.hpp"

namespace piper {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The step in "step_00000100.h5", or -1 when the name has no plain number there.
long long name_step(const std::string& name) {
  if (name.size() <= 8 || name.rfind("step_", 0) != 0 || !ends_with(name, ".h5")) return -1;
  const std::string digits = name.substr(5, name.size() - 8);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && ends_with(name, ".h5")) found.push_back({name_step(name), e.path().string()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

ResumeChoice choose_resume_checkpoint(const std::string& resume, const std::string& dir) {
  ResumeChoice choice;
  auto take = [&](const std::string& path) {
    CheckpointInfo info = verify_checkpoint(path);
    choice.path = path;
    choice.step = info.step;
    if (!info.checksummed)
      choice.warnings.push_back(cat(path, ": format version ", info.format_version,
                                    " has no checksum; its attributes are not verified"));
  };
  if (resume != "auto") {
    take(resume);
    return choice;
  }
  std::vector<std::string> skipped;
  for (const std::string& path : list_checkpoints(dir)) {
    try {
      take(path);
      std::vector<std::string> warnings;
      for (const std::string& why : skipped) warnings.push_back(cat("skipped ", why));
      warnings.insert(warnings.end(), choice.warnings.begin(), choice.warnings.end());
      choice.warnings = warnings;
      return choice;
    } catch (const UserError& e) {
      skipped.push_back(e.what());
    }
  }
  if (!skipped.empty()) {
    std::string list;
    for (const std::string& why : skipped) list += "\n  " + why;
    throw UserError(cat("--resume auto: no checkpoint in '", dir, "' verifies:", list));
  }
  return choice;
}

void prune_checkpoints(const std::string& dir, int keep, const std::string& newest_verified) {
  if (keep <= 0) return;
  std::vector<std::string> files = list_checkpoints(dir);
  std::error_code ec;
  for (size_t i = size_t(keep); i < files.size(); ++i)
    if (name_step(fs::path(files[i]).filename().string()) >= 0 && !fs::equivalent(files[i], newest_verified, ec))
      fs::remove(files[i], ec);
}

}  // namespace piper
