// Token sources (files read with pread, their size checked before each batch), the random and sequential
// samplers, and the synthetic MLP task.
#include "data/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "util/error.hpp"
#include "util/file_io.hpp"
#include "util/rng.hpp"

namespace piper {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Token W bytes wide at p, little-endian whatever the host.
template <int W>
inline uint32_t load(const uint8_t* p) {
  if constexpr (W == 1) {
    return p[0];
  } else {
    std::conditional_t<W == 2, uint16_t, uint32_t> v;
    std::memcpy(&v, p, W);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    if constexpr (W == 2) v = __builtin_bswap16(v); else v = __builtin_bswap32(v);
#endif
    return v;
  }
}

// Largest of n tokens: no position tracked, so the loop vectorizes; first_at finds where, stopping there.
template <int W>
uint32_t max_of(const uint8_t* p, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, load<W>(p + W * i));
  return m;
}

template <int W>
int64_t first_at(const uint8_t* p, int64_t n, uint32_t v) {
  for (int64_t i = 0; i < n; ++i)
    if (load<W>(p + W * i) == v) return i;
  return -1;
}

// True when every 16-bit word at an odd position is at most `bound` (stops at the first that is not).
bool odd_words_at_most(const uint8_t* p, int64_t words, uint32_t bound) {
  for (int64_t i = 1; i < words; i += 2)
    if (load<2>(p + 2 * i) > bound) return false;
  return true;
}

const char* width_name(int w) {
  return w == 1 ? "raw bytes" : w == 2 ? "little-endian uint16" : "little-endian uint32";
}

// "read as little-endian uint16 by its .bin suffix": how the width was chosen.
std::string read_as(const DataConfig& cfg, int w) {
  if (cfg.token_bytes != 0) return cat("read as ", width_name(w), " by data.token_bytes = ", cfg.token_bytes);
  if (w == 1) return "read as raw bytes, its name not ending in .bin";
  const char* suffix = w == 4 ? ".u32.bin" : ends_with(cfg.path, ".u16.bin") ? ".u16.bin" : ".bin";
  return cat("read as ", width_name(w), " by its ", suffix, " suffix");
}

// What makes the file read with width w: a name, or data.token_bytes if that chose the width.
std::string to_read_as(const DataConfig& cfg, int w) {
  if (cfg.token_bytes != 0) return cat("set data.token_bytes = ", w);
  if (w == 1) return "give it a name that does not end in .bin";
  return w == 2 ? "name it .u16.bin" : "name it .u32.bin";
}

}  // namespace

int token_bytes_of(const DataConfig& cfg) {
  switch (cfg.token_bytes) {
    case 1: case 2: case 4: return cfg.token_bytes;
    case 0: break;
    default:
      throw UserError(cat("data.token_bytes = ", cfg.token_bytes,
                          ": expected 1, 2 or 4 bytes per token id (or 0: by the suffix of data.path)"));
  }
  if (ends_with(cfg.path, ".u32.bin")) return 4;
  if (ends_with(cfg.path, ".bin")) return 2;  // .u16.bin or plain .bin
  return 1;
}

FileIdentity file_identity_of(int fd, const std::string& path) {
  constexpr int64_t kMiB = int64_t(1) << 20;
  struct stat st {};
  FileIdentity id;
  std::vector<uint8_t> buf;
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64: offset basis
  int err = fstat(fd, &st) == 0 ? 0 : errno;
  if (err == 0) {
    id.bytes = int64_t(st.st_size);
    id.device = uint64_t(st.st_dev);
    id.inode = uint64_t(st.st_ino);
    const int64_t head = std::min(id.bytes, kMiB), tail_at = std::max<int64_t>(0, id.bytes - kMiB);
    for (auto [at, n] : {std::pair<int64_t, int64_t>{0, head}, {tail_at, id.bytes - tail_at}}) {
      buf.resize(size_t(n));
      if (err == 0) err = pread_all(fd, buf.data(), size_t(n), uint64_t(at));  // retries EINTR
      for (int64_t i = 0; err == 0 && i < n; ++i) h = (h ^ buf[size_t(i)]) * 1099511628211ull;  // FNV prime
    }
  }
  if (err != 0)
    throw UserError(cat("data.path: cannot read '", path, "': ", err == kEndOfFile ? "the file shrank" : file_error_text(err)));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  id.hash = cat("fnv1a64:", hex);
  return id;
}

