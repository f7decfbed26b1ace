// The CPUs this process may run on (its affinity mask; the machine's count where the mask cannot be read): the
// default compute threads of a run alone on a node.
#pragma once
#include <sched.h>

#include <thread>

namespace piper {

inline int usable_cores() {
  cpu_set_t set;
  int cores = int(std::thread::hardware_concurrency());
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  return cores > 0 ? cores : 1;
}

}  // namespace piper
