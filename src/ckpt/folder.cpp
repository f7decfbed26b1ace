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

void prune_checkpoints(const std::string& dir, int keep, const std::string& newest_verified) {
  if (keep <= 0) return;
  std::vector<std::string> files = list_checkpoints(dir);
  std::error_code ec;
  for (size_t i = size_t(keep); i < files.size(); ++i)
    if (name_step(fs::path(files[i]).filename().string()) >= 0 && !fs::equivalent(files[i], newest_verified, ec))
      fs::remove(files[i], ec);
}

}  // namespace piper
