// Parallel checkpoint writing (see parallel_save.hpp): rank 0's layout of the file, every rank's pwrite of
// its slices at their file offsets with the checksum of each block, and rank 0's completion of the file.
#include "ckpt/parallel_save.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <filesystem>
#include <thread>
#include <utility>

#include "ckpt/checksum.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"
#include "util/file_io.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_gather.hpp"

namespace piper {

namespace fs = std::filesystem;
using h5::Handle;

namespace {

const char* kGroupNames[3] = {"params", "adam_m", "adam_v"};
// The file's pages: O_DIRECT writes whole, aligned ones straight from (aligned) memory to the disk.
constexpr uint64_t kPage = 4096;
// Two host buffers of 8 MiB per rank while writing: one is written to the file while the next is filled.
constexpr int64_t kStagingElements = int64_t(1) << 21;
constexpr size_t kStagingBytes = size_t(kStagingElements) * sizeof(float) + kPage;  // room to align the data

// A page-aligned host buffer of `bytes` bytes.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : data(static_cast<unsigned char*>(std::aligned_alloc(kPage, bytes))) {
    if (!data) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  unsigned char* data;
};

// Rank 0: the file with its attributes and every tensor allocated; returns each tensor's offset.
std::vector<uint64_t> lay_out(const std::string& tmp, const CheckpointHeader& header,
                              const std::vector<ParamSpec>& params) {
  std::vector<uint64_t> offsets;
  Handle file(create_checkpoint_file(tmp), H5Fclose);
  write_checkpoint_header(file, header);
  for (int g = 0; g < 3; ++g) {
    Handle group(H5_CHECK(H5Gcreate2(file, kGroupNames[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    for (const ParamSpec& p : params) {
      Handle ds(create_checkpoint_tensor(group, p.name, p.shape), H5Dclose);
      const haddr_t at = H5Dget_offset(ds);
      PIPER_CHECK(p.numel == 0 || at != HADDR_UNDEF, "tensor ", kGroupNames[g], "/", p.name, " has no file offset");
      offsets.push_back(p.numel == 0 ? 0 : uint64_t(at));
    }
  }
  H5_CHECK(file.close());
  return offsets;
}

// Reserves the blocks of the whole file, so that a full disk shows now rather than in some rank's write.
int reserve(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st;
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  if (err == 0 && st.st_size > 0 && ::fallocate(fd, 0, 0, st.st_size) != 0 && errno != EOPNOTSUPP) err = errno;
  ::close(fd);
  return err;
}

}  // namespace

int write_file_range(int buffered, int& direct, const unsigned char* data, size_t n, uint64_t offset) {
  const uint64_t end = offset + n;
  const uint64_t body_from = std::min(end, (offset + kPage - 1) / kPage * kPage);
  const uint64_t body_to = std::max(body_from, end / kPage * kPage);
  if (direct < 0 || body_to == body_from) return pwrite_all(buffered, data, n, offset);
  if (int err = pwrite_all(buffered, data, size_t(body_from - offset), offset)) return err;
  int err = pwrite_all(direct, data + (body_from - offset), size_t(body_to - body_from), body_from);
  if (err == EINVAL) {
    direct = -1;
    err = pwrite_all(buffered, data + (body_from - offset), size_t(body_to - body_from), body_from);
  }
  if (err != 0) return err;
  return pwrite_all(buffered, data + (body_to - offset), size_t(end - body_to), body_to);
}

ParallelCheckpointWrite::ParallelCheckpointWrite(std::string final_path, const CheckpointHeader& header,
                                                 const std::vector<ParamSpec>& params, std::vector<SaveSlice> mine,
                                                 MPI_Comm comm)
    : final_path_(std::move(final_path)), params_(params), mine_(std::move(mine)) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const fs::path fp(final_path_);
  const fs::path dir = fp.parent_path().empty() ? fs::path(".") : fp.parent_path();
  tmp_path_ = (dir / ("." + fp.filename().string() + ".tmp")).string();
  if (rank_ == 0) {
    h5::quiet();
    try {
      fs::create_directories(dir);
      offsets_ = lay_out(tmp_path_, header, params_);
      if (int err = reserve(tmp_path_)) record(kExitFailure, cat(tmp_path_, ": ", std::strerror(err)));
    } catch (const std::exception& e) {
      record(kExitFailure, write_failure(tmp_path_, e));
    }
  }
  begin_code_ = code_;
  MPI_CHECK(MPI_Bcast(&begin_code_, 1, MPI_INT, 0, comm_));
  if (begin_code_ != 0) {
    if (rank_ == 0) abandon_file(-1, tmp_path_);
    done_ = true;
    return;
  }
  offsets_.resize(params_.size() * 3);
  MPI_CHECK(MPI_Bcast(offsets_.data(), int(offsets_.size()), MPI_UINT64_T, 0, comm_));
}

ParallelCheckpointWrite::~ParallelCheckpointWrite() {
  if (!done_ && rank_ == 0) abandon_file(-1, tmp_path_);
  MPI_Comm_free(&comm_);
}

void ParallelCheckpointWrite::record(int code, const std::string& why) {
  if (code_ == 0) code_ = code, failure_ = why;
}

void ParallelCheckpointWrite::write_local(const SliceSource& source) {
  if (code_ != 0 || mine_.empty()) return;
  const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return record(kExitFailure, cat(tmp_path_, ": ", std::strerror(errno)));
  // Whole pages go to the disk directly, past the page cache (steady bandwidth, no GBs of cached pages);
  // a file system without O_DIRECT (tmpfs) gets every write through the page cache.
  const int direct_fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  int direct = direct_fd;  // -1 once the file system refused a direct write
  // Double buffering: while a thread writes one buffer to the file, this one fills the other, checks it
  // for non-finite values and hashes it; the file gets the buffers in order, one write in flight.
  AlignedBuffer staging[2] = {AlignedBuffer(kStagingBytes), AlignedBuffer(kStagingBytes)};
  std::thread in_flight;
  int write_error = 0;
  auto wait_for_write = [&] {
    if (in_flight.joinable()) in_flight.join();
    if (write_error != 0 && code_ == 0) record(kExitFailure, cat(tmp_path_, ": ", std::strerror(write_error)));
  };
  int cur = 0;
  for (size_t si = 0; si < mine_.size() && code_ == 0; ++si) {
    const SaveSlice& s = mine_[si];
    const ParamSpec& spec = params_[size_t(s.param)];
    const size_t tensor = size_t(s.group) * params_.size() + size_t(s.param);
    const uint64_t block = checksum_block_elements(uint64_t(spec.numel));
    // The blocks that start in this slice are hashed from what is written; the last one may end in the
    // next rank's slice, and is then read back once everyone has written.
    const int64_t first_block = (s.start + int64_t(block) - 1) / int64_t(block);
    const int64_t hashed_from = first_block * int64_t(block);
    BlockHasher hasher(block * sizeof(float));
    bool hashing = false;
    for (int64_t at = 0; at < s.count && code_ == 0; at += kStagingElements) {
      const int64_t n = std::min(kStagingElements, s.count - at);
      const uint64_t offset = offsets_[tensor] + uint64_t(s.start + at) * sizeof(float);
      // (n) values of the slice from `at` on, placed where file pages and buffer pages line up
      unsigned char* bytes = staging[cur].data + offset % kPage;
      float* buf = reinterpret_cast<float*>(bytes);
      source(si, at, n, buf);
      const float* bad = std::find_if(buf, buf + n, [](float v) { return !std::isfinite(v); });
      if (bad != buf + n) {
        record(kExitNonFinite, cat("tensor '", kGroupNames[s.group], "/", spec.name, "' holds a non-finite value (",
                                   *bad, " at element ", s.start + at + (bad - buf), ")"));
        break;
      }
      // Elements from hashed_from on feed the block hashes.
      const int64_t skip = std::clamp<int64_t>(hashed_from - (s.start + at), 0, n);
      if (skip < n) {
        hasher.add(buf + skip, size_t(n - skip) * sizeof(float));
        hashing = true;
      }
      wait_for_write();
      if (code_ != 0) break;
      in_flight = std::thread([&write_error, &direct, fd, bytes, n, offset] {
        write_error = write_file_range(fd, direct, bytes, size_t(n) * sizeof(float), offset);
      });
      cur ^= 1;
    }
    if (!hashing || code_ != 0) continue;
    std::vector<uint64_t> h = hasher.finish();
    const int64_t end = s.start + s.count;
    const int64_t last_block = (end - 1) / int64_t(block);
    if (std::min<int64_t>((last_block + 1) * int64_t(block), spec.numel) > end) {
      h.pop_back();  // it continues past this slice
      crossing_.push_back({tensor, uint64_t(last_block)});
    }
    for (size_t i = 0; i < h.size(); ++i) hashes_.insert(hashes_.end(), {tensor, uint64_t(first_block) + i, h[i]});
  }
  wait_for_write();
  if (code_ == 0 && ::fsync(fd) != 0) record(kExitFailure, cat(tmp_path_, ": fsync: ", std::strerror(errno)));
  if (direct_fd >= 0) ::close(direct_fd);
  if (::close(fd) != 0) record(kExitFailure, cat(tmp_path_, ": ", std::strerror(errno)));
}

int ParallelCheckpointWrite::agree(int code) {
  std::vector<char> text(failure_.begin(), failure_.end());
  Gathered<char> texts = gather_to_root(text, comm_);
  int worst = 0;
  MPI_CHECK(MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, comm_));
  if (rank_ == 0 && worst != 0 && code_ == 0)
    for (int r = 1; r < size_; ++r)
      if (texts.counts[size_t(r)] > 0) {
        code_ = worst;
        failure_ = cat("rank ", r, ": ", std::string(texts.begin(r), texts.end(r)));
        break;
      }
  return worst;
}

int ParallelCheckpointWrite::complete() {
  if (done_) return begin_code_;
  // Every rank has written (and fsynced) its slices once this agreement returns.
  int code = agree(code_);
  if (code == 0) {
    const int fd = crossing_.empty() ? -1 : ::open(tmp_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && !crossing_.empty()) record(kExitFailure, cat(tmp_path_, ": ", std::strerror(errno)));
    std::vector<unsigned char> buf;
    for (const auto& [tensor, b] : crossing_) {
      if (code_ != 0) break;
      const uint64_t numel = uint64_t(params_[tensor % params_.size()].numel);
      const uint64_t block = checksum_block_elements(numel);
      const uint64_t n = std::min(numel, (b + 1) * block) - b * block;
      buf.resize(size_t(n * sizeof(float)));
      if (int err = pread_all(fd, buf.data(), buf.size(), offsets_[tensor] + b * block * sizeof(float)))
        record(kExitFailure, cat(tmp_path_, ": reading back: ", file_error_text(err)));
      else
        hashes_.insert(hashes_.end(), {uint64_t(tensor), b, block_hash(buf.data(), buf.size())});
    }
    if (fd >= 0) ::close(fd);
    code = agree(code_);
  }
  Gathered<uint64_t> all = gather_to_root(code == 0 ? hashes_ : std::vector<uint64_t>{}, comm_);
  if (rank_ == 0 && code == 0) {
    std::vector<std::vector<uint64_t>> hashes(params_.size() * 3);
    std::vector<std::vector<bool>> seen(params_.size() * 3);
    for (size_t t = 0; t < hashes.size(); ++t) {
      const uint64_t numel = uint64_t(params_[t % params_.size()].numel);
      hashes[t].assign(checksum_block_count(numel, checksum_block_elements(numel)), 0);
      seen[t].assign(hashes[t].size(), numel == 0);
      if (numel == 0) hashes[t][0] = block_hash(nullptr, 0);
    }
    for (int r = 0; r < size_; ++r)
      for (const uint64_t* e = all.begin(r); e < all.end(r); e += 3) {
        PIPER_CHECK(e[0] < hashes.size() && e[1] < hashes[e[0]].size() && !seen[e[0]][e[1]],
                    "checkpoint block (", e[0], ", ", e[1], ") hashed twice or out of range");
        hashes[e[0]][e[1]] = e[2];
        seen[e[0]][e[1]] = true;
      }
    for (size_t t = 0; t < seen.size(); ++t)
      PIPER_CHECK(std::all_of(seen[t].begin(), seen[t].end(), [](bool b) { return b; }), "checkpoint tensor ",
                  kGroupNames[t / params_.size()], "/", params_[t % params_.size()].name, " is not covered by any rank");
    code = finish_rank0(hashes);
  }
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, comm_));
  if (rank_ == 0 && code != 0) abandon_file(-1, tmp_path_);
  done_ = true;
  return code;
}

