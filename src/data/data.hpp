// Training data: token files (raw bytes, vocab 256; or .bin of little-endian uint16 tokens) and a
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
};

// Checks the data against the model before anything runs (file readable, long enough, tokens < vocab).
// Throws UserError naming data.path.
void validate_data(const DataConfig& cfg);

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
  std::pair<int32_t, int64_t> max_token() const;  // largest token id and its position
  // Start of sequence `index` of step `step` in the token stream.
  int64_t window_start(int64_t step, int index) const;

 private:
  int32_t token(int64_t pos) const;
  DataConfig cfg_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  bool u16_ = false;
  int64_t n_tokens_ = 0;
};

}  // namespace piper
