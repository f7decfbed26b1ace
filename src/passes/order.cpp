// order: happens-before edges between consecutive slots of matched compute nodes. Nodes inside one slot
// may interleave. Rejects filters that match nothing, orders spanning device sets, and cycles.
#include <set>

#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void apply_order(Graph& g, const Directive& d) {
  std::vector<std::vector<int>> slots;
  std::set<int> seen;
  int set = -1, set_node = -1;
  for (size_t i = 0; i < d.slots.size(); ++i) {
    std::vector<int> nodes;
    for (size_t j = 0; j < d.slots[i].size(); ++j) {
      const Filter& f = d.slots[i][j];
      size_t before = nodes.size();
      for (const auto& n : g.nodes) {
        if (n.removed || !is_compute(n.kind) || !filter_matches(f, n)) continue;
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
