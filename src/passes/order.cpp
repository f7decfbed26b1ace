// order: happens-before edges between consecutive slots of matched compute nodes. Nodes inside one slot
// may interleave. Rejects filters that match nothing, orders spanning device sets, and cycles.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// The live compute nodes, in id order, and the same by each (tag, value) they carry: a filter is tried on
// the nodes of its most selective exact tag only, so that an order costs its matches, not slots × nodes.
struct ComputeIndex {
  std::vector<int> all;
  std::map<std::pair<std::string, int>, std::vector<int>> by_tag;

  explicit ComputeIndex(const Graph& g) {
    for (const auto& n : g.nodes) {
      if (n.removed || !is_compute(n.kind)) continue;
      all.push_back(n.id);
      for (const auto& [tag, value] : n.tags) by_tag[{tag, value}].push_back(n.id);
    }
  }
  // Nodes that may match `f`, in id order: a superset of its matches.
  const std::vector<int>& candidates(const Filter& f) const {
    static const std::vector<int> none;
    const std::vector<int>* best = &all;
    for (const auto& [tag, m] : f.match) {
      if (tag == "PASS" || m.kind != TagMatch::Kind::Int) continue;
      auto it = by_tag.find({tag, int(m.value)});
      if (it == by_tag.end()) return none;
      if (it->second.size() < best->size()) best = &it->second;
    }
    return *best;
  }
};

}  // namespace

void apply_order(Graph& g, const Directive& d) {
  std::vector<std::vector<int>> slots;
  std::set<int> seen;
  int set = -1, set_node = -1;
  const ComputeIndex index(g);
  for (size_t i = 0; i < d.slots.size(); ++i) {
    std::vector<int> nodes;
    for (size_t j = 0; j < d.slots[i].size(); ++j) {
      const Filter& f = d.slots[i][j];
      size_t before = nodes.size();
      for (int id : index.candidates(f)) {
        const Node& n = g.nodes[size_t(id)];
        if (!filter_matches(f, n)) continue;
        if (seen.count(n.id))
          throw UserError(cat(d.describe(), ": ", n.label(), " is matched by two slots (again by slot ", i, " filter ",
                              f.str(), ")"));
        seen.insert(n.id);
        nodes.push_back(n.id);
        if (set < 0) { set = n.device_set; set_node = n.id; }
        if (n.device_set != set)
          throw UserError(cat(d.describe(), ": slot ", i, " filter ", f.str(), " matches ", n.label(), " on device set ",
                              n.device_set, " but ", g.nodes[size_t(set_node)].label(), " is on device set ", set,
                              "; an order applies to one device set (write one order per pipeline rank)"));
      }
      if (nodes.size() == before) {
        // Say why: a PASS the graph does not have is the usual mistake.
        std::string hint;
        auto it = f.match.find("PASS");
        if (it != f.match.end() && it->second.kind == TagMatch::Kind::Name && it->second.name == "B")
          hint = " (this region's backward is split into BI and BW by another order)";
        throw UserError(cat(d.describe(), ": slot ", i, " filter ", f.str(), " matches no compute node", hint));
      }
    }
    slots.push_back(std::move(nodes));
  }
  for (size_t i = 0; i + 1 < slots.size(); ++i)
    for (int a : slots[i])
      for (int b : slots[i + 1]) g.add_edge(a, b, EdgeKind::Order, {}, d.index);
  g.check_acyclic(d.describe());
}

}  // namespace piper
