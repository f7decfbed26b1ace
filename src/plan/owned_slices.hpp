// What a rank owns of a parameter bucket, written once: its shard of the padded range (replica r of n holds
// [r·padded/n, (r+1)·padded/n)) or the whole range, and the pieces where that range overlaps each parameter.
#pragma once
#include <algorithm>
#include <cstdint>

#include "plan/plan.hpp"

namespace piper {

// Elements of one replica's shard of the bucket (padded is a multiple of group_size).
inline int64_t shard_elements(const PlanBucket& b) { return b.padded / b.group_size; }

// [lo, hi) in the bucket's padded elements.
struct BucketRange {
  int64_t lo = 0, hi = 0;
};

// Replica `replica`'s shard of the bucket when `sharded`, else the whole padded range.
inline BucketRange owned_range(const PlanBucket& b, int replica, bool sharded) {
  if (!sharded) return {0, b.padded};
  const int64_t shard = shard_elements(b);
  return {int64_t(replica) * shard, int64_t(replica + 1) * shard};
}

// The part of one parameter inside a bucket range: bucket elements [begin, end).
struct ParamPiece {
  const PlanParam* pp = nullptr;
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
  int64_t param_begin() const { return begin - pp->offset; }  // first element of the parameter in the piece
};

// Calls fn(ParamPiece) for every parameter of bucket `bucket` that overlaps `range`, in plan order.
template <typename Fn>
void for_each_param_piece(const Plan& plan, int32_t bucket, BucketRange range, Fn&& fn) {
  for (const PlanParam& pp : plan.plan_params) {
    if (pp.bucket != bucket) continue;
    const int64_t numel = plan.params[size_t(pp.model_param)].numel;
    const int64_t begin = std::max(range.lo, pp.offset), end = std::min(range.hi, pp.offset + numel);
    if (begin < end) fn(ParamPiece{&pp, begin, end});
  }
}

}  // namespace piper
