// GPipe: every rank runs all forwards, then all backwards (m microbatches in flight).
#include "passes/schedules/schedules.hpp"

namespace piper {

std::vector<std::vector<Slot>> gpipe_slots(const ScheduleContext& ctx) {
  std::vector<std::vector<Slot>> out;
  for (const auto& stages : ctx.ranks) {
    std::vector<Slot> slots;
    for (int s : stages)
      for (int m = 0; m < ctx.microbatches; ++m) slots.push_back({{"F", s, m}});
    for (auto it = stages.rbegin(); it != stages.rend(); ++it)
      for (int m = 0; m < ctx.microbatches; ++m) slots.push_back({{"B", *it, m}});
    out.push_back(std::move(slots));
  }
  return out;
}

}  // namespace piper
