// Carving a segment's stash (forward → backward state) into named tensors, in two parts: what selective
// recompute keeps through the forward, then the "tail" it recomputes before the backward (SegmentIO::stash_tail).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/segment_type.hpp"

namespace piper {

// Where the two parts of a stash are: the tail in a buffer of its own, or (null) right after the kept part.
struct StashParts {
  void* kept = nullptr;
  void* tail = nullptr;
  static StashParts of(const SegmentIO& io) { return {io.stash, io.stash_tail}; }
  static StashParts of(void* stash) { return {stash, nullptr}; }
};

// Takes consecutive 4-byte ranges (floats or int32) of either part; with null bases it only counts, which is
// how a segment's sizes are made from the same code. finish() places the tail (call it before using tail
// pointers); kept_bytes and tail_bytes are the parts' sizes.
class StashCarver {
 public:
  explicit StashCarver(StashParts parts) : kept_(static_cast<char*>(parts.kept)), tail_(static_cast<char*>(parts.tail)) {}
  explicit StashCarver(void* stash) : StashCarver(StashParts::of(stash)) {}

  template <typename T>
  T* keep(int64_t count) {
    T* p = kept_ ? reinterpret_cast<T*>(kept_ + kept_bytes) : nullptr;
    kept_bytes += size_t(count) * 4;
    return p;
  }
  template <typename T>
  void tail(T*& p, int64_t count) {
    p = nullptr;
    const size_t at = tail_bytes;
    pending_.push_back([&p, at](char* base) { p = base ? reinterpret_cast<T*>(base + at) : nullptr; });
    tail_bytes += size_t(count) * 4;
  }
  void finish() {
    char* base = tail_ ? tail_ : (kept_ ? kept_ + kept_bytes : nullptr);
    for (const auto& place : pending_) place(base);
    pending_.clear();
  }
  size_t bytes() const { return kept_bytes + tail_bytes; }

  size_t kept_bytes = 0, tail_bytes = 0;

 private:
  char* kept_;
  char* tail_;
  std::vector<std::function<void(char*)>> pending_;  // the tail's pointers, placed by finish()
};

}  // namespace piper
