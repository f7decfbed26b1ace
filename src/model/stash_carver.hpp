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
// `held`: the stash is held in bf16 (SegmentIO::stash_held) and `kept` is its view: bf16 activations are in place.
struct StashParts {
  void* kept = nullptr;
  void* tail = nullptr;
  StashLayout* layout = nullptr;
  void* held = nullptr;
  static StashParts of(const SegmentIO& io) { return {io.stash, io.stash_tail, nullptr, io.stash_held}; }
  static StashParts of(void* stash) { return {stash, nullptr}; }
  static StashParts recording(StashLayout* layout) { return {nullptr, nullptr, layout}; }
};

// Takes consecutive 4-byte ranges (floats or int32) of either part; with null bases it only counts, which is
// how a segment's sizes are made from the same code. finish() places the tail (call it before using tail
// pointers); kept_bytes and tail_bytes are the parts' sizes. Floats taken by keep() and tail() may be stored in
// bf16 (a bf16 run's stash); int32 ids and the floats of keep_exact() and tail_exact() (statistics: a norm's rstd,
// a softmax's log-sum-exp) are stored as they are. keep_act() and tail_act() take an activation that only matmuls
// read (Act): bf16 bits at 2 bytes each (rounded up to 4) where `bf16` (ModelDims::bf16_matmul_inputs). In a stash held in bf16
// (recording its layout, or StashParts::held) such an activation is in place: where the stash is held, in the
// layout's order, taking no room in the view; kept_bytes and tail_bytes are then the view's.
class StashCarver {
 public:
  explicit StashCarver(StashParts parts)
      : kept_(static_cast<char*>(parts.kept)), tail_(static_cast<char*>(parts.tail)),
        held_(static_cast<char*>(parts.held)), runs_(parts.layout ? parts.layout : (parts.held ? &own_ : nullptr)) {}
  explicit StashCarver(void* stash) : StashCarver(StashParts::of(stash)) {}

  template <typename T>
  T* keep(int64_t count) {
    return take<T>(count, !std::is_same_v<T, float>);
  }
  float* keep_exact(int64_t count) { return take<float>(count, true); }
  Act keep_act(int64_t count, bool bf16) {
    if (!bf16) return Act(keep<float>(count));
    if (runs_) {  // in place, where the stash is held
      const uint64_t at = runs_->packed_bytes();
      runs_->add(kept_bytes, bf16_bytes(count), true, true);
      return Act(held_ ? held_ + at : nullptr, true);
    }
    char* p = kept_ ? kept_ + kept_bytes : nullptr;
    kept_bytes += bf16_bytes(count);
    return Act(p, true);
  }
  template <typename T>
  void tail(T*& p, int64_t count) {
    tail_run(p, count, !std::is_same_v<T, float>);
  }
  void tail_exact(float*& p, int64_t count) { tail_run(p, count, true); }
  void tail_act(Act& a, int64_t count, bool bf16) {
    a = Act(nullptr, bf16);
    const size_t at = tail_bytes, run = tail_runs_.size();
    if (bf16 && runs_) {  // in place: where the stash holds it, known once the runs before it are (finish)
      pending_.push_back([&a, this, run](char*, const uint64_t* held_at) {
        a.p = held_ ? held_ + held_at[run] : nullptr;
      });
      add_tail_run({at, bf16_bytes(count), true, true});
      return;
    }
    pending_.push_back([&a, at](char* base, const uint64_t*) { a.p = base ? base + at : nullptr; });
    add_tail_run({at, bf16 ? bf16_bytes(count) : size_t(count) * 4, bf16});
  }
  void finish() {
    char* base = tail_ ? tail_ : (kept_ ? kept_ + kept_bytes : nullptr);
    std::vector<uint64_t> held_at(tail_runs_.size(), 0);  // each tail run's place where the stash is held
    if (runs_)  // the tail's runs after the kept part, where they are when the stash is one buffer
      for (size_t i = 0; i < tail_runs_.size(); ++i) {
        const StashRun& r = tail_runs_[i];
        held_at[i] = runs_->packed_bytes();
        runs_->add(kept_bytes + r.offset, r.bytes, r.exact, r.in_place);
      }
    for (const auto& place : pending_) place(base, held_at.data());
    pending_.clear();
    tail_runs_.clear();
  }
  size_t bytes() const { return kept_bytes + tail_bytes; }

  size_t kept_bytes = 0, tail_bytes = 0;

 private:
  template <typename T>
  T* take(int64_t count, bool exact) {
    T* p = kept_ ? reinterpret_cast<T*>(kept_ + kept_bytes) : nullptr;
    if (runs_) runs_->add(kept_bytes, size_t(count) * 4, exact);
    kept_bytes += size_t(count) * 4;
    return p;
  }
  template <typename T>
  void tail_run(T*& p, int64_t count, bool exact) {
    p = nullptr;
    const size_t at = tail_bytes;
    pending_.push_back([&p, at](char* base, const uint64_t*) { p = base ? reinterpret_cast<T*>(base + at) : nullptr; });
    add_tail_run({at, size_t(count) * 4, exact});
  }
  void add_tail_run(StashRun r) {
    tail_runs_.push_back(r);
    if (!r.in_place) tail_bytes += r.bytes;
  }
  static size_t bf16_bytes(int64_t count) { return (size_t(count) * 2 + 3) / 4 * 4; }

  char* kept_;
  char* tail_;
  char* held_;
  StashLayout own_;    // the runs so far, where only held_ is given
  StashLayout* runs_;  // where runs are recorded (the caller's layout, or own_), null when nothing is held
  std::vector<std::function<void(char*, const uint64_t*)>> pending_;  // the tail's pointers, placed by finish()
  std::vector<StashRun> tail_runs_;
};

}  // namespace piper
