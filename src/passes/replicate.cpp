// replicate: data parallelism over a region's device set. ZeRO level 0 all-reduces each gradient bucket;
// 1 reduce-scatters it (each rank updates its shard) and all-gathers the updated parameters; 2 reduce-
// scatters every microbatch's gradients into the shard (full gradients live only per bucket and
// microbatch); 3 also keeps parameters sharded and all-gathers each bucket just before every use.
#include <algorithm>
#include <map>
#include <set>

#include "ir/build.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

int copies(const Graph& g, const Region& r) {
  const int ranks = int(g.sets[size_t(r.device_set)].ranks.size());
  return r.shard_directive >= 0 ? ranks / std::max(1, r.shard_group) : ranks;
}

bool has_copies(const Graph& g, const Region& r) { return r.shard_directive < 0 || copies(g, r) > 1; }

int bucket_copies(const Graph& g, const Bucket& b) {
  const Region& r = g.regions[size_t(b.region)];
  return int(g.sets[size_t(r.device_set)].ranks.size()) / b.slices;
}

void mark_replicate(Graph& g, const Directive& d) {
  for (const auto& [tag, m] : d.filter.match)
    if (tag == "MB" || tag == "PASS")
      throw UserError(cat(d.describe(), ": replicate works on whole regions; its filter cannot name ", tag));
  int matched = 0;
  for (auto& r : g.regions) {
    if (!filter_matches_region(d.filter, r) || !has_copies(g, r)) continue;  // experts on the whole set: left alone
    ++matched;
    if (r.replicate_directive >= 0)
      throw UserError(cat(d.describe(), ": ", r.label(), " is already replicated by directive #", r.replicate_directive));
    r.zero = d.zero;
    r.bucket_mb = d.bucket_mb;
    r.grad_buckets_in_flight = d.grad_buckets_in_flight;
    r.dp_stream = d.stream;
    r.replicate_directive = d.index;
  }
  if (matched == 0) throw UserError(cat(d.describe(), ": filter ", d.filter.str(), " matches no region"));
}

bool region_uses_bucket(const Graph& g, int region, int bucket) {
  const Region& r = g.regions[size_t(region)];
  const Bucket& b = g.buckets[size_t(bucket)];
  if (g.regions[size_t(b.region)].device_set != r.device_set) return false;
  std::set<int> params(b.params.begin(), b.params.end());
  for (int s = r.seg_begin; s < r.seg_end; ++s)
    for (int p : g.model->segments[size_t(s)].params)
      if (params.count(p)) return true;
  return false;
}

bool writes_grads(const Node& n) { return n.kind == NodeKind::B || n.kind == NodeKind::BW; }
bool reads_params(const Node& n) { return n.kind == NodeKind::F || n.kind == NodeKind::B || n.kind == NodeKind::BI; }

void insert_replication(Graph& g) {
  const int sync = step_sync_node(g);
  const size_t n_before = g.nodes.size();
  std::vector<char> replicated_set(g.sets.size(), 0);
  for (size_t b = 0; b < g.buckets.size(); ++b) {
    const Region& r = g.regions[size_t(g.buckets[b].region)];
    if (r.zero < 0 || bucket_copies(g, g.buckets[b]) == 1) continue;
    replicated_set[size_t(r.device_set)] = 1;
    std::vector<int> writers, users;
    int update = -1;
    for (size_t i = 0; i < n_before; ++i) {
      const Node& n = g.nodes[i];
      if (n.removed || n.region < 0 || !region_uses_bucket(g, n.region, int(b))) continue;
      if (writes_grads(n)) writers.push_back(n.id);
      if (reads_params(n)) users.push_back(n.id);
      if (n.kind == NodeKind::UPDATE && n.region == r.id) update = n.id;
    }
    Node c;
    c.region = r.id;
    c.tags = r.tags;
    c.device_set = r.device_set;
    c.stream = r.dp_stream;
    c.purpose = CommPurpose::Gradient;
    c.bucket = int(b);
    c.source_directive = r.replicate_directive;
    c.tensor = {TensorRef::Kind::Grads, int(b), -1};
    if (r.zero <= 1) {
      c.kind = r.zero == 0 ? NodeKind::ALL_REDUCE : NodeKind::REDUCE_SCATTER;
      int id = g.add_node(c);
      for (int w : writers) g.add_edge(w, id, EdgeKind::Data, c.tensor);
      g.add_edge(id, sync, EdgeKind::Data, c.tensor);
    } else {
      // One reduce-scatter per microbatch, after every node that writes the bucket for it (a tied
      // parameter's bucket has two writers on a set that holds both of its users).
      c.kind = NodeKind::REDUCE_SCATTER;
      std::map<int, std::vector<int>> writers_by_mb;
      for (int w : writers) writers_by_mb[g.nodes[size_t(w)].mb].push_back(w);
      for (const auto& [mb, ws] : writers_by_mb) {
        Node per = c;
        per.mb = mb;
        per.tensor.mb = mb;
        per.tags["MB"] = mb;
        int id = g.add_node(per);
        for (int w : ws) g.add_edge(w, id, EdgeKind::Data, per.tensor);
        g.add_edge(id, sync, EdgeKind::Data, per.tensor);
      }
    }
    Node gather = c;
    gather.kind = NodeKind::ALL_GATHER;
    gather.purpose = CommPurpose::ParamGather;
    gather.tensor = {TensorRef::Kind::Params, int(b), -1};
    if (r.zero == 1 || r.zero == 2) {
      int id = g.add_node(gather);
      g.add_edge(update, id, EdgeKind::Data, gather.tensor);
    } else if (r.zero == 3) {
      gather.stream = r.dp_stream + ".gather";
      for (int u : users) {
        Node per = gather;
        per.mb = g.nodes[size_t(u)].mb;
        per.tags = g.nodes[size_t(u)].tags;
        per.gather_for = u;
        int id = g.add_node(per);
        g.add_edge(id, u, EdgeKind::Data, per.tensor);
      }
    }
  }
  // Gradients of replicated sets now reach the step sync through their collectives; those of a region with a
  // bucket held once (experts once per set, a tensor-parallel piece without replicas: never reduced) keep their
  // direct edge.
  std::vector<char> held_once(g.regions.size(), 0);
  for (const Bucket& b : g.buckets)
    if (g.regions[size_t(b.region)].zero < 0 || bucket_copies(g, b) == 1) held_once[size_t(b.region)] = 1;
  for (auto& e : g.edges) {
    if (e.removed || e.to != sync || e.tensor.kind != TensorRef::Kind::Grads) continue;
    const Node& from = g.nodes[size_t(e.from)];
    const bool single = from.region >= 0 && held_once[size_t(from.region)];
    if (writes_grads(from) && !single && from.device_set >= 0 && replicated_set[size_t(from.device_set)])
      e.removed = true;
  }
}

}  // namespace piper
