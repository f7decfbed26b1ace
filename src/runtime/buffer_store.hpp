// The executor's memory: plan buffers allocated once (persistent) or at first use and released after
// their last use in a step, through a size-keyed cache so memory is touched once and reused. Tracks
// live bytes by kind, their peaks, and what is held between steps. Where device work runs after the host
// moved on (CUDA), reused memory is ordered after the last device work of its previous holder by events.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "backend/backend.hpp"
#include "plan/plan.hpp"

namespace piper {

struct MemoryStats {
  uint64_t live_by_kind[kBufferKinds] = {0};
  uint64_t peak_by_kind[kBufferKinds] = {0};
  uint64_t live_total = 0, peak_total = 0;
};

class BufferStore {
 public:
  BufferStore(const Plan& plan, Backend& backend);
  ~BufferStore();
  BufferStore(const BufferStore&) = delete;
  BufferStore& operator=(const BufferStore&) = delete;

  // Pointer of a buffer, allocating a transient one on first use. Memory reused within a step is ordered,
  // on `stream` (the stream that will use it first), after the events its earlier holder's last uses
  // recorded; its padding is zeroed on that stream.
  void* acquire(int32_t id, StreamContext* stream = nullptr);
  float* f(int32_t id) { return static_cast<float*>(acquire(id)); }
  // Marks one use of a transient buffer finished by the instruction whose completion is backend event
  // `event`, on executor stream `stream`; frees the buffer after its last use of the step.
  void release_use(int32_t id, int stream = -1, int32_t event = -1);
  // Resets use counts for a new step (all transient buffers must have been released, and all device work
  // of the previous step be complete).
  void begin_step();
  // Resizes a persistent buffer (backend-sized scratch); contents are not kept.
  void resize(int32_t id, uint64_t bytes);
  MemoryStats stats();

 private:
  // Memory in the cache, with the events its last device uses recorded (one per stream at most).
  struct Cached {
    void* p = nullptr;
    std::vector<int32_t> after;
  };
  struct LastUse {
    int stream;
    int32_t event;
  };
  Cached take(uint64_t bytes, BufferKind kind);
  void give(Cached block, uint64_t bytes, BufferKind kind);
  const Plan& plan_;
  Backend& backend_;
  std::mutex mu_;
  std::vector<void*> ptr_;
  std::vector<uint64_t> bytes_;
  std::vector<int32_t> remaining_;
  std::vector<std::vector<LastUse>> last_uses_;  // per transient buffer, this step
  std::multimap<uint64_t, Cached> cache_;
  MemoryStats stats_;
};

}  // namespace piper
