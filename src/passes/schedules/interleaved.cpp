// Interleaved 1F1B: v regions ("chunks") per pipeline rank, stage s on rank s mod p. The k-th forward of
// rank r runs chunk (k / p) mod v of microbatch (k / (p·v))·p + k mod p; backwards run the chunks in reverse.
// Warm-up: (p − r − 1)·2 + (v − 1)·p forwards. Needs m to be a multiple of p.
#include <algorithm>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

std::vector<std::vector<Slot>> interleaved_slots(const ScheduleContext& ctx) {
  const int p = int(ctx.ranks.size()), m = ctx.microbatches;
  if (p < 1 || ctx.stages % p != 0)
    throw UserError(cat("schedule kind = \"interleaved-1f1b\": ", ctx.stages, " stages do not divide among ", p,
                        " pipeline ranks"));
  const int v = ctx.stages / p;
  for (int r = 0; r < p; ++r)
    for (int c = 0; c < v; ++c)
      if (ctx.ranks[size_t(r)].size() != size_t(v) || ctx.ranks[size_t(r)][size_t(c)] != c * p + r)
        throw UserError(cat("schedule kind = \"interleaved-1f1b\" needs stage s on pipeline rank s mod ", p,
                            "; the pipeline rank holding stage ", ctx.ranks[size_t(r)][0], " holds ",
                            ctx.ranks[size_t(r)].size(), " stages, not stages ", r, ", ", r + p, ", ..."));
  if (m % p != 0)
    throw UserError(cat("schedule kind = \"interleaved-1f1b\" needs the microbatch count (", m,
                        ") to be a multiple of the pipeline ranks (", p, ")"));
  const int total = m * v;
  auto stage_of = [&](int k, int r, bool forward) {
    int chunk = (k / p) % v;
    if (!forward) chunk = v - 1 - chunk;
    return chunk * p + r;
  };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  std::vector<std::vector<Slot>> out;
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    std::vector<Slot> slots;
    for (int k = 0; k < warmup; ++k) slots.push_back({{"F", stage_of(k, r, true), mb_of(k)}});
    for (int i = 0; i < total - warmup; ++i) {
      slots.push_back({{"F", stage_of(warmup + i, r, true), mb_of(warmup + i)}});
      slots.push_back({{"B", stage_of(i, r, false), mb_of(i)}});
    }
    for (int k = total - warmup; k < total; ++k) slots.push_back({{"B", stage_of(k, r, false), mb_of(k)}});
    out.push_back(std::move(slots));
  }
  return out;
}

}  // namespace piper
