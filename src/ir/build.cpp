// Training DAG construction (see build.hpp). One microbatch, no placement: passes add the rest.
#include "ir/build.hpp"

#include <algorithm>

#include "model/build.hpp"
#include "model/segment_type.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// The model's segment names for a message: all of them when few, else the first and last ones.
std::string segment_names(const Model& model) {
  const int S = int(model.segments.size());
  std::string names;
  for (int s = 0; s < S; ++s) {
    if (S > 12 && s == 6) {
      names += ", ...";
      s = S - 4;
      continue;
    }
    names += cat(s ? ", " : "", "\"", model.segments[size_t(s)].name, "\"");
  }
  return names;
}

// `name` matches `pattern`, where * stands for any run of characters (none included).
bool glob_match(const char* pattern, const char* name) {
  if (*pattern == '\0') return *name == '\0';
  if (*pattern == '*') return glob_match(pattern + 1, name) || (*name != '\0' && glob_match(pattern, name + 1));
  return *name == *pattern && glob_match(pattern + 1, name + 1);
}

}  // namespace

// The segment index ranges [first, last] of each tag value of an annotation.
std::vector<std::pair<int, int>> segment_ranges(const Model& model, const Annotation& a) {
  const int S = int(model.segments.size());
  std::vector<std::pair<int, int>> out;
  if (!a.pattern.empty() || a.expert_segments || a.tp_segments) {  // a region per matching segment
    for (int s = 0; s < S; ++s) {
      const Segment& seg = model.segments[size_t(s)];
      const bool match = a.expert_segments ? seg.type->shard_units != nullptr
                         : a.tp_segments   ? seg.type->tp_split != nullptr
                                           : glob_match(a.pattern.c_str(), seg.name.c_str());
      if (match) out.push_back({s, s});
    }
    if (out.empty() && a.tp_segments)
      throw UserError(cat(a.loc.str(), ": mesh.tp asks for tensor parallelism, but no segment of the ", model.kind,
                          " model can be split over ranks"));
    if (out.empty() && a.expert_segments)
      throw UserError(cat(a.loc.str(), ": mesh.ep asks for expert parallelism, but the ", model.kind,
                          " model has no experts (set model.moe, or remove ep)"));
    if (out.empty())
      throw UserError(cat(a.loc.str(), ": annotate.", a.index, ".segments: the pattern \"", a.pattern,
                          "\" matches no segment of the ", model.kind, " model; its ", S, " segments are ",
                          segment_names(model)));
    return out;
  }
  for (const auto& [lo, hi] : a.layers) {  // every segment whose layer lies in [lo, hi]
    int first = S, last = -1;
    for (int s = 0; s < S; ++s)
      if (model.segments[size_t(s)].layer >= lo && model.segments[size_t(s)].layer <= hi) {
        first = std::min(first, s);
        last = std::max(last, s);
      }
    out.push_back({first, last});
  }
  auto find = [&](const std::string& name) {
    for (int s = 0; s < S; ++s)
      if (model.segments[size_t(s)].name == name) return s;
    throw UserError(cat(a.loc.str(), ": annotate.", a.index, ".segments: the ", model.kind, " model has no segment \"",
                        name, "\"; its ", S, " segments are ", segment_names(model)));
  };
  int prev = -1;
  for (const auto& [lo, hi] : a.segments) {
    int first = find(lo), last = find(hi);
    if (first > last)
      throw UserError(cat(a.loc.str(), ": annotate.", a.index, ".segments: \"", lo, "\" comes after \"", hi,
                          "\" in the model"));
    if (first <= prev)
      throw UserError(cat(a.loc.str(), ": annotate.", a.index, ".segments: range [\"", lo, "\", \"", hi,
                          "\"] starts inside or before the previous range"));
    // the loss segment that finishes the range's last one (sharing its state) joins the range
    if (last + 1 < S) {
      const Segment& next = model.segments[size_t(last) + 1];
      if (next.type->computes_loss && next.type->link_offset < 0 && last + 1 + next.type->link_offset >= first) ++last;
    }
    prev = last;
    out.push_back({first, last});
  }
  return out;
}

