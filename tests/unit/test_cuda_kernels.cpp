// CUDA backend against the CPU backend: every case of the kernel table (kernel_cases.cpp) must match the CPU
// kernels, plus streams and a one-rank communicator. Without a GPU each test passes with a "skipped" warning.
#ifdef PIPER_HAVE_CUDA
#include <cuda_runtime.h>
#include <mpi.h>

#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "kernel_harness.hpp"

using namespace piper;
using piper::test::KernelCase;

namespace {

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  return count > 0;
}

#define SKIP_WITHOUT_GPU()                                         \
  if (!have_gpu()) {                                               \
    WARN("no CUDA device on this machine: CUDA test skipped");    \
    return;                                                        \
  }

// Device memory of the backend, freed on scope exit.
class DeviceArray {
 public:
  DeviceArray(Backend& be, size_t bytes) : be_(&be), bytes_(bytes ? bytes : 4), p_(be.allocate(bytes_)) {}
  ~DeviceArray() {
    if (p_) be_->release(p_, bytes_);
  }
  DeviceArray(DeviceArray&& o) noexcept : be_(o.be_), bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* p() const { return p_; }
  float* f() const { return static_cast<float*>(p_); }
  int32_t* i() const { return static_cast<int32_t*>(p_); }
  double* d() const { return static_cast<double*>(p_); }

 private:
  Backend* be_;
  size_t bytes_;
  void* p_;
};

template <typename T>
DeviceArray to_device(Backend& be, const std::vector<T>& host) {
  DeviceArray d(be, host.size() * sizeof(T));
  if (!host.empty()) be.kernels().upload(d.p(), host.data(), host.size() * sizeof(T));
  return d;
}

template <typename T>
std::vector<T> to_host(Backend& be, const DeviceArray& d, size_t n) {
  std::vector<T> host(n);
  if (n) be.kernels().download(host.data(), d.p(), n * sizeof(T));
  return host;
}

}  // namespace

TEST_CASE("cuda: every kernel case matches the CPU, and repeats its bits where it promises to", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto gpu = make_backend("cuda", 1, 0), cpu = make_backend("cpu", 2, 0);
  for (const KernelCase& c : test::kernel_cases()) {
    std::mt19937 gen(test::case_seed(c));
    const test::Tensors start = c.make(gen);
    test::Tensors want = test::run_case(*cpu, c, start), got = test::run_case(*gpu, c, start);
    for (const test::Out& o : c.outs)
      test::check_close(got.at(o.tensor), want.at(o.tensor), o.rtol_cuda,
                        c.name + (c.outs.size() > 1 ? " " + o.tensor : std::string()), o.min_scale, "cuda-vs-cpu");
    test::check_twins_and_property(*gpu, c, start, got, "cuda", c.cuda_repeatable);
    if (!c.cuda_repeatable) continue;
    test::Tensors again = test::run_case(*gpu, c, start);
    for (const test::Out& o : c.outs) {
      INFO(c.name << " " << o.tensor << ": a second call gives other bits");
      CHECK(again.at(o.tensor).f == got.at(o.tensor).f);
      CHECK(again.at(o.tensor).d == got.at(o.tensor).d);
    }
  }
}

TEST_CASE("cuda: memory round trips are exact, zero clears, attention scratch is a float a query row", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  std::mt19937 gen(6);
  const size_t n = 100003;
  auto a = test::uniform(gen, n);
  auto ga = to_device(*be, a);
  CHECK(to_host<float>(*be, ga, n) == a);
  be->zero(ga.f(), sizeof(float) * n);
  CHECK(to_host<float>(*be, ga, n) == std::vector<float>(n, 0.f));
  // the attention backward's scratch holds dy · y of each query row (B,H,T), no (T,T) scores
  CHECK(be->kernels().gqa_attention_scratch_floats(4, 64, 2, 2, 32) == size_t(4) * 2 * 64);
}

TEST_CASE("cuda: streams and a one-rank communicator (device copies, no NCCL)", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  auto stream = be->make_stream("compute");
  be->bind(stream.get());
  const size_t n = 1000;
  auto host = std::vector<float>(n, 0.f);
  for (size_t i = 0; i < n; ++i) host[i] = float(i);
  auto buf = to_device(*be, host);
  g.accumulate(buf.f(), buf.f(), n);  // 2i, on the bound stream
  be->synchronize(stream.get());
  std::vector<float> doubled(n);
  for (size_t i = 0; i < n; ++i) doubled[i] = 2.f * float(i);
  CHECK(to_host<float>(*be, buf, n) == doubled);

  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {  // started on first use (see tests/unit/main.cpp), finished by main
    int provided = 0;
    REQUIRE(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS);
  }
  MPI_Comm self;
  REQUIRE(MPI_Comm_dup(MPI_COMM_SELF, &self) == MPI_SUCCESS);
  {
    auto comm = be->make_communicator(self, MPI_COMM_SELF);
    REQUIRE(comm->size() == 1);
    REQUIRE(comm->rank() == 0);
    auto wait = [](std::unique_ptr<CommHandle> h) {
      while (!h->test()) {
      }
    };
    wait(comm->all_reduce(buf.f(), n, stream.get()));  // one rank: unchanged
    CHECK(to_host<float>(*be, buf, n) == doubled);
    DeviceArray out(*be, sizeof(float) * n);
    wait(comm->all_gather(buf.f(), out.f(), n, stream.get()));
    CHECK(to_host<float>(*be, out, n) == doubled);
    wait(comm->all_gather(nullptr, out.f(), n, stream.get()));  // in place
    CHECK(to_host<float>(*be, out, n) == doubled);
    be->zero(out.f(), sizeof(float) * n);
    wait(comm->reduce_scatter(buf.f(), out.f(), n, stream.get()));
    CHECK(to_host<float>(*be, out, n) == doubled);
  }
  be->bind(nullptr);
}

#endif  // PIPER_HAVE_CUDA
