// Buffer allocation with use counting and a size-keyed cache (see buffer_store.hpp).
#include "runtime/buffer_store.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace piper {

BufferStore::BufferStore(const Plan& plan, Backend& backend)
    : plan_(plan), backend_(backend), ptr_(plan.buffers.size(), nullptr), bytes_(plan.buffers.size(), 0),
      remaining_(plan.buffers.size(), 0) {
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlanBuffer& b = plan.buffers[i];
    bytes_[i] = b.bytes;
    if (!b.persistent) continue;
    ptr_[i] = take(b.bytes, b.kind);
    backend_.zero(ptr_[i], b.bytes);
  }
}

BufferStore::~BufferStore() {
  for (size_t i = 0; i < ptr_.size(); ++i)
    if (ptr_[i]) backend_.release(ptr_[i], bytes_[i]);
  for (auto& [bytes, p] : cache_) backend_.release(p, bytes);
}

void* BufferStore::take(uint64_t bytes, BufferKind kind) {
  void* p = nullptr;
  auto it = cache_.find(bytes);
  if (it != cache_.end()) {
    p = it->second;
    cache_.erase(it);
  } else {
    p = backend_.allocate(bytes);
  }
  int k = int(kind);
  stats_.live_by_kind[k] += bytes;
  stats_.live_total += bytes;
  stats_.peak_by_kind[k] = std::max(stats_.peak_by_kind[k], stats_.live_by_kind[k]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  return p;
}

void BufferStore::give(void* p, uint64_t bytes, BufferKind kind) {
  stats_.live_by_kind[int(kind)] -= bytes;
  stats_.live_total -= bytes;
  cache_.emplace(bytes, p);
}

void* BufferStore::acquire(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& p = ptr_[size_t(id)];
  if (!p) {
    const PlanBuffer& b = plan_.buffers[size_t(id)];
    p = take(bytes_[size_t(id)], b.kind);
    if (b.zero_from < b.bytes) backend_.zero(static_cast<char*>(p) + b.zero_from, b.bytes - b.zero_from);
  }
  return p;
}

void BufferStore::release_use(int32_t id) {
  const PlanBuffer& b = plan_.buffers[size_t(id)];
  if (b.persistent) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (--remaining_[size_t(id)] == 0) {
    give(ptr_[size_t(id)], bytes_[size_t(id)], b.kind);
    ptr_[size_t(id)] = nullptr;
  }
}

void BufferStore::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    if (plan_.buffers[i].persistent) continue;
    PIPER_CHECK(ptr_[i] == nullptr, "buffer ", plan_.buffers[i].name, " still held at the start of a step");
    remaining_[i] = plan_.buffers[i].uses;
  }
}

void BufferStore::resize(int32_t id, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const PlanBuffer& b = plan_.buffers[size_t(id)];
  PIPER_CHECK(b.persistent, "only persistent buffers can be resized");
  if (ptr_[size_t(id)]) {
    stats_.live_by_kind[int(b.kind)] -= bytes_[size_t(id)];
    stats_.live_total -= bytes_[size_t(id)];
    backend_.release(ptr_[size_t(id)], bytes_[size_t(id)]);
  }
  bytes_[size_t(id)] = bytes;
  ptr_[size_t(id)] = take(bytes, b.kind);
}

MemoryStats BufferStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace piper
