// Schedule generators: each turns one `schedule` directive into `order` directives, one per pipeline
// rank, that a user could have written by hand (and can print with --dry-run).
#pragma once
#include <string>
#include <vector>

#include "config/job.hpp"

namespace piper {

struct ScheduleContext {
  std::string tag = "PP";  // the pipeline dimension
  int stages = 1;          // p: values of the tag
  int microbatches = 1;    // m
  // Stages grouped by the device set that runs them, each group in stage order (from the place
  // directives); one group per pipeline rank.
  std::vector<std::vector<int>> ranks;
  int first_index = 0;     // index given to the first generated directive
  std::string base_dir;    // where relative schedule files are looked up (the job file's folder)
};

// One slot entry: a pass of one stage for one microbatch.
struct Action {
  std::string pass;  // F, B, BI, BW
  int stage = 0;
  int mb = 0;
};
using Slot = std::vector<Action>;  // actions that may interleave

// Builds the order directive of one pipeline rank from its slots.
Directive order_from_slots(const ScheduleContext& ctx, const Directive& schedule, const std::vector<Slot>& slots);

std::vector<Directive> generate_schedule(const Directive& schedule, const ScheduleContext& ctx);

// The per-rank slot lists of each kind (exposed for tests and the cost model).
std::vector<std::vector<Slot>> gpipe_slots(const ScheduleContext& ctx);
std::vector<std::vector<Slot>> one_f_one_b_slots(const ScheduleContext& ctx);
std::vector<std::vector<Slot>> interleaved_slots(const ScheduleContext& ctx);
std::vector<std::vector<Slot>> zb_h1_slots(const ScheduleContext& ctx);
std::vector<std::vector<Slot>> dualpipev_slots(const ScheduleContext& ctx);
// `path` is a .toml or .csv action list (see from_file.cpp) for a pipeline of `pipeline_ranks` ranks; a
// rank past them is an error naming the file and line.
std::vector<std::vector<Slot>> file_slots(const std::string& path, size_t pipeline_ranks);

}  // namespace piper
