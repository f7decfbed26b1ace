// Dispatch from a schedule directive to its generator, and conversion of slots into order directives.
#include <filesystem>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

Directive order_from_slots(const ScheduleContext& ctx, const Directive& schedule, const std::vector<Slot>& slots) {
  Directive d;
  d.op = "order";
  d.loc = schedule.loc;
  d.generated = true;
  d.generated_by = schedule.index;
  for (const auto& slot : slots) {
    std::vector<Filter> filters;
    for (const auto& a : slot) {
      Filter f;
      f.match[ctx.tag] = TagMatch{TagMatch::Kind::Int, a.stage, ""};
      f.match["MB"] = TagMatch{TagMatch::Kind::Int, a.mb, ""};
      f.match["PASS"] = TagMatch{TagMatch::Kind::Name, 0, a.pass};
      filters.push_back(f);
    }
    d.slots.push_back(std::move(filters));
  }
  return d;
}

std::vector<Directive> generate_schedule(const Directive& schedule, const ScheduleContext& ctx) {
  std::vector<std::vector<Slot>> per_rank;
  try {
    if (schedule.kind == "gpipe") per_rank = gpipe_slots(ctx);
    else if (schedule.kind == "1f1b") per_rank = one_f_one_b_slots(ctx);
    else if (schedule.kind == "interleaved-1f1b") per_rank = interleaved_slots(ctx);
    else if (schedule.kind == "zb-h1") per_rank = zb_h1_slots(ctx);
    else if (schedule.kind == "dualpipev") per_rank = dualpipev_slots(ctx);
    else if (schedule.kind == "file") {
      std::filesystem::path f(schedule.file);
      if (f.is_relative() && !ctx.base_dir.empty()) f = std::filesystem::path(ctx.base_dir) / f;
      per_rank = file_slots(f.string(), ctx.ranks.size());
    } else {
      throw UserError(cat("schedule kind \"", schedule.kind, "\" is not available"));
    }
  } catch (const UserError& e) {
    throw UserError(cat(schedule.describe(), ": ", e.what()));
  }
  std::vector<Directive> out;
  for (const auto& slots : per_rank) {
    Directive d = order_from_slots(ctx, schedule, slots);
    d.index = ctx.first_index + int(out.size());
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace piper
