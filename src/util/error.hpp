// Errors and checked calls. A UserError is bad input (job file, CLI, strategy): it names what and where
// and ends the job with exit code 2. CHECK-style macros report file:line for failed library calls.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace piper {

// Concatenates anything streamable into one string: cat("rank ", r, ": ", what).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Bad input from the user. Exit code 2, message printed once.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(what) {}
};

// Bad input one rank finds by itself while the job runs: the other ranks cannot know, so the rank prints it
// (with its number) and ends the whole job with exit code 2 (main.cpp).
class RankUserError : public UserError {
 public:
  explicit RankUserError(const std::string& what) : UserError(what) {}
};

// The data file changed size under a running job.
class DataFileChanged : public RankUserError {
 public:
  explicit DataFileChanged(const std::string& what) : RankUserError(what) {}
};

// A failure of the system or a library (I/O, MPI, HDF5): exit code 1.
class SystemError : public std::runtime_error {
 public:
  explicit SystemError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void fail_check(const char* file, int line, const std::string& what);

}  // namespace piper

#define PIPER_CHECK(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond)) ::piper::fail_check(__FILE__, __LINE__, ::piper::cat(__VA_ARGS__)); \
  } while (0)
