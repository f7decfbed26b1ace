// One checkpoint file written by every rank at once (format version 3): rank 0 lays the file out (root
// attributes, every tensor allocated contiguously), each rank writes the slices it owns at their offsets
// and hashes the checksum blocks that start in them, and rank 0 records the hashes, checks and renames.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/file_writer.hpp"
#include "model/model.hpp"

namespace piper {

// Elements [start, start + count) of the flattened tensor `param` of a group (0 params, 1 adam_m, 2 adam_v).
struct SaveSlice {
  int32_t group = 0;
  int64_t param = 0, start = 0, count = 0;
};

// Copies `count` values of slice `slice`, from element `at` within the slice on, into host memory `dst`.
using SliceSource = std::function<void(size_t slice, int64_t at, int64_t count, float* dst)>;

// Writes `n` bytes of `data` at file offset `offset`: the whole 4 KiB pages inside the range through
// `direct` (an O_DIRECT descriptor, or -1; `data` must then sit at offset % 4096 in a page-aligned buffer),
// the partial pages at its ends through `buffered`, so that no page is written both ways. A direct write
// the file system refuses (EINVAL) is done buffered, and `direct` becomes -1 for the writes after it.
// Returns 0 or the errno of the failed write.
int write_file_range(int buffered, int& direct, const unsigned char* data, size_t n, uint64_t offset);

class ParallelCheckpointWrite {
 public:
  // Collective over `comm`. Rank 0 creates `.NAME.tmp` next to `final_path` holding `header` (rank 0's is
  // used) and every tensor of `params` (identical on every rank), and reserves its space on the disk; every
  // rank learns where each tensor lies. `mine`: the slices this rank writes; together, every rank's slices
  // cover every tensor exactly once. begin_code() tells on every rank whether this worked.
  ParallelCheckpointWrite(std::string final_path, const CheckpointHeader& header, const std::vector<ParamSpec>& params,
                          std::vector<SaveSlice> mine, MPI_Comm comm);
  ~ParallelCheckpointWrite();  // closes what is open; an unfinished file is removed by rank 0
  ParallelCheckpointWrite(const ParallelCheckpointWrite&) = delete;
  ParallelCheckpointWrite& operator=(const ParallelCheckpointWrite&) = delete;

  // 0, or the exit code of a failed creation (failure() on rank 0 says why); then nothing else may be called.
  int begin_code() const { return begin_code_; }

  // Local, no MPI (it may run on a thread of its own): writes this rank's slices from `source` (a
  // non-finite value stops it), fsyncs them, and hashes the checksum blocks that lie whole in its slices.
  void write_local(const SliceSource& source);

  // Collective. The blocks that start in this rank's slices and end in another's are read back and hashed
  // once every rank has written; rank 0 records every hash and the file's checksum, checks the layout,
  // renames the file and fsyncs its folder. Returns 0 on every rank, or the exit code of the first failure
  // on any rank (kExitFailure for I/O, kExitNonFinite), with failure() on rank 0 naming the rank when it is
  // not rank 0; the temporary file is then removed.
  [[nodiscard]] int complete();

  const std::string& failure() const { return failure_; }
  const std::string& temporary_path() const { return tmp_path_; }

 private:
  void record(int code, const std::string& why);
  int finish_rank0(std::vector<std::vector<uint64_t>>& hashes);
  int agree(int code);  // collective: the first failure of any rank, its text to rank 0

  std::string final_path_, tmp_path_, failure_;
  int code_ = 0, begin_code_ = 0, rank_ = 0, size_ = 1;
  MPI_Comm comm_;
  std::vector<ParamSpec> params_;
  std::vector<SaveSlice> mine_;
  std::vector<uint64_t> offsets_;  // file offset of tensor (group * params + param)
  std::vector<uint64_t> hashes_;   // (tensor, block, hash) triples this rank computed
  std::vector<std::pair<size_t, uint64_t>> crossing_;  // (tensor, block) to hash once everyone has written
  bool done_ = false;
};

}  // namespace piper
