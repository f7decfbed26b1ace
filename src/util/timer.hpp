// Wall-clock helpers: monotonic seconds for timing steps and compile phases.
#pragma once
#include <chrono>

namespace piper {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace piper
