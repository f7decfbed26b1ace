// The checkpoint checksums: FNV-1a 64-bit over every root attribute but `checksum` and over every dataset's
// path, shape and data (version 2: one FNV-1a hash of its bytes; version 3: the XXH64 hashes of its
// fixed-size blocks, which ranks compute in parallel); the exact byte streams are in docs/checkpoint-format.md.
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct XXH64_state_s;  // libxxhash's streaming state (xxhash.h)

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

// XXH64 (seed 0), the hash of xxHash (github.com/Cyan4973/xxHash, its spec doc/xxhash_spec.md) through libxxhash,
// fed in pieces of any size: the same value as the one-shot hash of all the bytes together. About 10 GB/s.
class Xxh64 {
 public:
  Xxh64();
  ~Xxh64();
  Xxh64(const Xxh64&) = delete;
  Xxh64& operator=(const Xxh64&) = delete;
  void reset();
  void add(const void* data, size_t n);
  uint64_t value() const;

 private:
  ::XXH64_state_s* state_;
};

// The hash of one block of a tensor (format version 3): XXH64 of its bytes.
uint64_t block_hash(const void* data, size_t n);

// Elements per checksum block of a tensor of `numel` elements: 2^20 (4 MiB), or a larger multiple of 2^20
// that keeps the tensor at 4096 blocks or fewer.
uint64_t checksum_block_elements(uint64_t numel);
// Blocks of a tensor: ceil(numel / block), and 1 (an empty block) for an empty tensor.
uint64_t checksum_block_count(uint64_t numel, uint64_t block_elements);

// block_hash of consecutive blocks of `block_bytes` bytes, fed in pieces of any size in order.
class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block_bytes) : block_bytes_(block_bytes) {}
  void add(const void* data, size_t n);
  // The hashes of every block, the last one possibly short (one empty block when nothing was added).
  std::vector<uint64_t> finish();

 private:
  void close_block();
  uint64_t block_bytes_, at_ = 0;  // bytes of the current block seen so far
  Xxh64 hash_;
  std::vector<uint64_t> hashes_;
};

// The dataset attributes of format version 3 that hold a tensor's block hashes.
constexpr const char* kBlockElementsAttribute = "checksum_block";      // int64: elements per block
constexpr const char* kBlockHashesAttribute = "checksum_xxh64";       // uint64[blocks]: block_hash of each

// One dataset's share of the checksum.
struct DatasetDigest {
  std::string path;           // from the root, without a leading '/': "params/wte"
  std::vector<uint64_t> dims;
  uint64_t element_size = 0;  // bytes per element as stored
  uint64_t bytes_hash = 0;    // version 2: Fnv1a64 of the stored bytes, row-major
  uint64_t block_elements = 0;         // version 3 (non-zero): elements per block
  std::vector<uint64_t> block_hashes;  // version 3: block_hash of each block
};

constexpr const char* kChecksumAttribute = "checksum";

// The checksum of `file` given its datasets' digests: the root attributes (all but "checksum", by name in
// byte order), then the digests by path in byte order. Throws UserError for an attribute of a type it
// does not cover (integer, float and string attributes are covered).
uint64_t checkpoint_checksum(hid_t file, std::vector<DatasetDigest> datasets);

// "fnv1a64:" and 16 lowercase hex digits: the value of the `checksum` attribute.
std::string checksum_text(uint64_t checksum);

}  // namespace piper
