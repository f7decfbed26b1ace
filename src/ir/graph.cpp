// Graph mechanics: adding nodes and edges, adjacency, acyclicity and topological order, filter matching.
#include "ir/graph.hpp"

#include <algorithm>
#include <queue>

#include "util/error.hpp"

namespace piper {

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::F: return "F";
    case NodeKind::B: return "B";
    case NodeKind::BI: return "BI";
    case NodeKind::BW: return "BW";
    case NodeKind::UPDATE: return "UPDATE";
    case NodeKind::SEND: return "SEND";
    case NodeKind::RECV: return "RECV";
    case NodeKind::ALL_REDUCE: return "ALL_REDUCE";
    case NodeKind::REDUCE_SCATTER: return "REDUCE_SCATTER";
    case NodeKind::ALL_GATHER: return "ALL_GATHER";
    case NodeKind::ALL_TO_ALL: return "ALL_TO_ALL";
    case NodeKind::R: return "R";
  }
  return "?";
}

const char* pass_name(NodeKind k) { return is_compute(k) || k == NodeKind::UPDATE ? node_kind_name(k) : ""; }

bool is_compute(NodeKind k) {
  return k == NodeKind::F || k == NodeKind::B || k == NodeKind::BI || k == NodeKind::BW || k == NodeKind::R;
}
bool is_comm(NodeKind k) { return !is_compute(k) && k != NodeKind::UPDATE; }

const char* comm_purpose_name(CommPurpose p) {
  switch (p) {
    case CommPurpose::Activation: return "activation";
    case CommPurpose::Gradient: return "gradient";
    case CommPurpose::TiedGradient: return "tied-gradient";
    case CommPurpose::ParamGather: return "param-gather";
    case CommPurpose::StepSync: return "step-sync";
  }
  return "?";
}

std::string TensorRef::str() const {
  switch (kind) {
    case Kind::None: return "";
    case Kind::Act: return cat("act", index, mb >= 0 ? cat(".mb", mb) : "");
    case Kind::ActGrad: return cat("dact", index, mb >= 0 ? cat(".mb", mb) : "");
    case Kind::Stash: return cat("stash", mb >= 0 ? cat(".mb", mb) : "");
    case Kind::Grads: return cat("grads.b", index, mb >= 0 ? cat(".mb", mb) : "");
    case Kind::Params: return cat("params.b", index);
    case Kind::Scalars: return "norm+loss";
  }
  return "?";
}

static std::string tags_str(const Tags& tags) {
  std::string s;
  for (const auto& [k, v] : tags) s += cat(s.empty() ? "" : ",", k, "=", v);
  return s;
}

std::string Node::label() const {
  std::string s = node_kind_name(kind);
  std::string t = tags_str(tags);
  if (is_comm(kind)) {
    std::string extra = tensor.str();
    if (bucket >= 0 && tensor.kind != TensorRef::Kind::Grads && tensor.kind != TensorRef::Kind::Params)
      extra += cat(extra.empty() ? "" : ",", "bucket", bucket);
    if (!extra.empty()) t += (t.empty() ? "" : ",") + extra;
  }
  return t.empty() ? s : s + "[" + t + "]";
}

std::string Region::label() const {
  std::string t = tags_str(tags);
  return t.empty() ? cat("region ", id) : cat("region ", id, " {", t, "}");
}

int Graph::add_node(Node n) {
  n.id = int(nodes.size());
  nodes.push_back(std::move(n));
  return nodes.back().id;
}

int Graph::add_edge(int from, int to, EdgeKind kind, TensorRef t, int directive) {
  Edge e;
  e.from = from;
  e.to = to;
  e.kind = kind;
  e.tensor = t;
  e.source_directive = directive;
  edges.push_back(e);
  return int(edges.size()) - 1;
}

std::vector<std::vector<int>> Graph::out_edges() const {
  std::vector<std::vector<int>> out(nodes.size());
  for (size_t i = 0; i < edges.size(); ++i)
    if (!edges[i].removed) out[size_t(edges[i].from)].push_back(int(i));
  return out;
}

