// The checkpoint folder (see folder.hpp): its lock, stale temporary files, listing, the choice of the
// checkpoint to resume from, and pruning.
#include "ckpt/folder.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

void lock_checkpoint_folder(const std::string& dir, const std::string& job_name) {
  const std::string path = (fs::path(dir) / ".lock").string();
  // Held for the whole run: the descriptor is closed (and the lock released) when the process ends.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(cat("checkpoint.dir: cannot open the lock file ", path, ": ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(512, '\0');
    ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    ::close(fd);
    holder.resize(size_t(std::max<ssize_t>(n, 0)));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    for (char& c : holder)
      if (c == '\n') c = ' ';
    if (err == EWOULDBLOCK)
      throw UserError(cat("checkpoint.dir \"", dir, "\" is in use by another job (",
                          holder.empty() ? "holder unknown" : holder,
                          "); one job at a time may use a checkpoint folder (lock: ", path, ")"));
    throw UserError(cat("checkpoint.dir: cannot lock ", path, ": ", std::strerror(err)));
  }
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const std::string text = cat("host ", host, "\npid ", getpid(), "\njob ", job_name, "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()))
    throw SystemError(cat("cannot write the lock file ", path, ": ", std::strerror(errno)));
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step_", 0) == 0 && ends_with(name, ".h5.tmp") && e.is_regular_file(ec) && fs::remove(e.path(), ec))
      removed.push_back(e.path().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

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

ResumeChoice choose_resume_checkpoint(const std::string& resume, const std::string& dir, bool check_data,
                                      const std::vector<std::string>& refused) {
  ResumeChoice choice;
  auto take = [&](const std::string& path) {
    CheckpointInfo info = verify_checkpoint(path, "", check_data);
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
    if (std::find(refused.begin(), refused.end(), path) != refused.end()) {
      skipped.push_back(cat(path, ": its data does not verify (see above)"));
      continue;
    }
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

std::string damaged_folder(const std::string& dir) { return (fs::path(dir) / "damaged").string(); }

namespace {

// Moves `path` into dir/damaged/ under its own name (a free one: NAME, NAME.1, NAME.2, ...); returns the new path,
// or "" with `error` set when it could not be moved.
std::string move_aside(const std::string& dir, const std::string& path, std::string& error) {
  std::error_code ec;
  const fs::path folder = damaged_folder(dir);
  fs::create_directories(folder, ec);
  if (ec) {
    error = cat("cannot create ", folder.string(), ": ", ec.message());
    return "";
  }
  const std::string name = fs::path(path).filename().string();
  fs::path to = folder / name;
  for (int i = 1; fs::exists(to, ec) || fs::is_symlink(to, ec); ++i) to = folder / cat(name, ".", i);
  fs::rename(path, to, ec);
  if (ec) {
    error = cat("cannot move it to ", to.string(), ": ", ec.message());
    return "";
  }
  return to.string();
}

}  // namespace

PruneResult prune_checkpoints(const std::string& dir, int keep, const std::string& job_name,
                              const std::string& newest_verified, const std::vector<std::string>& known_damaged) {
  PruneResult result;
  if (keep <= 0) return result;
  std::error_code ec;
  std::vector<std::string> ours;  // this job's checkpoints that verify, newest first
  for (const std::string& path : list_checkpoints(dir)) {
    if (name_step(fs::path(path).filename().string()) < 0) continue;  // not a name piper writes: not ours to touch
    if (fs::equivalent(path, newest_verified, ec)) {
      ours.push_back(path);
      continue;
    }
    std::string why;
    if (std::find(known_damaged.begin(), known_damaged.end(), path) != known_damaged.end()) {
      why = "its data does not verify (found when it was loaded)";
    } else {
      try {
        CheckpointInfo info = verify_checkpoint(path, "", /*read_data=*/false);
        if (!info.job_name.empty() && info.job_name != job_name)
          why = cat("a checkpoint of another job ('", info.job_name, "', this job is '", job_name, "')");
      } catch (const UserError& e) {
        why = e.what();
      }
    }
    if (why.empty()) {
      ours.push_back(path);
      continue;
    }
    std::string error;
    const std::string to = move_aside(dir, path, error);
    result.moved.push_back(to.empty() ? cat(path, ": ", why, "; left in place, not counted: ", error)
                                      : cat(path, " -> ", to, ": ", why));
  }
  for (size_t i = size_t(keep); i < ours.size(); ++i)
    if (!fs::equivalent(ours[i], newest_verified, ec) && fs::remove(ours[i], ec)) result.removed.push_back(ours[i]);
  return result;
}

}  // namespace piper
