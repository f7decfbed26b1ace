// The checkpoint checksums (see checksum.hpp): the FNV-1a and XXH64 hashers, the blocks, and the byte stream
// that root attributes and dataset digests feed into the file checksum.
#include "ckpt/checksum.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "ckpt/hdf5_util.hpp"

namespace piper {

void Fnv1a64::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h_ ^= p[i];
    h_ *= 0x100000001b3ull;
  }
}

void Fnv1a64::add_u64(uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  add(b, 8);
}

void Fnv1a64::add_string(const std::string& s) {
  add_u64(s.size());
  add(s.data(), s.size());
}

Xxh64::Xxh64() : state_(XXH64_createState()) {
  if (!state_) throw std::bad_alloc();
  reset();
}

Xxh64::~Xxh64() { XXH64_freeState(state_); }

void Xxh64::reset() { XXH64_reset(state_, 0); }

void Xxh64::add(const void* data, size_t n) {
  if (n > 0) XXH64_update(state_, data, n);  // (data may be null when n is 0)
}

uint64_t Xxh64::value() const { return XXH64_digest(state_); }

uint64_t block_hash(const void* data, size_t n) {
  Xxh64 h;
  h.add(data, n);
  return h.value();
}

uint64_t checksum_block_elements(uint64_t numel) {
  constexpr uint64_t kUnit = uint64_t(1) << 20, kMaxBlocks = 4096;
  const uint64_t need = (numel + kMaxBlocks - 1) / kMaxBlocks;
  return need <= kUnit ? kUnit : (need + kUnit - 1) / kUnit * kUnit;
}

uint64_t checksum_block_count(uint64_t numel, uint64_t block_elements) {
  return numel == 0 ? 1 : (numel + block_elements - 1) / block_elements;
}

void BlockHasher::close_block() {
  hashes_.push_back(hash_.value());
  hash_.reset();
  at_ = 0;
}

void BlockHasher::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const size_t take = size_t(std::min<uint64_t>(n, block_bytes_ - at_));
    hash_.add(p, take);
    at_ += take, p += take, n -= take;
    if (at_ == block_bytes_) close_block();
  }
}

std::vector<uint64_t> BlockHasher::finish() {
  if (at_ > 0 || hashes_.empty()) close_block();
  return std::move(hashes_);
}

namespace {

// One attribute: its name, a type letter ('i' integer, 'f' float, 's' string), its element count, then
// each element (integers as int64, floats as float64, both little-endian; strings as add_string).
void add_attribute(Fnv1a64& h, hid_t file, const std::string& name) {
  h5::Handle a(H5Aopen(file, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (a.id < 0) throw UserError(cat("attribute '", name, "' cannot be opened"));
  h5::Handle type(H5Aget_type(a), H5Tclose), space(H5Aget_space(a), H5Sclose);
  hssize_t n = space.id < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  H5T_class_t cls = type.id < 0 ? H5T_NO_CLASS : H5Tget_class(type);
  if (n < 0 || cls == H5T_NO_CLASS) throw UserError(cat("attribute '", name, "' cannot be read"));
  const size_t count = size_t(n);
  auto unreadable = [&] { return UserError(cat("attribute '", name, "' cannot be read")); };
  h.add_string(name);
  if (cls == H5T_INTEGER || cls == H5T_FLOAT) {
    h.add(cls == H5T_INTEGER ? "i" : "f", 1);
    h.add_u64(count);
    std::vector<uint64_t> bits(count);  // int64 or float64 values, as their 8 bytes
    if (H5Aread(a, cls == H5T_INTEGER ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, bits.data()) < 0) throw unreadable();
    for (uint64_t b : bits) h.add_u64(b);
  } else if (cls == H5T_STRING) {
    h.add("s", 1);
    h.add_u64(count);
    std::vector<std::string> values(count);
    if (H5Tis_variable_str(type) > 0) {
      h5::Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem, H5T_VARIABLE);
      H5Tset_cset(mem, H5Tget_cset(type));
      std::vector<char*> p(count, nullptr);
      if (H5Aread(a, mem, p.data()) < 0) throw unreadable();
      for (size_t i = 0; i < count; ++i) {
        values[i] = p[i] ? p[i] : "";
        H5free_memory(p[i]);
      }
    } else {
      const size_t width = H5Tget_size(type);
      std::vector<char> buf(count * width);
      if (width == 0 || H5Aread(a, type, buf.data()) < 0) throw unreadable();
      for (size_t i = 0; i < count; ++i) {
        const char* s = buf.data() + i * width;
        values[i].assign(s, std::find(s, s + width, '\0'));
      }
    }
    for (const std::string& v : values) h.add_string(v);
  } else {
    throw UserError(cat("attribute '", name, "' has a type the checksum does not cover (integer, float, string)"));
  }
}

}  // namespace

uint64_t checkpoint_checksum(hid_t file, std::vector<DatasetDigest> datasets) {
  Fnv1a64 h;
  for (const std::string& name : h5::attribute_names(file))
    if (name != kChecksumAttribute) add_attribute(h, file, name);
  std::sort(datasets.begin(), datasets.end(),
            [](const DatasetDigest& a, const DatasetDigest& b) { return a.path < b.path; });
  for (const DatasetDigest& d : datasets) {
    h.add_string(d.path);
    h.add_u64(d.dims.size());
    for (uint64_t n : d.dims) h.add_u64(n);
    h.add_u64(d.element_size);
    if (d.block_elements == 0) {
      h.add_u64(d.bytes_hash);
      continue;
    }
    h.add_u64(d.block_elements);
    h.add_u64(d.block_hashes.size());
    for (uint64_t b : d.block_hashes) h.add_u64(b);
  }
  return h.value();
}

std::string checksum_text(uint64_t checksum) {
  char s[32];
  std::snprintf(s, sizeof(s), "fnv1a64:%016llx", static_cast<unsigned long long>(checksum));
  return s;
}

}  // namespace piper
