// Block-checked reading of version-3 checkpoint tensors (see block_read.hpp): whole blocks by pread at
// the tensor's offset in the file, XXH64 of each against the recorded hash, then the range copied out.
#include "ckpt/block_read.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "ckpt/checksum.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"
#include "util/error.hpp"
#include "util/file_io.hpp"

namespace piper {

using h5::Handle;

hid_t open_checkpoint_tensor(hid_t file, const std::string& path, const char* group, const ParamSpec& p) {
  const std::string name = cat(group, "/", p.name);
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0 || H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(cat(path, ": checkpoint has no tensor '", name, "'; it was written for a different model"));
  Handle ds(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  Handle space(H5_CHECK(H5Dget_space(ds)), H5Sclose);
  const int nd = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  const std::vector<hsize_t> want(p.shape.begin(), p.shape.end());
  if (dims != want)
    throw UserError(cat(path, ": tensor '", name, "' has shape ", h5::dims_text(dims), " but the model expects ",
                        h5::dims_text(want)));
  return std::exchange(ds.id, -1);
}

BlockCheckedReader::BlockCheckedReader(hid_t file, std::string path) : file_(file), path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError(cat(path_, ": cannot be opened: ", std::strerror(errno)));
  // No POSIX_FADV_SEQUENTIAL or WILLNEED: both made cold reads slower here (bench/README.md)
}

namespace {
constexpr uint64_t kMaxGap = uint64_t(1) << 20;   // bytes between two reads that are read through
constexpr uint64_t kAhead = uint64_t(32) << 20;   // how far the read-ahead runs ahead of the reads
constexpr uint64_t kPiece = uint64_t(1) << 20;    // the read-ahead's read size
}  // namespace

void BlockCheckedReader::expect(const char* group, const ParamSpec& p, int64_t begin, int64_t count) {
  if (count <= 0 || ahead_.joinable()) return;
  const Stored& s = stored(cat(group, "/", p.name), p);
  const uint64_t numel = uint64_t(p.numel), block = s.block;
  const uint64_t first = uint64_t(begin) / block * block;
  const uint64_t last = std::min(numel, (uint64_t(begin + count) + block - 1) / block * block);
  const Extent e{s.offset + first * sizeof(float), s.offset + last * sizeof(float)};
  if (!extents_.empty() && e.from >= extents_.back().to && e.from - extents_.back().to <= kMaxGap)
    extents_.back().to = e.to;
  else
    extents_.push_back(e);
}

void BlockCheckedReader::start_read_ahead() {
  if (extents_.empty() || ahead_.joinable()) return;
  ahead_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (ahead_fd_ >= 0) ahead_ = std::thread([this] { read_ahead_loop(); });  // without it, reads just wait
}

// Reads the announced extents in order into a dropped buffer; a failed read ends it (read() reports).
void BlockCheckedReader::read_ahead_loop() {
  std::vector<char> sink(kPiece);
  uint64_t done = 0;  // bytes read ahead
  for (const Extent& e : extents_) {
    for (uint64_t at = e.from; at < e.to;) {
      {
        std::unique_lock<std::mutex> lock(ahead_mutex_);
        ahead_wake_.wait(lock, [&] { return ahead_stop_ || done < consumed_ + kAhead; });
        if (ahead_stop_) return;
      }
      const ssize_t n = ::pread(ahead_fd_, sink.data(), size_t(std::min(kPiece, e.to - at)), off_t(at));
      if (n <= 0) return;
      at += uint64_t(n);
      done += uint64_t(n);
    }
  }
}

void BlockCheckedReader::stop_read_ahead() {
  if (ahead_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(ahead_mutex_);
      ahead_stop_ = true;
    }
    ahead_wake_.notify_one();
    ahead_.join();
  }
  if (ahead_fd_ >= 0) ::close(ahead_fd_);
  ahead_fd_ = -1;
}

// Reads `bytes` at file offset `at`. A short jump forward from the last read reads the bytes between too
// (the headers between two tensors): the kernel's read-ahead keeps its full window only for reads that
// follow each other, and a run of jumps made the cold read of a whole checkpoint 2-3x slower than dd's.
int BlockCheckedReader::read_at(void* dst, uint64_t bytes, uint64_t at) {
  if (at > next_at_ && at - next_at_ <= kMaxGap) {
    gap_.resize(size_t(at - next_at_));
    if (pread_all(fd_, gap_.data(), gap_.size(), next_at_) != 0) gap_.clear();  // the read below reports
  }
  if (int err = pread_all(fd_, dst, size_t(bytes), at)) return err;
  next_at_ = at + bytes;
  if (ahead_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(ahead_mutex_);
      consumed_ += bytes;
    }
    ahead_wake_.notify_one();
  }
  return 0;
}

