// A one-rank group on CUDA (see local_communicator.hpp): the sum over one rank is its own data, so the
// collectives are device copies queued on the caller's stream, complete for the host once queued.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/local_communicator.hpp"

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_common.hpp"
#include "backend/ragged_rows.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"

namespace piper {

namespace {

class QueuedHandle final : public CommHandle {
 public:
  bool test() override { return true; }
};

cudaStream_t caller_stream(StreamContext* s) {
  if (auto* cs = dynamic_cast<CudaStream*>(s)) return cs->stream();
  CudaStream* bound = bound_cuda_stream();
  return bound ? bound->stream() : nullptr;
}

void copy(void* dst, const void* src, size_t bytes, StreamContext* s) {
  if (dst == src || bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, caller_stream(s)));
}

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(MPI_Comm comm) : comm_(comm) {}
  ~LocalCommunicator() override { MPI_Comm_free(&comm_); }
  int size() const override { return 1; }
  int rank() const override { return 0; }

  std::unique_ptr<CommHandle> all_reduce(float*, size_t, StreamContext*) override {
    return std::make_unique<QueuedHandle>();
  }
  // src(count) → dst(count)
  std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext* s) override {
    copy(dst, src, count * sizeof(float), s);
    return std::make_unique<QueuedHandle>();
  }
  std::unique_ptr<CommHandle> all_reduce_bf16(uint16_t*, size_t, StreamContext*) override {
    return std::make_unique<QueuedHandle>();
  }
  std::unique_ptr<CommHandle> reduce_scatter_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                  StreamContext* s) override {
    copy(dst, src, count * sizeof(uint16_t), s);
    return std::make_unique<QueuedHandle>();
  }
  // src(count) → dst(count); in place when src is null
  std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext* s) override {
    if (src) copy(dst, src, count * sizeof(float), s);
    return std::make_unique<QueuedHandle>();
  }
  std::unique_ptr<CommHandle> all_gather_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                              StreamContext* s) override {
    if (src) copy(dst, src, count * sizeof(uint16_t), s);
    return std::make_unique<QueuedHandle>();
  }
  // Every part stays here: dst = src, counts then rows (how many rows the counts say).
  std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width, StreamContext* s,
                                              int32_t* received) override {
    std::vector<int32_t> counts(size_t(parts > 0 ? parts : 0));
    cudaStream_t st = caller_stream(s);
    if (parts > 0) {
      CUDA_CHECK(cudaMemcpyAsync(counts.data(), src, sizeof(int32_t) * counts.size(), cudaMemcpyDeviceToHost, st));
      CUDA_CHECK(cudaStreamSynchronize(st));
    }
    size_t rows = 0;
    for (int32_t c : counts) {
      PIPER_CHECK(c >= 0, "all_to_all_rows: a negative row count (", c, ")");
      rows += size_t(c);
    }
    if (received) std::copy(counts.begin(), counts.end(), received);
    copy(dst, src, RaggedRows::bytes(parts, int64_t(rows), width), s);
    return std::make_unique<QueuedHandle>();
  }
  std::unique_ptr<CommHandle> send(const float*, size_t, int peer, int, StreamContext*) override {
    throw SystemError(cat("a one-rank communicator has no peer to send to (world rank ", peer, ")"));
  }
  std::unique_ptr<CommHandle> recv(float*, size_t, int peer, int, StreamContext*) override {
    throw SystemError(cat("a one-rank communicator has no peer to receive from (world rank ", peer, ")"));
  }

 private:
  MPI_Comm comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(MPI_Comm comm) {
  return std::make_unique<LocalCommunicator>(comm);
}

}  // namespace piper
#endif  // PIPER_HAVE_CUDA
