// Token sources (memory-mapped files), the random and sequential samplers, and the synthetic MLP task.
#include "data/data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/error.hpp"
#include "util/rng.hpp"

namespace piper {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DataLoader::DataLoader(const DataConfig& cfg) : cfg_(cfg) {
  if (cfg_.kind != DataConfig::Kind::Tokens) return;
  int fd = ::open(cfg_.path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError(cat("data.path: cannot open '", cfg_.path, "': ", std::strerror(errno)));
  struct stat st {};
  fstat(fd, &st);
  map_bytes_ = size_t(st.st_size);
  if (map_bytes_ > 0) {
    void* p = mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw SystemError(cat("data.path: mmap of '", cfg_.path, "' failed: ", std::strerror(errno)));
    }
    map_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  u16_ = ends_with(cfg_.path, ".bin");
  n_tokens_ = int64_t(u16_ ? map_bytes_ / 2 : map_bytes_);
}

DataLoader::~DataLoader() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

std::pair<int32_t, int64_t> DataLoader::max_token() const {
  int32_t best = -1;
  int64_t at = 0;
  for (int64_t i = 0; i < n_tokens_; ++i)
    if (token(i) > best) { best = token(i); at = i; }
  return {best, at};
}

int32_t DataLoader::token(int64_t pos) const {
  if (!u16_) return map_[pos];
  return int32_t(map_[2 * pos]) | (int32_t(map_[2 * pos + 1]) << 8);
}

int64_t DataLoader::window_start(int64_t step, int index) const {
  const int64_t span = n_tokens_ - cfg_.seq_len;  // valid starts: [0, span)
  if (cfg_.sequential) {
    int64_t seq = step * cfg_.batch + index;
    return (seq * cfg_.seq_len) % span;
  }
  uint64_t key = stream_key(cfg_.seed, "data.random");
  return int64_t(random_u64(key, uint64_t(step), uint32_t(index)) % uint64_t(span));
}

void DataLoader::inputs(int64_t step, int first, int count, int32_t* out) const {
  const int T = cfg_.seq_len;
  for (int i = 0; i < count; ++i) {
    int64_t start = window_start(step, first + i);
    for (int t = 0; t < T; ++t) out[int64_t(i) * T + t] = token(start + t);
  }
}

void DataLoader::targets(int64_t step, int first, int count, int32_t* out) const {
  const int T = cfg_.seq_len;
  for (int i = 0; i < count; ++i) {
    int64_t start = window_start(step, first + i) + 1;
    for (int t = 0; t < T; ++t) out[int64_t(i) * T + t] = token(start + t);
  }
}

void DataLoader::features(int64_t step, int first, int count, float* out) const {
  uint64_t key = stream_key(cfg_.seed, "data.features");
  for (int i = 0; i < count; ++i) {
    uint64_t sample = uint64_t(step) * uint64_t(cfg_.batch) + uint64_t(first + i);
    for (int j = 0; j < cfg_.d_in; ++j)
      out[int64_t(i) * cfg_.d_in + j] = random_normal(key, sample * uint64_t(cfg_.d_in) + uint64_t(j));
  }
}

void DataLoader::labels(int64_t step, int first, int count, int32_t* out) const {
  // Teacher: label = argmax over classes of (W_teacher x), W_teacher (K, d_in) fixed by the seed.
  std::vector<float> x(static_cast<size_t>(cfg_.d_in));
  uint64_t tkey = stream_key(cfg_.seed, "data.teacher");
  for (int i = 0; i < count; ++i) {
    features(step, first + i, 1, x.data());
    int best = 0;
    double best_v = -1e300;
    for (int k = 0; k < cfg_.n_classes; ++k) {
      double v = 0;
      for (int j = 0; j < cfg_.d_in; ++j)
        v += double(random_normal(tkey, uint64_t(k) * uint64_t(cfg_.d_in) + uint64_t(j))) * x[size_t(j)];
      if (v > best_v) { best_v = v; best = k; }
    }
    out[i] = best;
  }
}

void validate_data(const DataConfig& cfg) {
  if (cfg.kind != DataConfig::Kind::Tokens) return;
  DataLoader loader(cfg);
  bool u16 = ends_with(cfg.path, ".bin");
  if (!u16 && cfg.vocab < 256)
    throw UserError(cat("data.path: '", cfg.path, "' is read as raw bytes (token ids 0..255) but model.vocab = ",
                        cfg.vocab, "; use vocab = 256 or a .bin file of uint16 tokens"));
  if (loader.num_tokens() < int64_t(cfg.seq_len) + 2)
    throw UserError(cat("data.path: '", cfg.path, "' holds ", loader.num_tokens(), " tokens; model.seq_len = ",
                        cfg.seq_len, " needs at least ", cfg.seq_len + 2));
  if (u16) {
    auto [max_tok, at] = loader.max_token();
    if (max_tok >= cfg.vocab)
      throw UserError(cat("data.path: '", cfg.path, "' holds token id ", max_tok, " at position ", at,
                          ", not below model.vocab = ", cfg.vocab));
  }
}

}  // namespace piper
