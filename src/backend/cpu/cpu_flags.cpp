// /proc/cpuinfo's flags (see cpu_flags.hpp), read on first use.
#include "backend/cpu/cpu_flags.hpp"

#include <fstream>
#include <sstream>

namespace piper {

const std::set<std::string>& cpu_flags() {
  static const std::set<std::string> flags = [] {
    std::set<std::string> out;
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) out.insert(w);
      break;
    }
    return out;
  }();
  return flags;
}

}  // namespace piper
