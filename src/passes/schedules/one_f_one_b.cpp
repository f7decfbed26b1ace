// 1F1B: stage s warms up with min(p-1-s, m) forwards, then alternates one forward and one backward,
// then drains the remaining backwards; at most p microbatches are in flight.
#include <algorithm>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

std::vector<std::vector<Slot>> one_f_one_b_slots(const ScheduleContext& ctx) {
  const int p = ctx.stages, m = ctx.microbatches;
  std::vector<std::vector<Slot>> out;
  for (const auto& stages : ctx.ranks) {
    if (stages.size() != 1)
      throw UserError(cat("schedule kind = \"1f1b\" needs one stage per pipeline rank, but one rank holds ",
                          stages.size(), " stages; use kind = \"interleaved-1f1b\""));
    const int s = stages[0];
    const int warmup = std::min(p - 1 - s, m);
    std::vector<Slot> slots;
    for (int i = 0; i < warmup; ++i) slots.push_back({{"F", s, i}});
    for (int i = 0; i < m - warmup; ++i) {
      slots.push_back({{"F", s, warmup + i}});
      slots.push_back({{"B", s, i}});
    }
    for (int i = m - warmup; i < m; ++i) slots.push_back({{"B", s, i}});
    out.push_back(std::move(slots));
  }
  return out;
}

}  // namespace piper
