// The checkpoint checksum (format version 2): FNV-1a 64-bit over every root attribute but `checksum` and
// over every dataset's path, shape and stored bytes; the exact byte stream is in docs/checkpoint-format.md.
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

// FNV-1a, 64 bits: offset basis 0xcbf29ce484222325, prime 0x100000001b3.
class Fnv1a64 {
 public:
  void add(const void* data, size_t n);
  void add_u64(uint64_t v);               // 8 bytes, little-endian
  void add_string(const std::string& s);  // its length (add_u64), then its bytes
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// One dataset's share of the checksum.
struct DatasetDigest {
  std::string path;           // from the root, without a leading '/': "params/wte"
  std::vector<uint64_t> dims;
  uint64_t element_size = 0;  // bytes per element as stored
  uint64_t bytes_hash = 0;    // Fnv1a64 of the stored bytes, row-major
};

constexpr const char* kChecksumAttribute = "checksum";

// The checksum of `file` given its datasets' digests: the root attributes (all but "checksum", by name in
// byte order), then the digests by path in byte order. Throws UserError for an attribute of a type it
// does not cover (integer, float and string attributes are covered).
uint64_t checkpoint_checksum(hid_t file, std::vector<DatasetDigest> datasets);

// "fnv1a64:" and 16 lowercase hex digits: the value of the `checksum` attribute.
std::string checksum_text(uint64_t checksum);

}  // namespace piper