std::vector<Region> make_regions(const Model& model, const std::vector<Annotation>& annotations) {
  std::vector<std::vector<std::pair<int, int>>> ranges;
  for (const auto& a : annotations) ranges.push_back(segment_ranges(model, a));
  auto tags_of = [&](int seg) {
    Tags t;
    for (size_t i = 0; i < annotations.size(); ++i)
      for (size_t v = 0; v < ranges[i].size(); ++v)
        if (seg >= ranges[i][v].first && seg <= ranges[i][v].second) t[annotations[i].tag] = int(v);
    return t;
  };
  std::vector<Region> regions;
  for (size_t s = 0; s < model.segments.size(); ++s) {
    Tags t = tags_of(int(s));
    if (!regions.empty() && regions.back().tags == t) {
      regions.back().seg_end = int(s) + 1;
      continue;
    }
    // Equal tags may recur (an expert region inside a pipeline stage splits it): each run is a region.
    Region r;
    r.id = int(regions.size());
    r.seg_begin = int(s);
    r.seg_end = int(s) + 1;
    r.tags = t;
    regions.push_back(r);
  }
  return regions;
}

int step_sync_node(const Graph& g) {
  for (const auto& n : g.nodes)
    if (!n.removed && n.purpose == CommPurpose::StepSync && n.kind == NodeKind::ALL_REDUCE) return n.id;
  PIPER_CHECK(false, "graph has no step-sync node");
  return -1;
}

Graph build_training_graph(const Model& model, const JobSpec& spec, int world) {
  Graph g;
  g.model = &model;
  g.world = world;
  g.bf16 = spec.job.precision == "bf16";
  g.global_batch = spec.data.batch;
  g.microbatches = 1;
  g.samples_per_microbatch = spec.data.batch;
  g.regions = make_regions(model, spec.annotations);
  g.segment_shards.assign(model.segments.size(), 1);
  g.segment_recompute.assign(model.segments.size(), 0);
  g.boundary_in_parts.assign(model.segments.size(), 0);

  const int R = int(g.regions.size());
  std::vector<int> fwd(static_cast<size_t>(R)), bwd(static_cast<size_t>(R)), upd(static_cast<size_t>(R));
  for (const auto& r : g.regions) {
    Node f;
    f.kind = NodeKind::F;
    f.tags = r.tags;
    f.region = r.id;
    f.mb = 0;  // one microbatch until a split makes more
    f.tags["MB"] = 0;
    fwd[size_t(r.id)] = g.add_node(f);
    Node b = f;
    b.kind = NodeKind::B;
    bwd[size_t(r.id)] = g.add_node(b);
    Node u;
    u.kind = NodeKind::UPDATE;
    u.tags = r.tags;
    u.region = r.id;
    upd[size_t(r.id)] = g.add_node(u);
  }
  Node sync;
  sync.kind = NodeKind::ALL_REDUCE;
  sync.purpose = CommPurpose::StepSync;
  sync.tensor.kind = TensorRef::Kind::Scalars;
  int sync_id = g.add_node(sync);

  for (int r = 0; r < R; ++r) {
    const Region& reg = g.regions[size_t(r)];
    g.add_edge(fwd[size_t(r)], bwd[size_t(r)], EdgeKind::Data, {TensorRef::Kind::Stash, reg.seg_begin, 0});
    if (r + 1 < R) {
      int boundary = g.regions[size_t(r + 1)].seg_begin;
      g.add_edge(fwd[size_t(r)], fwd[size_t(r + 1)], EdgeKind::Data, {TensorRef::Kind::Act, boundary, 0});
      g.add_edge(bwd[size_t(r + 1)], bwd[size_t(r)], EdgeKind::Data, {TensorRef::Kind::ActGrad, boundary, 0});
    }
    g.add_edge(bwd[size_t(r)], sync_id, EdgeKind::Data, {TensorRef::Kind::Grads, -1, -1});
    g.add_edge(sync_id, upd[size_t(r)], EdgeKind::Data, {TensorRef::Kind::Scalars, -1, -1});
  }
  return g;
}

}  // namespace piper
