// The --metrics file (see metrics_file.hpp).
#include "app/metrics_file.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "util/error.hpp"

namespace piper {

bool metrics_is_csv(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
}

namespace {

// a CSV cell: the number as JSON would write it ("" for a non-finite value, a missing measurement)
std::string cell(double v) {
  if (!std::isfinite(v)) return "";
  char s[32];
  std::snprintf(s, sizeof(s), "%.9g", v);
  return s;
}

}  // namespace

std::string metrics_csv_row(const MetricsCsvRow& r) {
  return cat(r.step, ",", cell(r.loss), ",", cell(r.lr), ",", cell(r.grad_norm), ",", cell(r.tokens_per_s), ",",
             cell(r.ms), ",", cell(r.flops_per_s), ",", cell(r.mfu), ",", r.peak_bytes, ",",
             r.balance ? cell(r.xent) : "", ",", r.balance ? cell(r.balance_loss) : "", ",", r.skipped ? "1" : "", ",",
             r.evaluated ? cell(r.val_loss) : "");
}

int64_t metrics_line_step(const std::string& line) {
  if (!line.empty() && line[0] >= '0' && line[0] <= '9') {  // a CSV row: the step is its first cell
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(line.c_str(), &end, 10);
    return end && *end == ',' && errno == 0 ? int64_t(v) : -1;
  }
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
        if (((step >= 0 && step <= start) || line == kMetricsCsvHeader) && !in.eof()) keep.push_back(line);
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
  std::error_code ec;
  const bool fresh = start == 0 || !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
  out.open(path, fresh ? std::ios::trunc : std::ios::app);
  if (!out) throw SystemError(cat("--metrics: cannot open '", path, "' for writing"));
  if (fresh && metrics_is_csv(path)) out << kMetricsCsvHeader << '\n' << std::flush;
}

}  // namespace piper
