// Tests of what a rank owns of a bucket (plan/owned_slices.hpp) and of the expert-group communicators:
// slices of a sliced bucket, shards inside a slice, padding that never reaches the next slice's parameters, and
// the ranks of SetBlock (an expert group) and SetStride (the copies of one slice) groups.
#include <catch2/catch.hpp>

#include "plan/owned_slices.hpp"

using namespace piper;

namespace {

// A plan of one set of `ranks` holding one bucket of `params` parameters of `numel` elements each.
Plan plan_with_bucket(int ranks, int params, int64_t numel, int slices, int group_size) {
  Plan p;
  p.world = ranks;
  p.sets = {{}};
  for (int r = 0; r < ranks; ++r) p.sets[0].push_back(r);
  p.set = 0;
  PlanBucket b;
  b.numel = params * numel;
  b.slices = slices;
  b.group_size = group_size;
  b.padded = (b.slice_numel() + group_size - 1) / group_size * group_size;
  p.buckets.push_back(b);
  for (int i = 0; i < params; ++i) {
    ParamSpec spec;
    spec.name = "p" + std::to_string(i);
    spec.numel = numel;
    p.params.push_back(spec);
    PlanParam pp;
    pp.model_param = i;
    pp.bucket = 0;
    pp.offset = i * numel;
    p.plan_params.push_back(pp);
  }
  return p;
}

std::vector<int> pieces(const Plan& p, BucketRange r) {
  std::vector<int> out;
  for_each_param_piece(p, 0, r, [&](const ParamPiece& piece) {
    out.push_back(piece.pp->model_param);
    out.push_back(int(piece.begin));
    out.push_back(int(piece.end));
  });
  return out;
}

}  // namespace

TEST_CASE("a sliced bucket: each replica holds its slice, shards it among the copies, and padding stops at the "
          "slice's end",
          "[plan]") {
  // 4 replicas, expert groups of 2: replicas 0 and 2 hold slice 0 (params 0-1), 1 and 3 slice 1 (params 2-3);
  // each slice of 2 × 5 = 10 elements is padded to 10 over its 2 copies (shards of 5)
  Plan p = plan_with_bucket(4, 4, 5, 2, 2);
  const PlanBucket& b = p.buckets[0];
  CHECK(b.slice_numel() == 10);
  CHECK(slice_of(b, 3) == 1);
  CHECK(index_in_group(b, 3) == 1);
  CHECK(slice_begin(b, 3) == 10);
  // whole slice of replica 1: params 2 and 3
  CHECK(pieces(p, owned_range(b, 1, false)) == std::vector<int>{2, 10, 15, 3, 15, 20});
  // replica 3's shard of slice 1: the second half, param 3
  const BucketRange r3 = owned_range(b, 3, true);
  CHECK(r3.lo == 15);
  CHECK(r3.hi == 20);
  CHECK(pieces(p, r3) == std::vector<int>{3, 15, 20});

  // slices of 3 elements over 2 copies are padded to 4: the padding of slice 0 must not reach slice 1's parameter
  Plan q = plan_with_bucket(4, 2, 3, 2, 2);
  const PlanBucket& c = q.buckets[0];
  CHECK(c.padded == 4);
  const BucketRange copy1 = owned_range(c, 2, true);  // replica 2: slice 0, second shard [2, 4) clipped at 3
  CHECK(copy1.lo == 2);
  CHECK(copy1.hi == 3);
  CHECK(pieces(q, copy1) == std::vector<int>{0, 2, 3});
  CHECK(pieces(q, owned_range(c, 0, false)) == std::vector<int>{0, 0, 3});

  // not sliced: the old ranges
  Plan d = plan_with_bucket(2, 2, 5, 1, 2);
  CHECK(owned_range(d.buckets[0], 1, true).lo == 5);
  CHECK(owned_range(d.buckets[0], 1, false).hi == 10);
}

TEST_CASE("expert groups are blocks of consecutive replicas, the copies of a slice every k-th replica", "[plan]") {
  Plan p;
  p.world = 8;
  p.sets = {{1, 3, 5, 7, 9, 11}, {0}};  // a set of 6 (ranks by replica), groups of 2 and 3
  p.set = 0;
  p.replica = 4;
  CHECK(p.group_ranks({GroupRef::Kind::SetBlock, {0, 2}, "ep"}) == std::vector<int32_t>{9, 11});
  CHECK(p.group_ranks({GroupRef::Kind::SetStride, {0, 2}, "dp"}) == std::vector<int32_t>{1, 5, 9});
  CHECK(p.group_ranks({GroupRef::Kind::SetBlock, {0, 3}, "ep"}) == std::vector<int32_t>{7, 9, 11});
  CHECK(p.group_ranks({GroupRef::Kind::SetStride, {0, 3}, "dp"}) == std::vector<int32_t>{3, 9});
  CHECK(GroupRef{GroupRef::Kind::SetStride, {0, 2}, "dp"}.str() == "set0.stride2/dp");
}
