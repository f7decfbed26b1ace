// Shared pieces of the CUDA backend: checked-call macros that throw SystemError with file:line, and the
// CudaStream (a cudaStream_t with its own cuBLAS handle and scratch workspace) that kernels run on.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "backend/backend.hpp"
#include "util/error.hpp"

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess)                                                                              \
      throw ::piper::SystemError(::piper::cat(__FILE__, ":", __LINE__, ": ", #call, ": ",                 \
                                              cudaGetErrorName(err_), ": ", cudaGetErrorString(err_)));  \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                \
  do {                                                                                                    \
    cublasStatus_t st_ = (call);                                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                     \
      throw ::piper::SystemError(::piper::cat(__FILE__, ":", __LINE__, ": ", #call, ": ",                 \
                                              cublasGetStatusString(st_)));                               \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launching line.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace piper {

// One in-order queue of device work. Kernels, cuBLAS calls and copies of the thread bound to it go here.
class CudaStream final : public StreamContext {
 public:
  CudaStream(int device, const std::string& name);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  // Stream-ordered scratch of at least `bytes`, valid until the next call on this stream.
  void* workspace(size_t bytes);

 private:
  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// The stream bound to the calling thread by CudaBackend::bind, or nullptr.
CudaStream* bound_cuda_stream();
void bind_cuda_stream(CudaStream* s);

}  // namespace piper
