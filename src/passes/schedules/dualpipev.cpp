// DualPipeV: a V layout — pipeline rank r holds stages r and 2p−1−r, so every microbatch runs forward
// down ranks 0..p−1 (stages 0..p−1) and back up (stages p..2p−1); the loss is on rank 0. Each rank runs
// eight phases: forwards of its first stage, forwards of both, zero-bubble backward/weight/forward triples,
// the main loop whose slots pair the forward of one stage with the backward of the other (so they can
// overlap), then the drain, where weight passes deferred from the backward fill the gaps. Needs m ≥ 2p.
#include <algorithm>
#include <deque>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

std::vector<std::vector<Slot>> dualpipev_slots(const ScheduleContext& ctx) {
  const int p = int(ctx.ranks.size()), m = ctx.microbatches;
  if (ctx.stages != 2 * p)
    throw UserError(cat("schedule kind = \"dualpipev\" needs 2 stages per pipeline rank (", 2 * p, " stages for ", p,
                        " ranks), found ", ctx.stages));
  for (int r = 0; r < p; ++r) {
    const auto& st = ctx.ranks[size_t(r)];
    if (st.size() != 2 || st[0] != r || st[1] != 2 * p - 1 - r)
      throw UserError(cat("schedule kind = \"dualpipev\" needs the V layout: pipeline rank ", r, " must hold stages ", r,
                          " and ", 2 * p - 1 - r));
  }
  if (m < 2 * p)
    throw UserError(cat("schedule kind = \"dualpipev\" needs at least 2 × ", p, " = ", 2 * p, " microbatches, found ", m));
  std::vector<std::vector<Slot>> out;
  for (int r = 0; r < p; ++r) {
    const int s0 = r, s1 = 2 * p - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    std::deque<Action> deferred;  // weight passes put off by zero-bubble backwards
    std::vector<Slot> slots;
    auto F = [&](int chunk) { return Action{"F", chunk == 0 ? s0 : s1, chunk == 0 ? f0++ : f1++}; };
    // A full backward (BI then BW of the same microbatch), or a zero-bubble one whose BW is deferred.
    auto B = [&](int chunk, bool zero_bubble, Slot& slot) {
      const int s = chunk == 0 ? s0 : s1;
      const int mb = chunk == 0 ? b0++ : b1++;
      slot.push_back({"BI", s, mb});
      if (zero_bubble) deferred.push_back({"BW", s, mb});
      else slot.push_back({"BW", s, mb});
    };
    auto alone = [&](Action a) { slots.push_back({a}); };
    auto backward = [&](int chunk, bool zero_bubble) {
      Slot slot;
      B(chunk, zero_bubble, slot);
      slots.push_back(slot);
    };
    auto weight = [&] {
      if (deferred.empty()) return;
      alone(deferred.front());
      deferred.pop_front();
    };
    auto forward_backward = [&](int fchunk, int bchunk) {  // one slot: may interleave and overlap
      Slot slot{F(fchunk)};
      B(bchunk, false, slot);
      slots.push_back(slot);
    };
    for (int i = 0; i < (p - r - 1) * 2; ++i) alone(F(0));            // 1: nF0
    for (int i = 0; i < r + 1; ++i) {                                  // 2: nF0F1
      alone(F(0));
      alone(F(1));
    }
    for (int i = 0; i < p - r - 1; ++i) {                              // 3: nB1W1F1
      backward(1, true);
      weight();
      alone(F(1));
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {                      // 4: nF0B1F1B0 (main)
      forward_backward(0, 1);
      forward_backward(1, 0);
    }
    for (int i = 0; i < p - r - 1; ++i) {                              // 5: nB1F1B0
      backward(1, false);
      forward_backward(1, 0);
    }
    for (int i = 0; i < r + 1; ++i) {                                  // 6: nB1B0, zero bubble in the second half
      backward(1, 2 * i >= r + 1);
      backward(0, 2 * i + 1 >= r + 1);
    }
    for (int i = 0; i < p - r - 1; ++i) {                              // 7: nWB0
      weight();
      backward(0, true);
    }
    while (!deferred.empty()) weight();                                // 8: nW
    PIPER_CHECK(f0 == m && f1 == m && b0 == m && b1 == m, "dualpipev phases cover ", f0, "/", f1, "/", b0, "/", b1,
                " of ", m, " microbatches on rank ", r);
    out.push_back(std::move(slots));
  }
  return out;
}

}  // namespace piper