int ParallelCheckpointWrite::finish_rank0(std::vector<std::vector<uint64_t>>& hashes) {
  try {
    Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    H5_CHECK(H5Pset_fapl_sec2(fapl));
    Handle file(H5_CHECK(H5Fopen(tmp_path_.c_str(), H5F_ACC_RDWR, fapl)), H5Fclose);
    std::vector<DatasetDigest> digests;
    for (size_t t = 0; t < hashes.size(); ++t) {
      const ParamSpec& p = params_[t % params_.size()];
      const char* group = kGroupNames[t / params_.size()];
      Handle ds(H5_CHECK(H5Dopen2(file, cat(group, "/", p.name).c_str(), H5P_DEFAULT)), H5Dclose);
      h5::write_attr_u64s(ds, kBlockHashesAttribute, hashes[t]);
      digests.push_back(tensor_digest(group, p.name, p.shape, std::move(hashes[t])));
    }
    h5::write_attr_str(file, kChecksumAttribute, checksum_text(checkpoint_checksum(file, std::move(digests))));
    H5_CHECK(file.close());
    if (int err = fsync_path(tmp_path_, false)) record(kExitFailure, cat(tmp_path_, ": fsync: ", std::strerror(err)));
  } catch (const std::exception& e) {
    record(kExitFailure, write_failure(tmp_path_, e));
  }
  if (code_ == 0) {  // every rank hashed what it wrote: the tensors are not read again here
    const std::string why = verify_and_rename(tmp_path_, final_path_, /*read_data=*/false);
    if (!why.empty()) record(kExitFailure, why);
  }
  return code_;
}

}  // namespace piper