std::vector<std::vector<int>> Graph::in_edges() const {
  std::vector<std::vector<int>> in(nodes.size());
  for (size_t i = 0; i < edges.size(); ++i)
    if (!edges[i].removed) in[size_t(edges[i].to)].push_back(int(i));
  return in;
}

size_t Graph::live_nodes() const {
  return size_t(std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return !n.removed; }));
}

std::vector<int> Graph::topo_order() const {
  std::vector<int> indeg(nodes.size(), 0);
  auto out = out_edges();
  for (const auto& e : edges)
    if (!e.removed) ++indeg[size_t(e.to)];
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (const auto& n : nodes)
    if (!n.removed && indeg[size_t(n.id)] == 0) ready.push(n.id);
  std::vector<int> order;
  while (!ready.empty()) {
    int n = ready.top();
    ready.pop();
    order.push_back(n);
    for (int ei : out[size_t(n)])
      if (--indeg[size_t(edges[size_t(ei)].to)] == 0) ready.push(edges[size_t(ei)].to);
  }
  return order;
}

void Graph::check_acyclic(const std::string& context) const {
  auto order = topo_order();
  if (order.size() == live_nodes()) return;
  // Find one cycle among the nodes left over: walk backwards along in-edges inside the remainder.
  std::vector<char> done(nodes.size(), 0);
  for (int n : order) done[size_t(n)] = 1;
  auto in = in_edges();
  int start = -1;
  for (const auto& n : nodes)
    if (!n.removed && !done[size_t(n.id)]) { start = n.id; break; }
  std::vector<int> path;
  std::vector<int> seen(nodes.size(), -1);
  int cur = start;
  std::vector<int> via_directive;
  while (seen[size_t(cur)] < 0) {
    seen[size_t(cur)] = int(path.size());
    path.push_back(cur);
    int next = -1, dir = -1;
    for (int ei : in[size_t(cur)]) {
      const Edge& e = edges[size_t(ei)];
      if (!done[size_t(e.from)]) { next = e.from; dir = e.source_directive; break; }
    }
    via_directive.push_back(dir);
    cur = next;
  }
  std::string cycle;
  std::vector<int> cyc(path.begin() + seen[size_t(cur)], path.end());
  std::reverse(cyc.begin(), cyc.end());
  auto named = [&](int n) {
    const Node& node = nodes[size_t(n)];
    std::string s = node.label();
    if (node.device_set >= 0 && size_t(node.device_set) < sets.size()) {
      const auto& r = sets[size_t(node.device_set)].ranks;
      s += r.size() == 1 ? cat(" on rank ", r[0]) : cat(" on ranks ", r[0], "..", r.back());
    }
    return s;
  };
  for (int n : cyc) cycle += named(n) + " -> ";
  cycle += named(cyc.front());
  int blame = -1;
  for (int d : via_directive) if (d >= 0) blame = d;
  throw UserError(cat(context, ": the order makes a cycle: ", cycle,
                      blame >= 0 ? cat(" (edges from directive #", blame, ")") : std::string()));
}

bool filter_matches(const Filter& f, const Node& n) {
  for (const auto& [tag, m] : f.match) {
    if (tag == "PASS") {
      std::string p = pass_name(n.kind);
      if (p.empty()) return false;
      if (m.kind == TagMatch::Kind::Name && m.name != p) return false;
      continue;
    }
    auto it = n.tags.find(tag);
    if (it == n.tags.end()) return false;
    if (m.kind == TagMatch::Kind::Int && it->second != m.value) return false;
  }
  return true;
}

bool filter_matches_region(const Filter& f, const Region& r) {
  for (const auto& [tag, m] : f.match) {
    auto it = r.tags.find(tag);
    if (it == r.tags.end()) return false;
    if (m.kind == TagMatch::Kind::Int && it->second != m.value) return false;
  }
  return true;
}

}  // namespace piper
