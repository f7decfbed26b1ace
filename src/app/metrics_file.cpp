// The --metrics file (see metrics_file.hpp).
#include "app/metrics_file.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "util/error.hpp"

namespace piper {

int64_t metrics_line_step(const std::string& line) {
  const std::string key = "\"step\":";
  size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  const char* p = line.c_str() + at + key.size();
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(p, &end, 10);
  if (end == p || errno != 0 || v < 0) return -1;
  return int64_t(v);
}

void open_metrics(std::ofstream& out, const std::string& path, int64_t start) {
  if (start > 0) {
    std::vector<std::string> keep;
    bool dropped = false;
    if (std::ifstream in(path); in) {
      for (std::string line; std::getline(in, line);) {
        // a line cut short by a stopped run has no newline: it is dropped with the steps past `start`
        int64_t step = metrics_line_step(line);
        if (step >= 0 && step <= start && !in.eof()) keep.push_back(line);
        else dropped = true;
      }
    }
    if (dropped) {
      const std::string tmp = path + ".tmp";
      {
        std::ofstream t(tmp, std::ios::trunc);
        for (const auto& line : keep) t << line << '\n';
        t.flush();
        if (!t) throw SystemError(cat("--metrics: cannot write '", tmp, "': ", std::strerror(errno)));
      }
      std::error_code ec;
      std::filesystem::rename(tmp, path, ec);
      if (ec) throw SystemError(cat("--metrics: cannot rename '", tmp, "' to '", path, "': ", ec.message()));
    }
  }
  out.open(path, start > 0 ? std::ios::app : std::ios::trunc);
  if (!out) throw SystemError(cat("--metrics: cannot open '", path, "' for writing"));
}

}  // namespace piper
