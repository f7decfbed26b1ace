// Writing a checkpoint file's parts (see file_writer.hpp): root attributes, contiguous tensors with their
// block checksums, fsync, failure messages, and cleaning up after a failed write.
#include "ckpt/file_writer.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

namespace piper {

namespace fs = std::filesystem;
using h5::Handle;

void write_checkpoint_header(hid_t file, const CheckpointHeader& h) {
  h5::write_attr_str(file, "format", kCheckpointFormat);
  h5::write_attr_i64(file, "format_version", kCheckpointVersion);
  h5::write_attr_i64(file, "step", h.step);
  h5::write_attr_i64(file, "data_step", h.step);
  h5::write_attr_i64(file, "seed", h.record.seed);
  h5::write_attr_str(file, "sampler", h.record.sampler);
  h5::write_attr_str(file, "job_name", h.job_name);
  h5::write_attr_str(file, "job", h.job_text);
  h5::write_attr_str(file, "layout", h.layout);
  // What --resume compares (resume_check.hpp)
  h5::write_attr_str(file, "model", h.record.model);
  if (!h.record.has_data) return;
  h5::write_attr_str(file, "data_path", h.record.data_path);
  h5::write_attr_i64(file, "data_bytes", h.record.data_bytes);
  h5::write_attr_str(file, "data_hash", h.record.data_hash);
}

hid_t create_checkpoint_file(const std::string& path) {
  Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  H5_CHECK(H5Pset_fapl_sec2(fapl));  // the POSIX driver: its errors carry errno
  H5_CHECK(H5Pset_alignment(fapl, 64 << 10, 4096));  // tensors of 64 KiB and more start on a 4 KiB page
  return H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
}

hid_t create_checkpoint_tensor(hid_t group, const std::string& name, const std::vector<int64_t>& shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  uint64_t numel = 1;
  for (hsize_t d : dims) numel *= d;
  Handle space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  Handle dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));  // its place in the file is known before any write
  H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));    // and nothing is written there but the tensor
  Handle ds(H5_CHECK(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)),
            H5Dclose);
  const uint64_t block = checksum_block_elements(numel);
  h5::write_attr_i64(ds, kBlockElementsAttribute, int64_t(block));
  // A placeholder of the final length: writing the hashes later overwrites it in place.
  h5::write_attr_u64s(ds, kBlockHashesAttribute, std::vector<uint64_t>(checksum_block_count(numel, block), 0));
  return std::exchange(ds.id, -1);
}

DatasetDigest tensor_digest(const char* group_name, const std::string& name, const std::vector<int64_t>& shape,
                            std::vector<uint64_t> block_hashes) {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= uint64_t(d);
  DatasetDigest d{cat(group_name, "/", name), std::vector<uint64_t>(shape.begin(), shape.end()), sizeof(float), 0,
                  checksum_block_elements(numel), std::move(block_hashes)};
  return d;
}

DatasetDigest write_checkpoint_tensor(hid_t group, const char* group_name, const std::string& name,
                                      const std::vector<int64_t>& shape, const float* data) {
  Handle ds(create_checkpoint_tensor(group, name, shape), H5Dclose);
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= uint64_t(d);
  if (numel > 0) H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  BlockHasher hasher(checksum_block_elements(numel) * sizeof(float));
  hasher.add(data, size_t(numel) * sizeof(float));
  DatasetDigest d = tensor_digest(group_name, name, shape, hasher.finish());
  h5::write_attr_u64s(ds, kBlockHashesAttribute, d.block_hashes);
  H5_CHECK(ds.close());
  return d;
}

int fsync_path(const std::string& path, bool folder) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (folder ? O_DIRECTORY : 0));
  if (fd < 0) return errno;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}

std::string write_failure(const std::string& file, const std::exception& e) {
  int err = 0;
  if (const auto* h = dynamic_cast<const h5::Error*>(&e)) err = h->sys_errno;
  if (const auto* f = dynamic_cast<const fs::filesystem_error*>(&e)) err = f->code().value();
  if (err != 0) return cat(file, ": ", std::strerror(err));
  struct statvfs sv;
  std::string free_space;
  if (::statvfs(fs::path(file).parent_path().c_str(), &sv) == 0 && uint64_t(sv.f_bavail) * sv.f_frsize < (1u << 20))
    free_space = cat(" (its file system has only ", uint64_t(sv.f_bavail) * sv.f_frsize, " bytes free)");
  return cat(file, ": ", e.what(), free_space);
}

