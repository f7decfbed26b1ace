// The --metrics file, written by rank 0: one JSON line per step, or with a name ending in .csv a header and one
// comma-separated row per step.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace piper {

// Opens `path` for a run that starts at step `start` (completed steps). From scratch (start 0) the file is
// emptied. A resumed run keeps only the lines of steps <= start — a stopped run may have logged steps past
// its last checkpoint, which the resumed run trains again — rewriting the file through a temporary file and
// a rename, then appends: every step appears once. Throws SystemError when the file cannot be written.
void open_metrics(std::ofstream& out, const std::string& path, int64_t start);

// The "step" of one metrics line (JSON, or a CSV row), or -1 when the line has none.
int64_t metrics_line_step(const std::string& line);

// A --metrics path ending in .csv: rows of kMetricsCsvHeader's columns
bool metrics_is_csv(const std::string& path);
inline constexpr const char* kMetricsCsvHeader =
    "step,loss,lr,grad_norm,tokens_per_s,ms,flops_per_s,mfu,peak_bytes,xent,balance_loss,skipped,val_loss";

// One step's values in the CSV columns; xent and balance_loss only with a balance loss (else empty cells).
struct MetricsCsvRow {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, ms = 0, flops_per_s = 0, mfu = 0;
  uint64_t peak_bytes = 0;
  bool balance = false;
  double xent = 0, balance_loss = 0;
  bool skipped = false;
  bool evaluated = false;  // val_loss holds the step's evaluation ([eval]); else an empty cell
  double val_loss = 0;
};
std::string metrics_csv_row(const MetricsCsvRow& r);

}  // namespace piper
