// Runs the directive passes in the fixed phase order and checks what no single pass can: that the batch
// divides into replicas and microbatches, and that every multi-rank device set is replicated.
#include <filesystem>
#include <map>

#include "ir/build.hpp"
#include "passes/passes.hpp"
#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// Stages of `tag` grouped by the device set their place directive gives them, in stage order.
std::vector<std::vector<int>> stage_groups(const Graph& g, const std::vector<Directive>& places, const std::string& tag,
                                           int stages) {
  std::vector<std::vector<int>> devices_of(static_cast<size_t>(stages));
  for (const auto& d : places)
    for (const auto& r : g.regions) {
      auto it = r.tags.find(tag);
      if (it == r.tags.end() || !filter_matches_region(d.filter, r)) continue;
      devices_of[size_t(it->second)] = d.devices;
    }
  std::vector<std::vector<int>> groups;
  std::vector<std::vector<int>> group_devices;
  for (int s = 0; s < stages; ++s) {
    size_t gi = 0;
    while (gi < groups.size() && group_devices[gi] != devices_of[size_t(s)]) ++gi;
    if (gi == groups.size()) {
      groups.emplace_back();
      group_devices.push_back(devices_of[size_t(s)]);
    }
    groups[gi].push_back(s);
  }
  return groups;
}

ScheduleContext schedule_context(const Graph& g, const JobSpec& spec, const std::vector<Directive>& places,
                                 const std::string& tag, int microbatches, const Directive* schedule) {
  ScheduleContext ctx;
  ctx.tag = tag;
  ctx.microbatches = microbatches;
  const Annotation* ann = nullptr;
  for (const auto& a : spec.annotations)
    if (a.tag == tag) ann = &a;
  if (!ann)
    throw UserError(cat(schedule ? schedule->describe() : std::string("the default schedule"), ": no [[annotate]] with tag = \"",
                        tag, "\" defines the pipeline stages"));
  ctx.stages = int(segment_ranges(*g.model, *ann).size());
  ctx.ranks = stage_groups(g, places, tag, ctx.stages);
  ctx.first_index = int(spec.directives.size());
  ctx.base_dir = std::filesystem::path(spec.path).parent_path().string();
  return ctx;
}

}  // namespace

std::vector<Directive> apply_directives(Graph& g, const JobSpec& spec) {
  std::vector<Directive> splits, places, replicates, shards, tps, orders, schedules, recomputes;
  for (const auto& d : spec.directives) {
    if (d.op == "split") splits.push_back(d);
    else if (d.op == "place") places.push_back(d);
    else if (d.op == "replicate") replicates.push_back(d);
    else if (d.op == "shard") shards.push_back(d);
    else if (d.op == "tp") tps.push_back(d);
    else if (d.op == "order") orders.push_back(d);
    else if (d.op == "schedule") schedules.push_back(d);
    else if (d.op == "recompute") recomputes.push_back(d);
  }
  if (schedules.size() > 1)
    throw UserError(cat(schedules[1].describe(), ": a second schedule; ", schedules[0].describe(), " already schedules the job"));
  int microbatches = 1;
  for (const auto& d : splits) microbatches = d.count;

  std::vector<Directive> applied = spec.directives;
  auto add_generated = [&](std::vector<Directive> gen) {
    for (auto& d : gen) {
      orders.push_back(d);
      applied.push_back(d);
    }
  };
  if (!schedules.empty()) {
    const Directive& s = schedules[0];
    add_generated(generate_schedule(s, schedule_context(g, spec, places, s.tag, microbatches, &s)));
  } else if (orders.empty()) {
    // Default: 1F1B over the PP annotation when its stages sit on different device sets.
    bool has_pp = false;
    for (const auto& a : spec.annotations) has_pp |= a.tag == "PP";
    if (has_pp && !places.empty()) {
      ScheduleContext ctx = schedule_context(g, spec, places, "PP", microbatches, nullptr);
      bool one_stage_each = ctx.ranks.size() > 1;
      for (const auto& r : ctx.ranks) one_stage_each &= r.size() == 1;
      if (one_stage_each) {
        Directive def;
        def.op = "schedule";
        def.kind = "1f1b";
        def.index = -1;
        def.generated = true;
        def.loc.file = "default schedule";
        add_generated(generate_schedule(def, ctx));
      }
    }
  }

  for (const auto& d : splits) apply_split(g, d);
  apply_split_backward(g, orders);
  apply_place(g, places);
  for (const auto& d : tps) mark_tensor_parallel(g, d);
  check_tensor_parallel_sets(g);
  mark_sequence_parts(g);

  // a tensor-parallel group works on the same samples: a set's replicas are its groups
  const int replicas = int(g.sets[0].ranks.size()) / g.sets[0].tp;
  if (g.global_batch % replicas != 0)
    throw UserError(cat("data.batch = ", g.global_batch, " does not divide among the ", replicas,
                        " replicas of each device set; use a multiple of ", replicas));
  const int per_replica = g.global_batch / replicas;
  if (per_replica % g.microbatches != 0) {
    std::string who = splits.empty() ? std::string("the split") : splits.back().describe();
    throw UserError(cat(who, ": ", g.microbatches, " microbatches do not divide the per-replica batch of ", per_replica,
                        " (data.batch = ", g.global_batch, " over ", replicas, " replicas)"));
  }
  g.samples_per_microbatch = per_replica / g.microbatches;
  check_tensor_parallel_samples(g);

  insert_send_recv(g);
  for (const auto& d : shards) mark_shard(g, d);
  for (const auto& d : replicates) mark_replicate(g, d);
  reduce_tensor_parallel_regions(g);
  for (const auto& r : g.regions) {
    const auto& set = g.sets[size_t(r.device_set)];
    if (set.ranks.size() > 1 && r.zero < 0 && has_copies(g, r)) {
      std::string which = set.directive >= 0 ? cat("the device set of directive #", set.directive)
                                             : std::string("all ranks, as no place directive is given");
      throw UserError(cat(r.label(), " runs on ", set.ranks.size(), " ranks (", which,
                          ") but no replicate directive covers it; add op = \"replicate\" (or [mesh] dp = ",
                          set.ranks.size(), ")"));
    }
  }
  make_buckets(g);
  insert_exchanges(g);
  insert_tensor_parallel_sums(g);
  insert_sequence_gathers(g);
  insert_replication(g);
  insert_tied_sync(g);
  apply_orders(g, orders);  // and the cycle check of the whole graph
  apply_recompute(g, recomputes);
  return applied;
}

}  // namespace piper
