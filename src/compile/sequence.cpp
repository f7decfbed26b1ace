// One global topological order of the training DAG, restricted to each device set: the order in which
// that set's plan issues its nodes. Ready communication goes first; compute breaks ties by microbatch,
// so an unordered set runs F0 B0 F1 B1 ..., except that consumers of an all-to-all wait for other work. Parameter gathers that no node waits on are left out here:
// the lowering issues them one use ahead.
#include "compile/sequence.hpp"

#include <queue>
#include <tuple>

namespace piper {

bool node_on_set(const Node& n, int set) {
  if (n.removed) return false;
  if (n.purpose == CommPurpose::StepSync) return true;
  if (n.purpose == CommPurpose::TiedGradient) {
    for (int s : n.tie_sets)
      if (s == set) return true;
    return false;
  }
  return n.device_set == set;
}

bool is_prefetched_gather(const Node& n) { return n.gather_for >= 0; }

std::vector<std::vector<int>> set_sequences(const Graph& g) {
  auto out = g.out_edges();
  std::vector<int> indeg(g.nodes.size(), 0);
  for (const auto& e : g.edges)
    if (!e.removed) ++indeg[size_t(e.to)];
  // A node that consumes an exchange yields to other ready compute, so that the exchange can run while
  // something else computes (another microbatch in the same slot).
  std::vector<char> after_exchange(g.nodes.size(), 0);
  for (const auto& e : g.edges)
    if (!e.removed && g.nodes[size_t(e.from)].kind == NodeKind::ALL_TO_ALL) after_exchange[size_t(e.to)] = 1;
  // (class, after an exchange, rank, kind, id): class 0 communication, 1 compute and updates; rank is the
  // microbatch, or for consumers of an exchange the order in which they became ready, so that the oldest
  // exchange's consumer goes first and two microbatches' chains alternate around their exchanges.
  using Key = std::tuple<int, int, int, int, int>;
  int became_ready = 0;
  auto key = [&](int id) {
    const Node& n = g.nodes[size_t(id)];
    int cls = is_comm(n.kind) ? 0 : 1;
    int kind_rank = n.kind == NodeKind::F ? 1 : 0;
    const int delayed = after_exchange[size_t(id)];
    return Key{cls, delayed, delayed ? became_ready++ : n.mb, kind_rank, id};
  };
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (const auto& n : g.nodes)
    if (!n.removed && indeg[size_t(n.id)] == 0) ready.push(key(n.id));
  std::vector<int> order;
  while (!ready.empty()) {
    int id = std::get<4>(ready.top());
    ready.pop();
    order.push_back(id);
    for (int ei : out[size_t(id)]) {
      int to = g.edges[size_t(ei)].to;
      if (--indeg[size_t(to)] == 0) ready.push(key(to));
    }
  }
  std::vector<std::vector<int>> seq(g.sets.size());
  for (int id : order) {  // each node to the sets node_on_set names, without trying every set
    const Node& n = g.nodes[size_t(id)];
    if (is_prefetched_gather(n)) continue;
    if (n.purpose == CommPurpose::StepSync) {
      for (auto& s : seq) s.push_back(id);
    } else if (n.purpose == CommPurpose::TiedGradient) {
      for (size_t s = 0; s < g.sets.size(); ++s)
        if (node_on_set(n, int(s))) seq[s].push_back(id);
    } else if (n.device_set >= 0 && size_t(n.device_set) < g.sets.size()) {
      seq[size_t(n.device_set)].push_back(id);
    }
  }
  return seq;
}

}  // namespace piper
