// The --metrics file: one JSON line per step, written by rank 0.
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

// The "step" of one metrics line, or -1 when the line has none.
int64_t metrics_line_step(const std::string& line);

}  // namespace piper
