// The processor's instruction-set flags as Linux lists them (/proc/cpuinfo), read once: what the bf16 matmul paths
// and AMX tile products look for.
#pragma once
#include <set>
#include <string>

namespace piper {

// The words of /proc/cpuinfo's first "flags" line (empty where it cannot be read).
const std::set<std::string>& cpu_flags();

}  // namespace piper
