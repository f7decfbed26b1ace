// After lowering: which buffers each instruction reads and writes, the cross-stream waits that follow
// (read-after-write, write-after-read, write-after-write), buffer use counts, and the memory estimate.
#pragma once
#include <vector>

#include "plan/plan.hpp"

namespace piper {

void finalize_plan(Plan& p);

}  // namespace piper
