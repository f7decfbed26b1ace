// This process's resident memory as Linux reports it (/proc/self/status), and a reset of its peak, so that
// the growth of one phase (a checkpoint save) can be measured on its own. Zero where it cannot be read.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace piper {

namespace detail {
// The value of a "Name:   N kB" line of /proc/self/status, in bytes; 0 when missing.
inline int64_t proc_status_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t bytes = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long kb = 0;
      if (std::sscanf(line + n + 1, "%lld", &kb) == 1) bytes = int64_t(kb) * 1024;
      break;
    }
  std::fclose(f);
  return bytes;
}
}  // namespace detail

inline int64_t resident_bytes() { return detail::proc_status_bytes("VmRSS"); }
inline int64_t peak_resident_bytes() { return detail::proc_status_bytes("VmHWM"); }

// Sets the peak (VmHWM) to the current resident size; false where the kernel does not allow it.
inline bool reset_peak_resident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace piper
