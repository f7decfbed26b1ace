// Fixed-chunk OpenMP loops shared by the CPU kernel files: chunk boundaries depend only on the sizes and the
// chunk count, never on scheduling, so per-chunk reductions give the same bits on any number of threads.
#pragma once
#include <algorithm>
#include <cstddef>

namespace piper::cpu {

// One chunk, compiled once for each kernel: the serial and the threaded loop below both call this copy.
// Were fn inlined into each loop, the compiler could contract its arithmetic into FMAs differently in the two
// copies, and 1 and 2 threads would give different bits (an ASan build did, in layernorm_backward_input).
template <typename Fn>
[[gnu::noinline]] void run_chunk(Fn& fn, size_t c, size_t begin, size_t end) {
  fn(c, begin, end);
}

// Runs fn(chunk, begin, end) over [0, n) in `chunks` fixed pieces, on up to `threads` threads.
template <typename Fn>
void for_chunks(size_t n, size_t chunks, int threads, Fn fn) {
  if (n == 0) return;
  chunks = std::max<size_t>(1, std::min(chunks, n));
  if (threads <= 1 || chunks == 1) {
    for (size_t c = 0; c < chunks; ++c) run_chunk(fn, c, n * c / chunks, n * (c + 1) / chunks);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t c = 0; c < chunks; ++c) run_chunk(fn, c, n * c / chunks, n * (c + 1) / chunks);
}

// Splits elementwise work into about one piece per thread when it is big enough to be worth it.
template <typename Fn>
void for_range(size_t n, int threads, Fn fn) {
  size_t pieces = n < 32768 ? 1 : size_t(threads);
  for_chunks(n, pieces, threads, [&](size_t, size_t b, size_t e) { fn(b, e); });
}

}  // namespace piper::cpu
