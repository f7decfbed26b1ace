// The CUDA backend: device memory from cudaMalloc, one non-blocking cudaStream_t (with its own cuBLAS handle)
// per executor stream, events (created once) for the order between streams, CudaKernels, and NCCL
// communicators. The GPU is local_rank modulo the devices visible.
#ifdef PIPER_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/host_staged_communicator.hpp"
#include "backend/cuda/local_communicator.hpp"
#include "backend/cuda/nccl_communicator.hpp"
#include "util/mpi_check.hpp"

namespace piper {

namespace {

thread_local CudaStream* t_bound_stream = nullptr;

}  // namespace

CudaStream* bound_cuda_stream() { return t_bound_stream; }
void bind_cuda_stream(CudaStream* s) { t_bound_stream = s; }

CudaStream::CudaStream(int device, const std::string& name) : device_(device), name_(name) {
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&blas_));
  CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  // fp32 everywhere: no TF32 tensor-core rounding, so results match the CPU backend within fp32 tolerance
  CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
}

CudaStream::~CudaStream() {
  // Destructors must not throw: errors here would only repeat an earlier, reported failure.
  if (t_bound_stream == this) t_bound_stream = nullptr;
  if (workspace_) (void)cudaFreeAsync(workspace_, stream_);
  (void)cudaStreamSynchronize(stream_);
  (void)cublasDestroy(blas_);
  (void)cudaStreamDestroy(stream_);
}

void* CudaStream::workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  constexpr size_t kMiB = size_t(1) << 20;
  size_t grown = std::max(bytes, workspace_bytes_ + workspace_bytes_ / 2);
  grown = (grown + kMiB - 1) / kMiB * kMiB;
  // Stream-ordered: earlier kernels of this stream finish with the old buffer before it is reused.
  if (workspace_) CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  CUDA_CHECK(cudaMallocAsync(&workspace_, grown, stream_));
  workspace_bytes_ = grown;
  return workspace_;
}

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int local_rank) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count < 1)
      throw SystemError(cat("job.backend = \"cuda\" but no CUDA device is usable on this node (cudaGetDeviceCount: ",
                            cudaGetErrorString(err), ", ", count, " devices)"));
    device_ = local_rank % count;
    CUDA_CHECK(cudaSetDevice(device_));
    fallback_ = std::make_unique<CudaStream>(device_, "host");
    kernels_ = std::make_unique<CudaKernels>(fallback_.get());
  }

  std::string name() const override { return "cuda"; }
  Kernels& kernels() override { return *kernels_; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 256);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      throw SystemError(cat("out of GPU memory: cudaMalloc of ", bytes, " bytes on device ", device_, " failed (",
                            cudaGetErrorString(err), "; ", free_bytes >> 20, " of ", total_bytes >> 20,
                            " MiB free)"));
    }
    return p;
  }

  // Called from destructors: a failure here cannot be reported usefully, so it is not thrown.
  void release(void* p, size_t) override {
    if (p) (void)cudaFree(p);
  }

  void zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    if (CudaStream* bound = bound_cuda_stream()) {  // ordered on the caller's stream, no host wait
      CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, bound->stream()));
      return;
    }
    CudaKernels::Target t = kernels_->target();
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, t.stream.stream()));
    CUDA_CHECK(cudaStreamSynchronize(t.stream.stream()));
  }

  std::unique_ptr<StreamContext> make_stream(const std::string& name) override {
    return std::make_unique<CudaStream>(device_, name);
  }

  void bind(StreamContext* s) override {
    CudaStream* cs = nullptr;
    if (s) {
      cs = dynamic_cast<CudaStream*>(s);
      PIPER_CHECK(cs, "bind: the stream was not made by the CUDA backend");
    }
    bind_cuda_stream(cs);
    CUDA_CHECK(cudaSetDevice(device_));  // the device is per host thread
  }

  // The order between streams stays on the device: an event recorded after an instruction's work, and
  // streams that depend on it wait for the event, not the host.
  void record(StreamContext* s, int event) override {
    CUDA_CHECK(cudaEventRecord(event_at(event), stream_of(s, "record")));
  }
  void wait(StreamContext* s, int event) override {
    CUDA_CHECK(cudaStreamWaitEvent(stream_of(s, "wait"), event_at(event), 0));
  }
  void prepare_events(int count) override {
    destroy_events();
    CUDA_CHECK(cudaSetDevice(device_));
    events_.assign(size_t(std::max(count, 0)), nullptr);
    for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }

  ~CudaBackend() override { destroy_events(); }

  void synchronize(StreamContext* s) override {
    if (s) {
      auto* cs = dynamic_cast<CudaStream*>(s);
      PIPER_CHECK(cs, "synchronize: the stream was not made by the CUDA backend");
      CUDA_CHECK(cudaStreamSynchronize(cs->stream()));
      return;
    }
    CudaKernels::Target t = kernels_->target();
    CUDA_CHECK(cudaStreamSynchronize(t.stream.stream()));
  }

  std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, MPI_Comm world) override {
    return communicator(comm, world, true);
  }
  std::unique_ptr<Communicator> make_point_to_point(MPI_Comm comm, MPI_Comm world) override {
    return communicator(comm, world, false);
  }

 private:
  std::unique_ptr<Communicator> communicator(MPI_Comm comm, MPI_Comm world, bool collectives) {
    int size = 1;
    MPI_CHECK(MPI_Comm_size(comm, &size));
    if (size == 1) return make_local_communicator(comm);  // nothing to exchange: no NCCL set-up
    // NCCL needs a GPU per rank; ranks sharing one (tests, small jobs) exchange through host memory
    if (members_share_a_gpu(comm, device_)) {
      if (!warned_shared_) {
        int rank = 0;
        MPI_Comm_rank(world, &rank);
        if (rank == 0)
          std::fprintf(stderr, "piper: ranks share a GPU; their communication goes through host memory (MPI), "
                               "not NCCL\n");
        warned_shared_ = true;
      }
      return make_host_staged_communicator(comm, world);
    }
    return make_nccl_communicator(comm, world, device_, collectives);
  }

  cudaStream_t stream_of(StreamContext* s, const char* what) {
    if (s) {
      auto* cs = dynamic_cast<CudaStream*>(s);
      PIPER_CHECK(cs, what, ": the stream was not made by the CUDA backend");
      return cs->stream();
    }
    if (CudaStream* bound = bound_cuda_stream()) return bound->stream();
    return fallback_->stream();
  }

  cudaEvent_t event_at(int event) const {
    PIPER_CHECK(event >= 0 && size_t(event) < events_.size(), "event ", event, " of ", events_.size());
    return events_[size_t(event)];
  }

  void destroy_events() noexcept {
    for (cudaEvent_t e : events_)
      if (e) (void)cudaEventDestroy(e);
    events_.clear();
  }

  int device_ = 0;
  bool warned_shared_ = false;
  std::vector<cudaEvent_t> events_;  // one per instruction, recorded once per step
  std::unique_ptr<CudaStream> fallback_;  // for threads without a bound stream
  std::unique_ptr<CudaKernels> kernels_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int local_rank) { return std::make_unique<CudaBackend>(local_rank); }

namespace {
// Linked into a program, or loaded as libpiper_cuda.so: either way the backend registers itself.
[[maybe_unused]] const bool registered = (register_cuda_backend(&make_cuda_backend), true);
}  // namespace

}  // namespace piper

#endif  // PIPER_HAVE_CUDA
