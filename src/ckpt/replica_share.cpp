// Replicas of a data-parallel group split the reading of the checkpoint ranges they hold alike and
// broadcast what each read, so the file comes off the disk (or the shared file system) once per group.
#include "ckpt/replica_share.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "ckpt/checkpoint.hpp"
#include "ckpt/checksum.hpp"
#include "util/mpi_check.hpp"

namespace piper {

ReplicaShare::ReplicaShare(std::vector<SharedRange> ranges, MPI_Comm world, const std::vector<int32_t>& members)
    : ranges_(std::move(ranges)) {
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_CHECK(MPI_Comm_group(world, &world_group));
  MPI_CHECK(MPI_Group_incl(world_group, int(members.size()), members.data(), &group));
  MPI_CHECK(MPI_Comm_create_group(world, group, 0, &comm_));
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  MPI_CHECK(MPI_Comm_rank(comm_, &me_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Pieces of whole checksum blocks of each tensor, so that no block is read by two ranks.
  std::vector<Piece> pieces;
  int64_t total = 0;
  Fnv1a64 described;  // each range's tensor, begin and count
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const SharedRange& r = ranges_[i];
    described.add_string(r.spec->name);
    described.add_u64(uint64_t(r.begin));
    described.add_u64(uint64_t(r.count));
    const int64_t block = int64_t(checksum_block_elements(uint64_t(r.spec->numel)));
    for (int64_t at = 0; at < r.count;) {
      const int64_t next_edge = (r.begin + at) / block * block + block;  // the next block boundary
      const int64_t n = std::min(r.count - at, next_edge - (r.begin + at));
      pieces.push_back({i, at, n});
      at += n;
    }
    total += r.count;
  }
  // The group reads together only if every rank described the same ranges.
  const uint64_t signature = described.value();
  uint64_t mine[2] = {signature, ~signature}, all[2] = {0, 0};
  MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_MAX, comm_));
  agreed_ = all[0] == signature && all[1] == ~signature;
  if (!agreed_) return;
  parts_.resize(size_t(size_));
  int64_t before = 0;
  for (const Piece& p : pieces) {
    const int r = total > 0 ? int(std::min<int64_t>(size_ - 1, before * size_ / total)) : 0;
    parts_[size_t(r)].push_back(p);
    before += p.n;
  }
}

ReplicaShare::~ReplicaShare() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ReplicaShare::expect(BlockCheckedReader& reader) const {
  if (!agreed_) return;
  for (const Piece& p : parts_[size_t(me_)]) {
    const SharedRange& r = ranges_[p.range];
    reader.expect(r.group, *r.spec, r.begin + p.at, p.n);
  }
}

// The reading of a round does not wait for the broadcasts of the rounds before: on CPU buffers every
// broadcast goes straight into (or out of) its place in the state and stays in flight while this rank reads
// its next piece; the rank waits for them at the end, sleeping between polls, so that a rank that is done
// does not take the processor from one still reading. A failure is agreed on once, at the end: a rank
// that failed still takes part in every broadcast (with whatever its buffer holds), so that none waits.
void ReplicaShare::read(BlockCheckedReader& reader, Kernels& k, std::exception_ptr before) {
  if (!agreed_) {
    if (before) std::rethrow_exception(before);
    return;
  }
  const bool direct = k.buffers_on_host();
  std::exception_ptr failure = before;
  std::vector<float> own, incoming;  // this rank's piece and another's, when buffers are on a device
  std::vector<MPI_Request> in_flight;
  auto all_done = [&] {
    int done = 1;
    if (!in_flight.empty()) MPI_CHECK(MPI_Testall(int(in_flight.size()), in_flight.data(), &done, MPI_STATUSES_IGNORE));
    if (done) in_flight.clear();
    return done != 0;
  };
  size_t rounds = 0;
  for (const auto& part : parts_) rounds = std::max(rounds, part.size());
  for (size_t round = 0; round < rounds; ++round) {
    // This rank's piece of the round: read, checked and uploaded (and staged, when buffers are on a device).
    if (round < parts_[size_t(me_)].size()) {
      const Piece& p = parts_[size_t(me_)][round];
      const SharedRange& r = ranges_[p.range];
      if (!direct) own.assign(size_t(p.n), 0.0f);
      if (!failure) try {
          reader.read(r.group, *r.spec, r.begin + p.at, p.n, [&](const float* data, int64_t at, int64_t n) {
            k.upload(r.dst + p.at + at, data, size_t(n) * sizeof(float));
            if (!direct) std::copy(data, data + n, own.begin() + at);
            all_done();  // moves the broadcasts in flight along
          });
        } catch (...) {
          failure = std::current_exception();
        }
    }
    // Every rank's piece of the round, from the rank that read it.
    for (int root = 0; root < size_; ++root) {
      if (round >= parts_[size_t(root)].size()) continue;
      const Piece& p = parts_[size_t(root)][round];
      const SharedRange& r = ranges_[p.range];
      if (direct) {
        in_flight.push_back(MPI_REQUEST_NULL);
        MPI_CHECK(MPI_Ibcast(r.dst + p.at, int(p.n), MPI_FLOAT, root, comm_, &in_flight.back()));
        continue;
      }
      float* buf = own.data();
      if (root != me_) {
        incoming.resize(size_t(p.n));
        buf = incoming.data();
      }
      MPI_CHECK(MPI_Bcast(buf, int(p.n), MPI_FLOAT, root, comm_));
      if (root != me_) k.upload(r.dst + p.at, buf, size_t(p.n) * sizeof(float));
    }
    all_done();
  }
  while (!all_done()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  int failed = failure ? 1 : 0, any = 0;
  MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm_));
  if (failure) std::rethrow_exception(failure);
  if (any) throw CheckpointLoadAbandoned("a replica could not read its part of the checkpoint");
}

}  // namespace piper