BlockCheckedReader::~BlockCheckedReader() {
  stop_read_ahead();
  if (fd_ >= 0) ::close(fd_);
}

const BlockCheckedReader::Stored& BlockCheckedReader::stored(const std::string& name, const ParamSpec& p) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  const std::string group = name.substr(0, name.find('/'));
  Handle ds(open_checkpoint_tensor(file_, path_, group.c_str(), p), H5Dclose);
  Handle dcpl(H5_CHECK(H5Dget_create_plist(ds)), H5Pclose);
  if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
    throw UserError(cat(path_, ": tensor '", name, "' is not stored contiguously, as format version 3 stores it"));
  Stored s;
  const uint64_t numel = uint64_t(p.numel);
  try {
    s.hashes = recorded_block_hashes(ds, name, numel, s.block);
  } catch (const UserError& e) {
    throw UserError(cat(path_, ": ", e.what()));
  }
  const haddr_t at = numel == 0 ? 0 : H5Dget_offset(ds);
  if (numel > 0 && at == HADDR_UNDEF)
    throw UserError(cat(path_, ": tensor '", name, "' has no data in the file (never written)"));
  s.offset = uint64_t(at);
  return tensors_.emplace(name, std::move(s)).first->second;
}

namespace {

constexpr uint64_t kChunkElements = uint64_t(1) << 18;  // 1 MiB of floats: read, hashed and checked at once

// Whether every float of data[0, n) is finite: one pass over the exponent bits, which the compiler vectorizes.
bool all_finite(const float* data, size_t n) {
  const auto* bits = reinterpret_cast<const uint32_t*>(data);
  uint32_t inf_or_nan = 0;
  for (size_t i = 0; i < n; ++i) inf_or_nan |= uint32_t((bits[i] & 0x7f800000u) == 0x7f800000u);
  return inf_or_nan == 0;
}

}  // namespace

void BlockCheckedReader::read(const char* group, const ParamSpec& p, int64_t begin, int64_t count, float* out) {
  read(group, p, begin, count, [&](const float* data, int64_t at, int64_t n) { std::copy(data, data + n, out + at); });
}

void BlockCheckedReader::read(const char* group, const ParamSpec& p, int64_t begin, int64_t count,
                              const Deliver& deliver) {
  if (count <= 0) return;
  start_read_ahead();
  const std::string name = cat(group, "/", p.name);
  const Stored& s = stored(name, p);
  const uint64_t numel = uint64_t(p.numel), end = uint64_t(begin + count);
  auto read_bytes = [&](void* dst, uint64_t elements, uint64_t first) {  // elements [first, first + n)
    if (int err = read_at(dst, elements * sizeof(float), s.offset + first * sizeof(float)))
      throw UserError(cat(path_, ": tensor '", name, "' cannot be read (", file_error_text(err),
                          "): the file is damaged or truncated"));
  };
  for (uint64_t b = uint64_t(begin) / s.block; b * s.block < end; ++b) {
    const uint64_t from = b * s.block, to = std::min(numel, from + s.block);  // the block's elements
    const uint64_t lo = std::max<uint64_t>(from, uint64_t(begin)), hi = std::min(to, end);  // the range's part
    // The block in chunks small enough to stay in the cache while they are hashed, checked and handed on
    // (a whole 4 MiB block read at once goes out to memory and back, at a fraction of the disk's speed).
    Xxh64 hash;
    std::string non_finite;  // the first one, reported once the hash says the block is as written
    for (uint64_t c = from; c < to; c += kChunkElements) {
      const uint64_t c_to = std::min(to, c + kChunkElements);
      block_.resize(size_t(c_to - c));
      read_bytes(block_.data(), c_to - c, c);
      hash.add(block_.data(), block_.size() * sizeof(float));
      if (non_finite.empty() && !all_finite(block_.data(), block_.size())) {
        const auto bad = std::find_if(block_.begin(), block_.end(), [](float v) { return !std::isfinite(v); });
        non_finite = cat(path_, ": tensor '", name, "' holds a non-finite value (", *bad, " at element ",
                         c + uint64_t(bad - block_.begin()), ")");
      }
      const uint64_t d_lo = std::max(lo, c), d_hi = std::min(hi, c_to);  // the range's part of the chunk
      if (d_lo < d_hi) deliver(block_.data() + (d_lo - c), int64_t(d_lo) - begin, int64_t(d_hi - d_lo));
    }
    if (hash.value() != s.hashes[size_t(b)])  // what was handed on is discarded with the whole load
      throw UserError(cat(path_, ": tensor '", name, "' is damaged (checksum mismatch): its block ", b, " (elements ",
                          from, " to ", to - 1, ") does not match its recorded hash"));
    if (!non_finite.empty()) throw UserError(non_finite);
  }
}

}  // namespace piper
