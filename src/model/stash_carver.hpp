// Carving a segment's stash (forward → backward state) into named tensors, in two parts: what selective
// recompute keeps through the forward, then the "tail" it recomputes before the backward (SegmentIO::stash_tail).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "model/segment_type.hpp"

namespace piper {

// Where the two parts of a stash are: the tail in a buffer of its own, or (null) right after the kept part.
// `layout`, when set, receives the runs the carver takes (with null bases: how SegmentType::stash_layout is made).
struct StashParts {
  void* kept = nullptr;
  void* tail = nullptr;
  StashLayout* layout = nullptr;
  static StashParts of(const SegmentIO& io) { return {io.stash, io.stash_tail}; }
  static StashParts of(void* stash) { return {stash, nullptr}; }
  static StashParts recording(StashLayout* layout) { return {nullptr, nullptr, layout}; }
};

// Takes consecutive 4-byte ranges (floats or int32) of either part; with null bases it only counts, which is
// how a segment's sizes are made from the same code. finish() places the tail (call it before using tail
// pointers); kept_bytes and tail_bytes are the parts' sizes. Floats taken by keep() and tail() may be stored in
// bf16 (a bf16 run's stash); int32 ids and the floats of keep_exact() (statistics: a norm's rstd, a softmax's
// log-sum-exp) are stored as they are.
class StashCarver {
 public:
  explicit StashCarver(StashParts parts)
      : kept_(static_cast<char*>(parts.kept)), tail_(static_cast<char*>(parts.tail)), layout_(parts.layout) {}
  explicit StashCarver(void* stash) : StashCarver(StashParts::of(stash)) {}

  template <typename T>
  T* keep(int64_t count) {
    return take<T>(count, !std::is_same_v<T, float>);
  }
  float* keep_exact(int64_t count) { return take<float>(count, true); }
  template <typename T>
  void tail(T*& p, int64_t count) {
    p = nullptr;
    const size_t at = tail_bytes;
    pending_.push_back([&p, at](char* base) { p = base ? reinterpret_cast<T*>(base + at) : nullptr; });
    tail_runs_.push_back({at, size_t(count) * 4, !std::is_same_v<T, float>});
    tail_bytes += size_t(count) * 4;
  }
  void finish() {
    char* base = tail_ ? tail_ : (kept_ ? kept_ + kept_bytes : nullptr);
    for (const auto& place : pending_) place(base);
    pending_.clear();
    if (layout_)  // the tail's runs after the kept part, where they are when the stash is one buffer
      for (StashRun r : tail_runs_) layout_->add(kept_bytes + r.offset, r.bytes, r.exact);
    tail_runs_.clear();
  }
  size_t bytes() const { return kept_bytes + tail_bytes; }

  size_t kept_bytes = 0, tail_bytes = 0;

 private:
  template <typename T>
  T* take(int64_t count, bool exact) {
    T* p = kept_ ? reinterpret_cast<T*>(kept_ + kept_bytes) : nullptr;
    if (layout_) layout_->add(kept_bytes, size_t(count) * 4, exact);
    kept_bytes += size_t(count) * 4;
    return p;
  }

  char* kept_;
  char* tail_;
  StashLayout* layout_;
  std::vector<std::function<void(char*)>> pending_;  // the tail's pointers, placed by finish()
  std::vector<StashRun> tail_runs_;
};

}  // namespace piper
