// The executor's memory: plan buffers allocated once (persistent) or at first use and released after
// their last use in a step, through a size-keyed cache so memory is touched once and reused. Tracks
// live bytes by kind, their peaks, and what is held between steps.
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

  // Pointer of a buffer, allocating a transient one on first use.
  void* acquire(int32_t id);
  float* f(int32_t id) { return static_cast<float*>(acquire(id)); }
  // Marks one use of a transient buffer finished; frees it after its last use of the step.
  void release_use(int32_t id);
  // Resets use counts for a new step (all transient buffers must have been released).
  void begin_step();
  // Resizes a persistent buffer (backend-sized scratch); contents are not kept.
  void resize(int32_t id, uint64_t bytes);
  MemoryStats stats();

 private:
  void* take(uint64_t bytes, BufferKind kind);
  void give(void* p, uint64_t bytes, BufferKind kind);
  const Plan& plan_;
  Backend& backend_;
  std::mutex mu_;
  std::vector<void*> ptr_;
  std::vector<uint64_t> bytes_;
  std::vector<int32_t> remaining_;
  std::multimap<uint64_t, void*> cache_;
  MemoryStats stats_;
};

}  // namespace piper
