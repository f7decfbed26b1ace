// place: assigns regions to device sets (an SPMD group each; its size is the data-parallel degree).
// Rejects filters that match nothing, regions placed twice or never, overlapping or unequal sets, and
// rank lists that do not cover the world exactly.
#include <algorithm>
#include <set>

#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

std::string ranks_str(const std::vector<int>& r) {
  std::string s = "[";
  for (size_t i = 0; i < r.size(); ++i) s += cat(i ? ", " : "", r[i]);
  return s + "]";
}

}  // namespace

void apply_place(Graph& g, const std::vector<Directive>& places) {
  if (places.empty()) {
    // No placement: every region on one set of all ranks.
    DeviceSet all;
    for (int r = 0; r < g.world; ++r) all.ranks.push_back(r);
    g.sets.push_back(all);
    for (auto& r : g.regions) r.device_set = 0;
  }
  std::vector<int> set_of_rank(size_t(std::max(g.world, 0)), -1);  // device set of each rank placed so far
  for (const auto& d : places) {
    for (const auto& [tag, m] : d.filter.match)
      if (tag == "MB" || tag == "PASS")
        throw UserError(cat(d.describe(), ": place works on whole regions; its filter cannot name ", tag));
    for (int rank : d.devices)
      if (rank >= g.world)
        throw UserError(cat(d.describe(), ": devices ", ranks_str(d.devices), " name rank ", rank, " but the job runs on ",
                            g.world, " rank", g.world == 1 ? "" : "s", " (ranks 0..", g.world - 1,
                            "); the device counts do not match the world size"));
    // The set of the first rank decides: the same list is that set, anything else must share no rank.
    int set_id = d.devices.empty() ? -1 : set_of_rank[size_t(d.devices[0])];
    if (set_id >= 0 && g.sets[size_t(set_id)].ranks != d.devices) set_id = -1;
    if (set_id < 0) {
      for (int rank : d.devices) {
        const int s = set_of_rank[size_t(rank)];
        if (s < 0) continue;
        throw UserError(cat(d.describe(), ": devices ", ranks_str(d.devices), " overlap device set ",
                            ranks_str(g.sets[size_t(s)].ranks), " of directive #", g.sets[size_t(s)].directive, " (rank ",
                            rank, " in both); device sets must be equal or disjoint"));
      }
      g.sets.push_back(DeviceSet{d.devices, d.index, d.describe()});
      set_id = int(g.sets.size()) - 1;
      for (int rank : d.devices) set_of_rank[size_t(rank)] = set_id;
    }
    int matched = 0;
    for (auto& r : g.regions) {
      if (!filter_matches_region(d.filter, r)) continue;
      ++matched;
      if (r.device_set >= 0)
        throw UserError(cat(d.describe(), ": ", r.label(), " is already placed by directive #", r.place_directive));
      r.device_set = set_id;
      r.place_directive = d.index;
    }
    if (matched == 0) {
      std::string known;
      for (const auto& r : g.regions) known += " " + r.label() + ";";
      throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region (regions:", known, ")"));
    }
  }
  for (const auto& r : g.regions)
    if (r.device_set < 0)
      throw UserError(cat(r.label(), " (segments ", g.model->segments[size_t(r.seg_begin)].name, "..",
                          g.model->segments[size_t(r.seg_end - 1)].name, ") is not placed: add a place directive for it"));
  const size_t size0 = g.sets[0].ranks.size();
  for (const auto& s : g.sets)
    if (s.ranks.size() != size0)
      throw UserError(cat(s.origin, ": device set ", ranks_str(s.ranks), " has ", s.ranks.size(),
                          " ranks but device set ", ranks_str(g.sets[0].ranks), " of directive #", g.sets[0].directive,
                          " has ", size0, "; all device sets must have the same size"));
  std::set<int> covered;
  for (const auto& s : g.sets) covered.insert(s.ranks.begin(), s.ranks.end());
  if (int(covered.size()) != g.world) {
    std::vector<int> idle;
    for (int r = 0; r < g.world; ++r)
      if (!covered.count(r)) idle.push_back(r);
    throw UserError(cat("the place directives use ", covered.size(), " of the ", g.world, " ranks; ranks ", ranks_str(idle),
                        " hold nothing. The device counts do not match the world size: run with -np ", covered.size(),
                        " or place regions on every rank"));
  }
  for (auto& n : g.nodes)
    if (!n.removed && n.region >= 0) n.device_set = g.regions[size_t(n.region)].device_set;
}

}  // namespace piper
