// CUDA streams ordered by events, on the device: a second stream that waits for an event recorded after a
// first stream's long work reads its result with no host wait between them. Skips without a GPU.
#ifdef PIPER_HAVE_CUDA
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "backend/backend.hpp"

using namespace piper;

TEST_CASE("cuda: an event orders a second stream after the first, without the host waiting", "[cuda]") {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    WARN("no CUDA device on this machine: CUDA test skipped");
    return;
  }
  auto be = make_backend("cuda", 1, 0);
  Kernels& k = be->kernels();
  be->prepare_events(2);
  auto first = be->make_stream("first"), second = be->make_stream("second");
  const size_t n = size_t(1) << 24;  // 64 MiB per buffer: the first stream's work takes a while
  auto* x = static_cast<float*>(be->allocate(n * sizeof(float)));
  auto* ones = static_cast<float*>(be->allocate(n * sizeof(float)));
  auto* y = static_cast<float*>(be->allocate(n * sizeof(float)));
  const int rounds = 40;

  be->bind(first.get());
  k.fill(ones, 1.f, n);
  k.fill(x, 0.f, n);
  for (int r = 0; r < rounds; ++r) k.accumulate(x, ones, n);  // x(n) = rounds, long after the host returns
  be->record(first.get(), 0);

  be->bind(second.get());
  be->zero(y, n * sizeof(float));
  be->wait(second.get(), 0);
  k.copy(y, x, n * sizeof(float));  // y(n) = x(n), only after the first stream's work
  be->record(second.get(), 1);
  be->synchronize(second.get());

  std::vector<float> got(n);
  k.download(got.data(), y, n * sizeof(float));
  size_t wrong = 0;
  for (float v : got) wrong += v != float(rounds);
  CHECK(wrong == 0);

  be->bind(nullptr);
  be->synchronize(first.get());
  be->release(x, n * sizeof(float));
  be->release(ones, n * sizeof(float));
  be->release(y, n * sizeof(float));
}

#endif  // PIPER_HAVE_CUDA
