// Groups each region's parameters into buckets of about bucket_mb megabytes, in backward order, on
// segment boundaries. A parameter used by regions on two device sets (the tied embedding) gets a bucket
// of its own on each side, so that the copies can be summed with one collective.
#include <algorithm>
#include <map>
#include <set>

#include "model/segment_type.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

// Region of the first segment that uses each parameter.
std::vector<int> home_regions(const Graph& g) {
  std::vector<int> home(g.model->params.size(), -1);
  for (const auto& r : g.regions)
    for (int s = r.seg_begin; s < r.seg_end; ++s)
      for (int p : g.model->segments[size_t(s)].params)
        if (home[size_t(p)] < 0) home[size_t(p)] = r.id;
  return home;
}

}  // namespace

void make_buckets(Graph& g) {
  const Model& m = *g.model;
  auto home = home_regions(g);
  // Sets that use each parameter.
  std::vector<std::set<int>> users(m.params.size());
  for (const auto& r : g.regions)
    for (int s = r.seg_begin; s < r.seg_end; ++s)
      for (int p : m.segments[size_t(s)].params) users[size_t(p)].insert(r.device_set);

  g.buckets.clear();
  for (const auto& r : g.regions) {
    // a sharded region's parameters form one bucket, so that each rank's slice is whole experts
    const double limit = r.shard_directive >= 0 ? 1e300 : r.bucket_mb * 1024.0 * 1024.0;
    const int slices = r.shard_directive >= 0 ? std::max(1, r.shard_group) : 1;
    Bucket cur;
    cur.region = r.id;
    cur.slices = slices;
    std::set<int> seen;
    auto close = [&] {
      if (!cur.params.empty()) g.buckets.push_back(cur);
      cur = Bucket{};
      cur.region = r.id;
      cur.slices = slices;
    };
    // A split segment's split parameters form one bucket of its own, cut into the group's pieces (the other
    // parameters, held whole by every rank of the group, join the region's buckets below).
    for (int s = r.seg_begin; s < r.seg_end; ++s) {
      const Segment& seg = m.segments[size_t(s)];
      const int k = g.segment_shards[size_t(s)];
      if (k <= 1 || !seg.type->tp_split) continue;
      Bucket pieces;
      pieces.region = r.id;
      pieces.slices = k;
      pieces.tp_pieces = true;
      for (size_t slot = 0; slot < seg.params.size(); ++slot) {
        const int p = seg.params[slot];
        if (!seg.type->tp_split(m.dims, int(slot), k).split() || seen.count(p)) continue;
        PIPER_CHECK(users[size_t(p)].size() == 1, "split parameter ", m.params[size_t(p)].name, " is used on two sets");
        seen.insert(p);
        pieces.params.push_back(p);
        pieces.numel += m.params[size_t(p)].numel;
      }
      if (!pieces.params.empty()) g.buckets.push_back(pieces);
    }
    // A parameter joins the bucket of the lowest segment using it: backward reaches that one last, so the
    // bucket is complete exactly when its last gradient contribution is (the tied embedding waits for the
    // embedding's backward, not the head's).
    std::map<int, int> lowest_user;
    for (int s = r.seg_begin; s < r.seg_end; ++s)
      for (int p : m.segments[size_t(s)].params)
        if (!lowest_user.count(p)) lowest_user[p] = s;
    // A bf16 run's ZeRO-3 region keeps the parameters read only by matmuls (ParamSpec::bf16_operand) in buckets of
    // their own, next to the others': those buckets are gathered in bf16.
    const bool apart = g.bf16 && r.zero >= 3 && r.shard_directive < 0;
    Bucket operands = cur;
    auto close_operands = [&] {
      if (!operands.params.empty()) g.buckets.push_back(operands);
      operands = Bucket{};
      operands.region = r.id;
      operands.slices = slices;
    };
    for (int s = r.seg_end - 1; s >= r.seg_begin; --s) {
      for (int p : m.segments[size_t(s)].params) {
        if (seen.count(p) || lowest_user[p] != s) continue;
        seen.insert(p);
        int h = home[size_t(p)];
        bool here = h == r.id;
        bool copy = !here && g.regions[size_t(h)].device_set != r.device_set;
        if (!here && !copy) continue;  // stored in its home region's bucket on this same set
        if (users[size_t(p)].size() > 1) {
          Bucket own;
          own.region = r.id;
          own.params = {p};
          own.numel = m.params[size_t(p)].numel;
          own.tied_copy = copy;
          g.buckets.push_back(own);
          continue;
        }
        Bucket& into = apart && m.params[size_t(p)].bf16_operand ? operands : cur;
        into.params.push_back(p);
        into.numel += m.params[size_t(p)].numel;
      }
      if (double(operands.numel) * sizeof(float) >= limit) close_operands();
      if (double(cur.numel) * sizeof(float) >= limit) close();
    }
    close_operands();
    close();
  }
}

}  // namespace piper
