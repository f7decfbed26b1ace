// What a rank owns of a parameter bucket, written once. A sliced bucket (experts over an expert group) gives
// replica r its slice r % slices; the bucket's full buffers on r hold that slice. Within the slice (or the whole
// bucket), replica index i = r / slices of the group holds shard [i·padded/n, (i+1)·padded/n) when sharded.
#pragma once
#include <algorithm>
#include <cstdint>

#include "plan/plan.hpp"

namespace piper {

// Elements of one replica's shard of the bucket, or of its slice (padded is a multiple of group_size).
inline int64_t shard_elements(const PlanBucket& b) { return b.padded / b.group_size; }

// The slice replica `replica` holds, and its index in the bucket's group (the replicas holding that slice).
inline int slice_of(const PlanBucket& b, int replica) { return replica % b.slices; }
inline int index_in_group(const PlanBucket& b, int replica) { return replica / b.slices; }

// Bucket element where this replica's slice (the start of the bucket's full buffers on it) begins.
inline int64_t slice_begin(const PlanBucket& b, int replica) { return int64_t(slice_of(b, replica)) * b.slice_numel(); }

// [lo, hi) in bucket elements; hi stops at the end of the replica's slice (padding holds no parameter).
struct BucketRange {
  int64_t lo = 0, hi = 0;
};

// Replica `replica`'s shard of its slice of the bucket when `sharded`, else its whole slice (the whole bucket
// when not sliced). A full buffer of the bucket holds element e at e − slice_begin; a shard buffer at e − lo.
inline BucketRange owned_range(const PlanBucket& b, int replica, bool sharded) {
  const int64_t base = slice_begin(b, replica), end = b.slices > 1 ? base + b.slice_numel() : base + b.padded;
  if (!sharded) return {base, end};
  const int64_t shard = shard_elements(b), i = index_in_group(b, replica);
  return {base + i * shard, std::min(end, base + (i + 1) * shard)};
}

// Elements a plan parameter holds in its bucket: the whole parameter, or its tensor-parallel piece.
inline int64_t plan_param_elements(const Plan& plan, const PlanParam& pp) {
  const int64_t numel = plan.params[size_t(pp.model_param)].numel;
  return pp.piece < 0 ? numel : numel / plan.buckets[size_t(pp.bucket)].slices;
}

// The part of one parameter inside a bucket range: bucket elements [begin, end).
struct ParamPiece {
  const PlanParam* pp = nullptr;
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
  int64_t param_begin() const { return begin - pp->offset; }  // first element of the plan parameter in the piece
};

// Calls fn(ParamPiece) for every parameter of bucket `bucket` that overlaps `range`, in plan order.
template <typename Fn>
void for_each_param_piece(const Plan& plan, int32_t bucket, BucketRange range, Fn&& fn) {
  for (const PlanParam& pp : plan.plan_params) {
    if (pp.bucket != bucket) continue;
    const int64_t numel = plan_param_elements(plan, pp);
    const int64_t begin = std::max(range.lo, pp.offset), end = std::min(range.hi, pp.offset + numel);
    if (begin < end) fn(ParamPiece{&pp, begin, end});
  }
}

// Where elements [at, at + count) of a plan parameter lie in the whole parameter: fn(element, at, n) for runs of n
// consecutive elements, in order. One run for a whole parameter; a tensor-parallel piece t of k is the flattened
// tensor seen as (outer, k, inner), its element e = o·inner + i being element o·k·inner + t·inner + i.
template <typename Fn>
void for_each_element_run(const PlanParam& pp, int pieces, int64_t at, int64_t count, Fn&& fn) {
  if (pp.piece < 0) return fn(at, at, count);
  const int64_t inner = pp.split_inner, end = at + count;
  for (int64_t e = at; e < end;) {
    const int64_t o = e / inner, i = e % inner, n = std::min(inner - i, end - e);
    fn((o * pieces + pp.piece) * inner + i, e, n);
    e += n;
  }
}

}  // namespace piper