FileIdentity file_identity(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(cat("data.path: cannot open '", path, "': ", std::strerror(errno)));
  try {
    FileIdentity id = file_identity_of(fd, path);
    ::close(fd);
    return id;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string replaced_file_text(const FileIdentity& id, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return cat("nothing: ", std::strerror(errno));
  if (uint64_t(st.st_dev) == id.device && uint64_t(st.st_ino) == id.inode) return "";
  return cat("another file, of ", int64_t(st.st_size), " bytes");
}

DataLoader::DataLoader(const DataConfig& cfg) : cfg_(cfg) {
  if (cfg_.kind != DataConfig::Kind::Tokens) return;
  width_ = token_bytes_of(cfg_);
  fd_ = ::open(cfg_.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError(cat("data.path: cannot open '", cfg_.path, "': ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw SystemError(cat("data.path: cannot stat '", cfg_.path, "': ", std::strerror(err)));
  }
  file_bytes_ = int64_t(st.st_size);
  n_tokens_ = file_bytes_ / width_;  // a partial last token is ignored; validate_data rejects it
  try {
    identity_ = file_identity_of(fd_, cfg_.path);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

DataLoader::~DataLoader() {
  if (fd_ >= 0) ::close(fd_);
}

void DataLoader::changed() const {
  struct stat st {};
  const std::string now = fstat(fd_, &st) == 0 ? cat(int64_t(st.st_size), " bytes") : std::string("unknown");
  throw DataFileChanged(cat("data.path: '", cfg_.path, "' changed during the run: it was ", file_bytes_,
                            " bytes when the run started, now ", now, "; a data file must stay as it is while "
                            "piper trains on it (write a new file and point data.path at it)"));
}

void DataLoader::check_unchanged() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0 || int64_t(st.st_size) != file_bytes_) changed();
}

void DataLoader::read_bytes(int64_t at, int64_t n, uint8_t* dst) const {
  const int err = pread_all(fd_, dst, size_t(n), uint64_t(at));
  if (err == kEndOfFile) changed();  // the end of the file came before the end of its size at open: it shrank
  if (err != 0) throw SystemError(cat("data.path: reading '", cfg_.path, "' failed: ", std::strerror(err)));
}

template <typename Fn>
void DataLoader::scan(Fn&& fn) const {
  constexpr int64_t kChunk = int64_t(4) << 20;  // a multiple of every token width
  std::vector<uint8_t> buf(size_t(std::min(kChunk, file_bytes_)));
  for (int64_t at = 0; at < file_bytes_; at += kChunk) {
    const int64_t n = std::min(kChunk, file_bytes_ - at);
    read_bytes(at, n, buf.data());
    if (!fn(static_cast<const uint8_t*>(buf.data()), n, at)) return;
  }
}

namespace {

// out[t] = token t of the W-byte tokens at raw, for raw the last W·n bytes of out's 4·n: token t sits at
// byte (4-W)·n + W·t, at or after out[t], and is read before out[t] is written, so going forward never
// overwrites a token not yet read.
template <int W>
void widen(const uint8_t* raw, int n, int32_t* out) {
  // Ids are below model.vocab (an int) once validate_data has passed, so they fit an int32.
  for (int t = 0; t < n; ++t) out[t] = int32_t(load<W>(raw + W * t));
}

}  // namespace

void DataLoader::read_tokens(int64_t pos, int n, int32_t* out) const {
  uint8_t* raw = reinterpret_cast<uint8_t*>(out) + size_t(4 - width_) * size_t(n);
  read_bytes(pos * width_, int64_t(n) * width_, raw);
  if (width_ == 1) widen<1>(raw, n, out);
  else if (width_ == 2) widen<2>(raw, n, out);
  else widen<4>(raw, n, out);
}

std::pair<int64_t, int64_t> DataLoader::max_token() const {
  if (n_tokens_ == 0) return {-1, 0};
  const int w = width_;
  uint32_t m = 0;
  scan([&](const uint8_t* p, int64_t bytes, int64_t) {
    const int64_t n = bytes / w;
    m = std::max(m, w == 1 ? max_of<1>(p, n) : w == 2 ? max_of<2>(p, n) : max_of<4>(p, n));
    return true;
  });
  int64_t at = -1;
  scan([&](const uint8_t* p, int64_t bytes, int64_t offset) {
    const int64_t n = bytes / w;
    int64_t i = w == 1 ? first_at<1>(p, n, m) : w == 2 ? first_at<2>(p, n, m) : first_at<4>(p, n, m);
    if (i >= 0) at = offset / w + i;
    return i < 0;
  });
  return {int64_t(m), at};
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
  check_unchanged();
  for (int i = 0; i < count; ++i) read_tokens(window_start(step, first + i), T, out + int64_t(i) * T);
}

void DataLoader::targets(int64_t step, int first, int count, int32_t* out) const {
  const int T = cfg_.seq_len;
  check_unchanged();
  for (int i = 0; i < count; ++i) read_tokens(window_start(step, first + i) + 1, T, out + int64_t(i) * T);
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
  const int w = loader.token_bytes();
  const std::string file = cat("data.path: '", cfg.path, "'");
  if (w == 1 && cfg.vocab < 256)
    throw UserError(cat(file, " is read as raw bytes (token ids 0..255) but model.vocab = ", cfg.vocab,
                        "; use vocab = 256, or a file of token ids: .u16.bin (or .bin) of uint16, "
                        ".u32.bin of uint32"));
  const int64_t bytes = loader.file_bytes();
  if (bytes % w != 0) {
    std::string why = w == 2 ? cat("the file is truncated, or it holds raw bytes: ", to_read_as(cfg, 1))
                      : bytes % 2 == 0 ? cat("it would be a whole number of uint16 tokens: if it holds uint16 ids, ",
                                             to_read_as(cfg, 2))
                                       : std::string("the file is truncated or not a file of uint32 token ids");
    throw UserError(cat(file, " is ", bytes, " bytes, not a whole number of ", w, "-byte tokens (", read_as(cfg, w),
                        "); ", why));
  }
  if (loader.num_tokens() < int64_t(cfg.seq_len) + 2)
    throw UserError(cat(file, " holds ", loader.num_tokens(), " tokens; model.seq_len = ", cfg.seq_len,
                        " needs at least ", cfg.seq_len + 2));
  if (w == 1) return;
  if (w == 2) {
    // uint32 ids below vocab have high halves of at most (vocab-1) >> 16: read as uint16, every second word is
    // that small (0 for vocab <= 65536) while the low halves are not. Real uint16 token data is never like that.
    const int64_t words = loader.num_tokens();
    const uint32_t high = cfg.vocab > 0 ? uint32_t(cfg.vocab - 1) >> 16 : 0;
    if (words >= 16 && words % 2 == 0) {
      bool odd_small = true;
      uint32_t even_max = 0;
      loader.scan([&](const uint8_t* p, int64_t n, int64_t) {  // chunks start at even words
        const int64_t chunk_words = n / 2;
        if (!odd_words_at_most(p, chunk_words, high)) return odd_small = false;
        for (int64_t i = 0; i < chunk_words; i += 2) even_max = std::max(even_max, load<2>(p + 2 * i));
        return true;
      });
      if (odd_small && even_max > high)
        throw UserError(cat(file, " looks like little-endian uint32 token ids ", read_as(cfg, 2),
                            ": every second 16-bit word is ", high == 0 ? cat("0") : cat("at most ", high),
                            ", as the high halves of uint32 ids below model.vocab = ", cfg.vocab, " would be; ",
                            to_read_as(cfg, 4)));
    }
    // Named .bin, the file most likely lost its high halves; data.token_bytes = 2 says the ids are meant to fit.
    if (cfg.vocab > 65536 && cfg.token_bytes == 0)
      throw UserError(cat(file, " is ", read_as(cfg, 2), " but model.vocab = ", cfg.vocab,
                          ": ids >= 65536 cannot be stored in a .bin of uint16; write the tokens as uint32 to a "
                          ".u32.bin file (tools/tokens-to-bin.py does)"));
  }
  auto [max_tok, at] = loader.max_token();
  if (max_tok >= cfg.vocab) {
    std::string hint;
    if (w == 4) {
      // uint16 tokens read in pairs as uint32 make ids of (second token) * 65536 + (first): nearly all of them
      // too large, while as uint16 every one would fit. A uint32 file with a few bad ids is not like that.
      int64_t too_large = 0;
      uint32_t max16 = 0;
      loader.scan([&](const uint8_t* p, int64_t n, int64_t) {
        for (int64_t i = 0; i < n / 4; ++i) too_large += load<4>(p + 4 * i) >= uint32_t(cfg.vocab);
        max16 = std::max(max16, max_of<2>(p, n / 2));
        return true;
      });
      if (2 * too_large > loader.num_tokens() && int64_t(max16) < cfg.vocab)
        hint = cat("; ", too_large, " of its ", loader.num_tokens(), " ids are that large, but read as uint16 every "
                   "id would be below model.vocab: if it holds uint16 ids, ", to_read_as(cfg, 2));
      else
        hint = "; the ids come from a larger vocabulary than this model's, or the file is not uint32 token ids";
    }
    throw UserError(cat(file, " holds token id ", max_tok, " at position ", at, ", not below model.vocab = ",
                        cfg.vocab, " (", read_as(cfg, w), ")", hint));
  }
}

}  // namespace piper
