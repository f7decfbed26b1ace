// A flight recorder: one stream's last instructions (which, of which step, started and finished when) in a
// fixed ring that its own thread writes without locks or allocation, and the watchdog reads at any time.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

namespace piper {

class FlightRecorder {
 public:
  static constexpr int kSize = 64;  // instructions kept per stream

  struct Record {
    int32_t instr = -1;
    int64_t step = 0;
    double start = 0;  // seconds (now_seconds)
    double end = -1;   // < 0: not finished
  };

  // The stream's thread: instruction `instr` of `step` starts at time t. Returns the number to finish it by.
  uint64_t start(int32_t instr, int64_t step, double t) {
    const uint64_t n = count_.load(std::memory_order_relaxed);
    Slot& s = ring_[n % kSize];
    s.seq.store(0, std::memory_order_relaxed);  // a reader sees the slot as changing
    std::atomic_thread_fence(std::memory_order_release);
    s.instr.store(instr, std::memory_order_relaxed);
    s.step.store(step, std::memory_order_relaxed);
    s.start.store(t, std::memory_order_relaxed);
    s.end.store(-1, std::memory_order_relaxed);
    s.seq.store(n + 1, std::memory_order_release);
    count_.store(n + 1, std::memory_order_release);
    return n;
  }
  // The stream's thread: record n finished at time t (ignored when the ring has moved past it).
  void finish(uint64_t n, double t) {
    Slot& s = ring_[n % kSize];
    if (s.seq.load(std::memory_order_relaxed) == n + 1) s.end.store(t, std::memory_order_release);
    last_end_.store(t, std::memory_order_relaxed);
  }
  // The stream's thread: it waits for instruction `on` before starting `instr` (-1, -1: it waits for nothing).
  void waiting(int32_t instr, int32_t on) {
    wait_instr_.store(instr, std::memory_order_relaxed);
    wait_on_.store(on, std::memory_order_relaxed);
  }

  // Any thread. When an instruction of this stream last finished (< 0: never).
  double last_end() const { return last_end_.load(std::memory_order_relaxed); }
  // Any thread. The instruction the stream waits to start and what it waits for; -1 when not waiting.
  int32_t waiting_instr() const { return wait_instr_.load(std::memory_order_relaxed); }
  int32_t waiting_on() const { return wait_on_.load(std::memory_order_relaxed); }
  // Any thread. The records still in the ring, oldest first (a slot being rewritten at that moment is skipped).
  std::vector<Record> snapshot() const {
    std::vector<Record> out;
    const uint64_t n = count_.load(std::memory_order_acquire);
    for (uint64_t k = n > uint64_t(kSize) ? n - kSize : 0; k < n; ++k) {
      const Slot& s = ring_[k % kSize];
      if (s.seq.load(std::memory_order_acquire) != k + 1) continue;
      Record r;
      r.instr = s.instr.load(std::memory_order_relaxed);
      r.step = s.step.load(std::memory_order_relaxed);
      r.start = s.start.load(std::memory_order_relaxed);
      r.end = s.end.load(std::memory_order_acquire);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.seq.load(std::memory_order_relaxed) != k + 1) continue;
      out.push_back(r);
    }
    return out;
  }

 private:
  struct Slot {
    std::atomic<uint64_t> seq{0};  // record number + 1 of what the slot holds; 0 while empty or being written
    std::atomic<int32_t> instr{-1};
    std::atomic<int64_t> step{0};
    std::atomic<double> start{0}, end{-1};
  };
  std::array<Slot, kSize> ring_;
  std::atomic<uint64_t> count_{0};  // records started so far
  std::atomic<double> last_end_{-1};
  std::atomic<int32_t> wait_instr_{-1}, wait_on_{-1};
};

}  // namespace piper
