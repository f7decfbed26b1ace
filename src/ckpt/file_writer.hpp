// The file-level pieces of writing a checkpoint, shared by piper's save and piper-ckpt import: the root
// attributes, contiguous tensors with block checksums, fsync, and turning a failed write into a message.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "ckpt/checksum.hpp"
#include "ckpt/resume_check.hpp"

namespace piper {

// Every root attribute of docs/checkpoint-format.md except `checksum`.
struct CheckpointHeader {
  int64_t step = 0;      // completed steps (also data_step)
  std::string job_name;  // job.name
  std::string job_text;  // the job file's text with its overrides
  std::string layout;    // the layout it was written from, for people
  RunRecord record;      // seed, sampler, model keys, data file
};
void write_checkpoint_header(hid_t file, const CheckpointHeader& h);

// Creates a checkpoint file (truncating one of that name) with the POSIX driver; tensors of 64 KiB and
// more start on a 4 KiB boundary.
hid_t create_checkpoint_file(const std::string& path);

// Creates group/name: float32 little-endian, contiguous, its storage allocated now (H5Dget_offset gives
// its place in the file) and never filled, with the attribute `checksum_block` and a zero placeholder of
// `checksum_xxh64` of the final length. Returns the open dataset. Throws h5::Error.
hid_t create_checkpoint_tensor(hid_t group, const std::string& name, const std::vector<int64_t>& shape);

// A tensor's share of the checksum, from its block hashes.
DatasetDigest tensor_digest(const char* group_name, const std::string& name, const std::vector<int64_t>& shape,
                            std::vector<uint64_t> block_hashes);

// Writes `data` (numel(shape) float32 values) as group/name with its block hashes; returns its share of
// the checksum. Throws h5::Error on a failed HDF5 call.
DatasetDigest write_checkpoint_tensor(hid_t group, const char* group_name, const std::string& name,
                                      const std::vector<int64_t>& shape, const float* data);

// Flushes a file's (or a folder's) data to the device: 0, or the errno of the failure.
int fsync_path(const std::string& path, bool folder);

// Why writing `file` failed, for people: the errno text the file driver saw ("No space left on device"),
// else the failed call with HDF5's reason and, on a nearly full file system, its free space.
std::string write_failure(const std::string& file, const std::exception& e);

// After a failed write: frees the temporary file's space, closes everything open in it and removes it.
void abandon_file(hid_t file, const std::string& path);

// The last step of every save: verifies the complete temporary file `tmp` under the name it will get (with
// `read_data` false, a version-3 file's tensor bytes are not read again), renames it to `final_path` and
// fsyncs the folder. "" when done, or why not.
std::string verify_and_rename(const std::string& tmp, const std::string& final_path, bool read_data);

// One checkpoint file being written: `.NAME.tmp` next to `final_path`, renamed to it only once complete,
// synced and verified. The first failure is kept and everything after it skipped; finish() reports it.
class CheckpointFileWriter {
 public:
  CheckpointFileWriter(const std::string& final_path, const CheckpointHeader& header);
  ~CheckpointFileWriter();  // an unfinished file is removed
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  // Writes group/name (group 0 params, 1 adam_m, 2 adam_v). A non-finite value is a failure
  // (kExitNonFinite) naming the tensor; the file is then never renamed.
  void tensor(int group, const std::string& name, const std::vector<int64_t>& shape, const float* data, size_t n);
  // The checksum, close, fsync, verify, rename and fsync of the folder. Returns 0, or the exit code of the
  // first failure (kExitFailure for I/O, kExitNonFinite) with `failure()` saying why; the temporary file is
  // then removed and the folder's older files are untouched.
  int finish();
  const std::string& failure() const { return failure_; }

 private:
  void record(int code, const std::string& why);
  std::string final_path_, tmp_path_, failure_;
  int code_ = 0;
  int64_t file_ = -1;  // hid_t
  int64_t groups_[3] = {-1, -1, -1};
  std::vector<DatasetDigest> digests_;
  bool finished_ = false;
};

}  // namespace piper
