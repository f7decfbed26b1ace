// ZB-H1 (zero bubble, same memory as 1F1B): backward is split into input-gradient (BI) and weight-gradient
// (BW) work. Stage r warms up with p − r − 1 forwards, then runs r forward + BI pairs whose BW is deferred;
// from then on every BI is followed by the oldest deferred BW, so r weight passes stay in hand to fill the
// drain; the first stage never defers. Bubble ≈ (p−1)(F + BI − BW) against 1F1B's (p−1)(F + BI + BW).
#include <algorithm>
#include <deque>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

std::vector<std::vector<Slot>> zb_h1_slots(const ScheduleContext& ctx) {
  const int p = ctx.stages, m = ctx.microbatches;
  std::vector<std::vector<Slot>> out;
  for (const auto& stages : ctx.ranks) {
    if (stages.size() != 1)
      throw UserError(cat("schedule kind = \"zb-h1\" needs one stage per pipeline rank, but one rank holds ",
                          stages.size(), " stages"));
    const int s = stages[0];
    std::vector<Slot> slots;
    std::deque<int> deferred;  // microbatches whose BW waits
    int f = 0, b = 0;
    auto forward = [&] { slots.push_back({{"F", s, f++}}); };
    auto backward_input = [&] {
      slots.push_back({{"BI", s, b}});
      deferred.push_back(b++);
    };
    auto weight = [&] {
      slots.push_back({{"BW", s, deferred.front()}});
      deferred.pop_front();
    };
    for (int i = 0; i < std::min(p - s - 1, m); ++i) forward();
    for (int i = 0; i < s && f < m; ++i) {
      forward();
      backward_input();
    }
    while (f < m) {
      forward();
      backward_input();
      if (s == 0 || f == m || deferred.size() > size_t(s)) weight();
    }
    while (b < m) {
      backward_input();
      weight();
    }
    while (!deferred.empty()) weight();
    out.push_back(std::move(slots));
  }
  return out;
}

}  // namespace piper
