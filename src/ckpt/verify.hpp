// Checkpoint verification: everything a resume relies on (format, version, checksum, the file name's step,
// every tensor readable and finite), checked on one file without a model; used by --resume.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace piper {

constexpr const char* kCheckpointFormat = "piper-checkpoint";  // the `format` attribute
constexpr int64_t kCheckpointVersion = 3;                      // written; 1 and 2 are still read

struct CheckpointInfo {
  int64_t step = 0;            // completed steps
  int64_t format_version = 0;  // 1 (no checksum), 2 (Fletcher32 chunks, one hash per tensor), 3 (block hashes)
  bool checksummed = false;    // a `checksum` attribute was present and matched
  std::string job_name;        // the `job_name` attribute of the job that wrote it ("" when absent)
};

// Reads the whole file. Throws UserError "PATH: what is wrong" when it is not a piper checkpoint of a
// version this piper reads, its checksum does not match its contents, a tensor cannot be read (Fletcher32,
// version 2), does not match its block checksums (version 3) or holds a non-finite value, or its name is
// step_N.h5 with N other than its `step` attribute. `name` is the file name to check against the step
// (default: the name in `path`; a temporary file is checked against the name it will get); a name not of
// the form step_*.h5 is not checked. With `read_data` false, a version-3 file's tensors are not read: their
// recorded block checksums are taken as they are (for a save whose ranks hashed what they wrote).
CheckpointInfo verify_checkpoint(const std::string& path, const std::string& name = "", bool read_data = true);

// The block hashes a version-3 tensor (dataset `ds`, `path` from the root, `numel` elements) records, and
// in `block` its elements per block. Throws UserError "tensor 'PATH' ..." when either attribute is missing
// or unreadable, the block size is not positive, or the number of hashes does not fit the tensor.
std::vector<uint64_t> recorded_block_hashes(hid_t ds, const std::string& path, uint64_t numel, uint64_t& block);

}  // namespace piper
