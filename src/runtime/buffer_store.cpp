// Buffer allocation with use counting and a size-keyed cache (see buffer_store.hpp).
#include "runtime/buffer_store.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace piper {

BufferStore::BufferStore(const Plan& plan, Backend& backend)
    : plan_(plan), backend_(backend), ptr_(plan.buffers.size(), nullptr), bytes_(plan.buffers.size(), 0),
      remaining_(plan.buffers.size(), 0), last_uses_(plan.buffers.size()) {
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlanBuffer& b = plan.buffers[i];
    bytes_[i] = b.bytes;
    if (!b.persistent) continue;
    ptr_[i] = take(b.bytes, b.kind).p;
    backend_.zero(ptr_[i], b.bytes);
  }
}

BufferStore::~BufferStore() {
  for (size_t i = 0; i < ptr_.size(); ++i)
    if (ptr_[i]) backend_.release(ptr_[i], bytes_[i]);
  for (auto& [bytes, block] : cache_) backend_.release(block.p, bytes);
}

BufferStore::Cached BufferStore::take(uint64_t bytes, BufferKind kind) {
  Cached block;
  auto it = cache_.find(bytes);
  if (it != cache_.end()) {
    block = std::move(it->second);
    cache_.erase(it);
  } else {
    block.p = backend_.allocate(bytes);
  }
  int k = int(kind);
  stats_.live_by_kind[k] += bytes;
  stats_.live_total += bytes;
  stats_.peak_by_kind[k] = std::max(stats_.peak_by_kind[k], stats_.live_by_kind[k]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  return block;
}

void BufferStore::give(Cached block, uint64_t bytes, BufferKind kind) {
  stats_.live_by_kind[int(kind)] -= bytes;
  stats_.live_total -= bytes;
  cache_.emplace(bytes, std::move(block));
}

void* BufferStore::acquire(int32_t id, StreamContext* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& p = ptr_[size_t(id)];
  if (!p) {
    const PlanBuffer& b = plan_.buffers[size_t(id)];
    Cached block = take(bytes_[size_t(id)], b.kind);
    // the earlier holder's device work may still run: this stream's work on the memory starts after it
    for (int32_t e : block.after) backend_.wait(stream, e);
    p = block.p;
    if (b.zero_from < b.bytes) backend_.zero(static_cast<char*>(p) + b.zero_from, b.bytes - b.zero_from);
  }
  return p;
}

void BufferStore::release_use(int32_t id, int stream, int32_t event) {
  const PlanBuffer& b = plan_.buffers[size_t(id)];
  if (b.persistent) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LastUse>& uses = last_uses_[size_t(id)];
  if (event >= 0) {
    auto same = std::find_if(uses.begin(), uses.end(), [&](const LastUse& u) { return u.stream == stream; });
    if (same != uses.end()) same->event = event;  // a stream's uses finish in order: the latest covers all
    else uses.push_back({stream, event});
  }
  if (--remaining_[size_t(id)] == 0) {
    Cached block{ptr_[size_t(id)], {}};
    for (const LastUse& u : uses) block.after.push_back(u.event);
    uses.clear();
    give(std::move(block), bytes_[size_t(id)], b.kind);
    ptr_[size_t(id)] = nullptr;
  }
}

void BufferStore::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    if (plan_.buffers[i].persistent) continue;
    PIPER_CHECK(ptr_[i] == nullptr, "buffer ", plan_.buffers[i].name, " still held at the start of a step");
    remaining_[i] = plan_.buffers[i].uses;
    last_uses_[i].clear();
  }
  // the previous step's device work is complete: cached memory is free to use at once
  for (auto& [bytes, block] : cache_) block.after.clear();
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
  ptr_[size_t(id)] = take(bytes, b.kind).p;
}

MemoryStats BufferStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace piper
