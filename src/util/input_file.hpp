// The files a user names as input (job file, schedule file, checkpoint, data file): only a regular file is
// read, a FIFO, device or folder is refused at once (never waited on), and a file past its limit is not read.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

constexpr uint64_t kMaxJobFileBytes = uint64_t(16) << 20;       // job files (TOML)
constexpr uint64_t kMaxScheduleFileBytes = uint64_t(64) << 20;  // schedule action lists (TOML or CSV)

// "" when `path` (its symbolic links followed) is a regular file; otherwise what it is, for a message:
// "does not exist", "is a folder, not a regular file", "is a FIFO (named pipe), not a regular file", ...
std::string not_regular_file(const std::string& path);

// The whole content of the regular file `path`, which must hold at most `limit` bytes. Opens it without
// blocking (a FIFO swapped in after the check is refused too). Throws UserError "PATH: the WHAT ..." naming
// what is wrong: missing, unreadable, not a regular file, or larger than the limit (checked before reading).
std::string read_input_file(const std::string& path, const std::string& what, uint64_t limit);

}  // namespace piper
