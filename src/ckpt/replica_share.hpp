// Replicas of a data-parallel group that hold the same ranges of a checkpoint split their reading: each
// reads and checks a contiguous part of the ranges and broadcasts it, piece by piece, to the others.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "backend/kernels.hpp"
#include "ckpt/block_read.hpp"
#include "model/model.hpp"

namespace piper {

// A range every rank of the group holds alike: elements [begin, begin + count) of group/spec.name, which go
// to `dst` (this rank's own buffer memory).
struct SharedRange {
  const char* group;
  const ParamSpec* spec;
  int64_t begin, count;
  float* dst;
};

class ReplicaShare {
 public:
  // The group of the world ranks `members` (collective over them; every member passes the same list), whose
  // `ranges` are the same on every member (up to dst), in the same order. The ranges are cut into pieces of
  // whole checksum blocks; member r of n reads the r-th contiguous n-th of the pieces.
  ReplicaShare(std::vector<SharedRange> ranges, MPI_Comm world, const std::vector<int32_t>& members);
  ~ReplicaShare();
  ReplicaShare(const ReplicaShare&) = delete;
  ReplicaShare& operator=(const ReplicaShare&) = delete;
  // Whether every rank of the group described the same ranges (collective over the group); when not, the
  // group reads as if unshared and this object does nothing.
  bool agreed() const { return agreed_; }
  // Announces this rank's own part to the reader (before any read, in the order read() reads).
  void expect(BlockCheckedReader& reader) const;
  // Reads and checks this rank's part and receives the others', round by round (collective over the group).
  // A failure on any rank ends every rank's reading: the rank that found it rethrows its error, the others
  // throw CheckpointLoadAbandoned. `before`, a failure this rank met before (announcing its reads), takes
  // part in the first round's agreement and is rethrown.
  void read(BlockCheckedReader& reader, Kernels& k, std::exception_ptr before = nullptr);

 private:
  struct Piece {
    size_t range;
    int64_t at, n;  // elements [at, at + n) of the range
  };
  std::vector<SharedRange> ranges_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the group's own communicator
  int me_ = 0, size_ = 1;
  bool agreed_ = false;
  std::vector<std::vector<Piece>> parts_;  // the pieces rank r reads, in file order
};

}  // namespace piper
