// The file-level pieces of writing a checkpoint, shared by piper's save and piper-ckpt import: the root
// attributes, one chunked Fletcher32 tensor, fsync, and turning a failed write into a message for people.
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

// Writes `data` (numel(shape) float32 values) as group/name, chunked by whole rows with Fletcher32;
// returns its share of the checksum. Throws h5::Error on a failed HDF5 call.
DatasetDigest write_checkpoint_tensor(hid_t group, const char* group_name, const std::string& name,
                                      const std::vector<int64_t>& shape, const float* data);

// Flushes a file's (or a folder's) data to the device: 0, or the errno of the failure.
int fsync_path(const std::string& path, bool folder);

// Why writing `file` failed, for people: the errno text the file driver saw ("No space left on device"),
// else the failed call with HDF5's reason and, on a nearly full file system, its free space.
std::string write_failure(const std::string& file, const std::exception& e);

// After a failed write: frees the temporary file's space, closes everything open in it and removes it.
void abandon_file(hid_t file, const std::string& path);

}  // namespace piper