// Truncating first lets HDF5 flush what it still holds and close the file even on a full disk (a handle
// left open would crash HDF5's cleanup at exit).
std::string verify_and_rename(const std::string& tmp, const std::string& final_path, bool read_data) {
  try {
    verify_checkpoint(tmp, fs::path(final_path).filename().string(), read_data);
  } catch (const UserError& e) {
    return cat("the file written does not verify: ", e.what());
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) return cat("cannot rename ", tmp, " to ", final_path, ": ", ec.message());
  const fs::path dir = fs::path(final_path).parent_path().empty() ? fs::path(".") : fs::path(final_path).parent_path();
  if (int err = fsync_path(dir.string(), true)) return cat(dir.string(), ": fsync of the folder: ", std::strerror(err));
  return "";
}

void abandon_file(hid_t file, const std::string& path) {
  if (file >= 0) {
    void* fd = nullptr;
    if (H5Fget_vfd_handle(file, H5P_DEFAULT, &fd) >= 0 && fd) (void)::ftruncate(*static_cast<int*>(fd), 0);
    const unsigned kinds = H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR | H5F_OBJ_LOCAL;
    std::vector<hid_t> still_open(size_t(std::max<ssize_t>(0, H5Fget_obj_count(file, kinds))));
    still_open.resize(size_t(std::max<ssize_t>(0, H5Fget_obj_ids(file, kinds, still_open.size(), still_open.data()))));
    for (hid_t id : still_open) H5Iget_type(id) == H5I_ATTR ? H5Aclose(id) : H5Oclose(id);
    H5Fclose(file);
  }
  std::error_code ec;
  fs::remove(path, ec);
}

namespace {
const char* kGroupNames[3] = {"params", "adam_m", "adam_v"};
}  // namespace

CheckpointFileWriter::CheckpointFileWriter(const std::string& final_path, const CheckpointHeader& header)
    : final_path_(final_path) {
  const fs::path fp(final_path);
  const fs::path dir = fp.parent_path().empty() ? fs::path(".") : fp.parent_path();
  tmp_path_ = (dir / ("." + fp.filename().string() + ".tmp")).string();
  h5::quiet();
  try {
    fs::create_directories(dir);
    file_ = create_checkpoint_file(tmp_path_);
    write_checkpoint_header(hid_t(file_), header);
    for (int t = 0; t < 3; ++t)
      groups_[t] = H5_CHECK(H5Gcreate2(hid_t(file_), kGroupNames[t], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  } catch (const std::exception& e) {
    record(kExitFailure, write_failure(tmp_path_, e));
  }
}

CheckpointFileWriter::~CheckpointFileWriter() {
  if (finished_) return;
  for (int64_t& g : groups_)
    if (g >= 0) H5Gclose(hid_t(std::exchange(g, -1)));
  abandon_file(hid_t(std::exchange(file_, -1)), tmp_path_);
}

void CheckpointFileWriter::record(int code, const std::string& why) {
  if (failure_.empty()) failure_ = why, code_ = code;
}

void CheckpointFileWriter::tensor(int group, const std::string& name, const std::vector<int64_t>& shape,
                                  const float* data, size_t n) {
  if (!failure_.empty()) return;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i])) {
      record(kExitNonFinite, cat("tensor '", kGroupNames[group], "/", name, "' holds a non-finite value (", data[i],
                                 " at element ", i, ")"));
      return;
    }
  try {
    digests_.push_back(write_checkpoint_tensor(hid_t(groups_[group]), kGroupNames[group], name, shape, data));
  } catch (const std::exception& e) {
    record(kExitFailure, write_failure(tmp_path_, e));
  }
}

int CheckpointFileWriter::finish() {
  if (failure_.empty()) {
    try {
      h5::write_attr_str(hid_t(file_), kChecksumAttribute, checksum_text(checkpoint_checksum(hid_t(file_), digests_)));
      for (int64_t& g : groups_) H5_CHECK(H5Gclose(hid_t(std::exchange(g, -1))));
      H5_CHECK(H5Fclose(hid_t(std::exchange(file_, -1))));
      if (int err = fsync_path(tmp_path_, false)) record(kExitFailure, cat(tmp_path_, ": fsync: ", std::strerror(err)));
    } catch (const std::exception& e) {
      record(kExitFailure, write_failure(tmp_path_, e));
    }
  }
  if (failure_.empty()) {
    const std::string why = verify_and_rename(tmp_path_, final_path_, /*read_data=*/true);
    if (!why.empty()) record(kExitFailure, why);
  }
  if (failure_.empty()) {
    finished_ = true;
    return 0;
  }
  for (int64_t& g : groups_)
    if (g >= 0) H5Gclose(hid_t(std::exchange(g, -1)));
  abandon_file(hid_t(std::exchange(file_, -1)), tmp_path_);
  finished_ = true;
  return code_;
}

}  // namespace piper
