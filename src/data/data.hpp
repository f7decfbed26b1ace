// Training data: token files (raw bytes; .bin/.u16.bin of little-endian uint16; .u32.bin of uint32) and a
// synthetic classification task for the MLP. Every batch is a pure function of (seed, step, position
// in the global batch), so any rank can produce exactly its slice of any step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace piper {

struct DataConfig {
  enum class Kind : uint8_t { Tokens, Synthetic } kind = Kind::Tokens;
  std::string path;
  int vocab = 256, seq_len = 0;
  bool sequential = false;  // sampler: sequential windows, else random windows
  uint64_t seed = 0;
  int batch = 0;            // global batch (sequences or samples)
  int d_in = 0, n_classes = 0;  // synthetic
  // Bytes per token id: 0 takes it from the file name (.u32.bin: 4; .u16.bin or .bin: 2; else raw bytes, 1),
  // or 1, 2 or 4 whatever the name.
  int token_bytes = 0;
};

// The token width of cfg's file: cfg.token_bytes if set, else by the suffix of cfg.path. Throws UserError
// for a token_bytes other than 0, 1, 2 or 4.
int token_bytes_of(const DataConfig& cfg);

// Checks the data against the model before anything runs: file readable, a whole number of tokens of its
// width, long enough, every id < vocab, and not plainly of another width (uint32 ids read as uint16 or the
// reverse). Throws UserError naming data.path, the file and what would be right.
void validate_data(const DataConfig& cfg);

// What a checkpoint records of a token file, so that --resume can tell whether it is the same file: its
// size and an FNV-1a 64 hash of its first and its last MiB (the whole file when shorter), as
// "fnv1a64:" + 16 hex digits; `device` and `inode` say which file it was (not recorded). Throws UserError
// naming data.path when the file cannot be read.
struct FileIdentity {
  int64_t bytes = 0;
  std::string hash;
  uint64_t device = 0, inode = 0;
};
FileIdentity file_identity(const std::string& path);
// The identity of the file open as `fd` (named `path` in messages): what a run reads through its descriptor,
// whatever `path` names later.
FileIdentity file_identity_of(int fd, const std::string& path);

// "" while `path` still names the file `id` was taken of; else what it names now ("another file, of N
// bytes", "nothing: ..."): a file renamed over it, or the file moved away, since.
std::string replaced_file_text(const FileIdentity& id, const std::string& path);

class DataLoader {
 public:
  explicit DataLoader(const DataConfig& cfg);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Sequences [first, first+count) of step `step`'s global batch: inputs (count,T) and targets (count,T).
  void inputs(int64_t step, int first, int count, int32_t* out) const;
  void targets(int64_t step, int first, int count, int32_t* out) const;
  // Synthetic task: features (count, d_in) and labels (count).
  void features(int64_t step, int first, int count, float* out) const;
  void labels(int64_t step, int first, int count, int32_t* out) const;

  int64_t num_tokens() const { return n_tokens_; }
  int64_t file_bytes() const { return file_bytes_; }
  // The token file as it was opened (taken once, from the descriptor): what this run trains on.
  const FileIdentity& identity() const { return identity_; }
  int token_bytes() const { return width_; }
  std::pair<int64_t, int64_t> max_token() const;  // largest token id and its first position; -1 if none
  // Start of sequence `index` of step `step` in the token stream.
  int64_t window_start(int64_t step, int index) const;

 private:
  friend void validate_data(const DataConfig& cfg);
  // The file is read with pread, never mapped: a file cut short under a running job is an error naming it
  // (DataFileChanged), not a SIGBUS. Every batch first checks that the size is still the one it had at open.
  void check_unchanged() const;
  [[noreturn]] void changed() const;
  void read_bytes(int64_t at, int64_t n, uint8_t* dst) const;
  // Tokens [pos, pos + n) as int32, read into the tail of out's bytes and widened in place (no buffer).
  void read_tokens(int64_t pos, int n, int32_t* out) const;
  // Calls fn(bytes, count, offset) over the whole file in chunks whose offsets are multiples of 4 bytes;
  // stops early when fn returns false.
  template <typename Fn>
  void scan(Fn&& fn) const;
  DataConfig cfg_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  int width_ = 1;
  int64_t n_tokens_ = 0;
  FileIdentity identity_;
};

}  // namespace piper
