// Implementation of the internal-invariant failure path used by PIPER_CHECK.
#include "util/error.hpp"

namespace piper {

void fail_check(const char* file, int line, const std::string& what) {
  throw SystemError(cat(file, ":", line, ": internal check failed: ", what));
}

}  // namespace piper
