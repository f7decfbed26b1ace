// After lowering: which buffers each instruction reads and writes, the cross-stream waits that follow
// (read-after-write, write-after-read, write-after-write) and buffer use counts; after the simulation of every
// rank's plan, the memory estimate.
#pragma once
#include <vector>

#include "plan/plan.hpp"

namespace piper {

void finalize_plan(Plan& p);

// The per-kind memory estimate (Plan::memory), each send done where the simulation of every rank's plan says it
// completes: `send_done[i]` is, for a send i, the position of the first instruction that starts after its receiver
// has taken it (other entries are ignored; an empty vector: every send done by the next compute instruction).
void estimate_memory(Plan& p, const std::vector<size_t>& send_done);

}  // namespace piper
