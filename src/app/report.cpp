// End-of-run reports (see report.hpp).
#include "app/report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "plan/owned_slices.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_gather.hpp"

namespace piper {

namespace {

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

double mib(double bytes) { return bytes / 1048576.0; }

}  // namespace

std::vector<RankMemory> report_memory(Executor& ex, MPI_Comm world) {
  const Plan& plan = ex.plan();
  MemoryStats st = ex.buffers().stats();
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  RankMemory mine;
  for (int k = 0; k < kBufferKinds; ++k) {
    mine.held[k] = uint64_t(st.live_by_kind[k]);
    mine.peak[k] = uint64_t(st.peak_by_kind[k]);
    mine.estimated_peak[k] = plan.memory.peak_by_kind[k];
    mine.estimated_steady[k] = plan.memory.steady_by_kind[k];
  }
  mine.peak_total = uint64_t(st.peak_total);
  mine.estimated_peak_total = plan.memory.peak_total;
  static_assert(sizeof(RankMemory) % sizeof(uint64_t) == 0, "RankMemory is sent as 64-bit words");
  constexpr int words = int(sizeof(RankMemory) / sizeof(uint64_t));
  std::vector<RankMemory> all(rank == 0 ? size_t(size) : 0);
  MPI_CHECK(MPI_Gather(&mine, words, MPI_UINT64_T, all.data(), words, MPI_UINT64_T, 0, world));
  if (rank != 0) return all;
  const int K = kBufferKinds;
  std::printf("memory per rank in MiB, measured (estimated): held between steps | peak\n");
  std::printf("%5s", "rank");
  for (int k = 0; k < K; ++k) std::printf(" %23s", buffer_kind_name(BufferKind(k)));
  std::printf(" %23s\n", "peak total");
  for (int r = 0; r < size; ++r) {
    const RankMemory& v = all[size_t(r)];
    std::printf("%5d", r);
    for (int k = 0; k < K; ++k) {
      const bool steady = BufferKind(k) == BufferKind::Param || BufferKind(k) == BufferKind::Grad ||
                          BufferKind(k) == BufferKind::OptState;
      // parameters, gradients and optimizer state: held between steps; the rest: peak
      const double m = double(steady ? v.held[k] : v.peak[k]);
      const double e = double(steady ? v.estimated_steady[k] : v.estimated_peak[k]);
      std::printf(" %10.2f (%10.2f)", mib(m), mib(e));
    }
    std::printf(" %10.2f (%10.2f)\n", mib(double(v.peak_total)), mib(double(v.estimated_peak_total)));
  }
  for (int r = 0; r < size; ++r) {
    const RankMemory& v = all[size_t(r)];
    std::printf("memory rank=%d", r);
    const char* keys[K] = {"param", "grad", "optim", "act", "comm", "workspace"};
    for (int k = 0; k < K; ++k) std::printf(" held_%s=%llu", keys[k], static_cast<unsigned long long>(v.held[k]));
    for (int k = 0; k < K; ++k) std::printf(" peak_%s=%llu", keys[k], static_cast<unsigned long long>(v.peak[k]));
    for (int k = 0; k < K; ++k)
      std::printf(" est_peak_%s=%llu", keys[k], static_cast<unsigned long long>(v.estimated_peak[k]));
    std::printf(" peak_total=%llu est_peak_total=%llu\n", static_cast<unsigned long long>(v.peak_total),
                static_cast<unsigned long long>(v.estimated_peak_total));
  }
  std::fflush(stdout);
  return all;
}

ReplicaCheck check_replicas(Executor& ex, MPI_Comm world) {
  const Plan& plan = ex.plan();
  Kernels& k = ex.backend().kernels();
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  // Sharded buckets are gathered here, the way every replica assembles them before use, so that their
  // full copies can be compared too. The replicas of a set gather together.
  MPI_Comm set_comm;
  MPI_CHECK(MPI_Comm_split(world, plan.set, plan.replica, &set_comm));
  std::vector<std::vector<float>> gathered(plan.buckets.size());
  std::vector<float> shard;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlanBucket& pb = plan.buckets[b];
    if (!pb.shard_params) continue;
    // the replicas holding this rank's slice (the whole set when the bucket is not sliced)
    MPI_Comm group_comm;
    MPI_CHECK(MPI_Comm_split(set_comm, slice_of(pb, plan.replica), index_in_group(pb, plan.replica), &group_comm));
    const int64_t count = shard_elements(pb);
    shard.resize(size_t(count));
    k.download(shard.data(), ex.bucket_ptr(pb.param_shard_buf, 0), size_t(count) * sizeof(float));
    gathered[b].resize(size_t(pb.padded));
    MPI_CHECK(MPI_Allgather(shard.data(), int(count), MPI_FLOAT, gathered[b].data(), int(count), MPI_FLOAT, group_comm));
    MPI_Comm_free(&group_comm);
  }
  MPI_Comm_free(&set_comm);
  // (model parameter, hash) of every parameter this rank holds or has just gathered in full
  std::vector<uint64_t> mine;
  std::vector<float> host;
  for (const auto& pp : plan.plan_params) {
    const PlanBucket& pb = plan.buckets[size_t(pp.bucket)];
    const int64_t n = plan_param_elements(plan, pp);
    const BucketRange slice = owned_range(pb, plan.replica, false);  // what this rank holds of the bucket
    if (pp.offset < slice.lo || pp.offset >= slice.hi) continue;
    const int64_t at = pp.offset - slice.lo;
    host.resize(size_t(n));
    if (pb.shard_params)
      std::copy_n(gathered[size_t(pp.bucket)].begin() + at, n, host.begin());
    else
      k.download(host.data(), ex.bucket_ptr(pb.param_buf, at), size_t(n) * sizeof(float));
    mine.push_back(uint64_t(pp.model_param) + uint64_t(pp.piece + 1) * plan.params.size());  // a piece: its own key
    mine.push_back(fnv1a(host.data(), host.size() * sizeof(float)));
  }
  Gathered<uint64_t> all = gather_to_root(mine, world);
  int ok = 1;
  ReplicaCheck check;
  if (rank == 0) {
    std::map<uint64_t, std::pair<int, uint64_t>> first;  // param → (rank, hash) of its first holder
    int compared = 0;
    for (int r = 0; r < size && ok; ++r)
      for (const uint64_t* e = all.begin(r); e < all.end(r); e += 2) {
        uint64_t param = e[0], hash = e[1];
        auto [it, inserted] = first.emplace(param, std::make_pair(r, hash));
        if (inserted) continue;
        ++compared;
        if (it->second.second != hash) {
          std::fprintf(stderr, "piper: error: replicas diverged: parameter '%s' differs between rank %d and rank %d\n",
                       plan.params[size_t(param % plan.params.size())].name.c_str(), it->second.first, r);
          check.differing_parameter = plan.params[size_t(param % plan.params.size())].name;
          check.differing_ranks[0] = it->second.first;
          check.differing_ranks[1] = r;
          ok = 0;
          break;
        }
      }
    if (ok && compared > 0)
      std::printf("replicas: %d copies of parameters on other ranks are bit-identical to the first holder's\n",
                  compared);
    check.copies_compared = compared;
  }
  MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, world));
  check.identical = ok != 0;
  return check;
}

void print_in_rank_order(const std::string& text, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  Gathered<char> all = gather_to_root(std::vector<char>(text.begin(), text.end()), world);
  if (rank != 0) return;
  for (int r = 0; r < size; ++r) std::fwrite(all.begin(r), 1, size_t(all.end(r) - all.begin(r)), stdout);
  std::fflush(stdout);
}

}  // namespace piper
