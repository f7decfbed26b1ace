// CUDA backend against the CPU backend: every CudaKernels primitive on random inputs must match CpuKernels,
// plus streams and a one-rank communicator. Without a GPU each test passes with a "skipped" warning.
#ifdef PIPER_HAVE_CUDA
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_kernels.hpp"

using namespace piper;

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

std::vector<float> uniform(std::mt19937& gen, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> tokens(std::mt19937& gen, size_t n, int hi) {
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Largest error relative to max(|want|, 1% of max |want|, min_scale): tiny elements are judged against the
// scale. min_scale is for results that are zero by cancellation, whose rounding is that of the terms summed.
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, const std::string& what,
                 double min_scale = 0) {
  REQUIRE(got.size() == want.size());
  double peak = 0;
  for (float w : want) peak = std::max(peak, std::fabs(double(w)));
  const double floor = std::max({peak * 1e-2, min_scale, 1e-30});
  double worst = 0;
  size_t at = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      finite = false;
      at = i;
      break;
    }
    double err = std::fabs(double(got[i]) - double(want[i])) / std::max(std::fabs(double(want[i])), floor);
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  std::ostringstream msg;
  msg << what << ": worst relative error " << worst << " at " << at;
  if (!got.empty()) msg << " (cuda " << got[at] << ", cpu " << want[at] << ")";
  INFO(msg.str());
  CHECK(finite);
  CHECK(worst <= rtol);
  // one line per comparison, for the GPU check's summary
  std::printf("cuda-vs-cpu | %s | worst relative error %.3g | tolerance %.3g%s\n", what.c_str(), worst, rtol,
              finite ? "" : " | NOT FINITE");
}

void check_close(double got, double want, double rtol, const std::string& what) {
  INFO(what << ": cuda " << got << ", cpu " << want);
  std::printf("cuda-vs-cpu | %s | relative error %.3g | tolerance %.3g\n", what.c_str(),
              std::fabs(got - want) / std::max(1.0, std::fabs(want)), rtol);
  CHECK(std::fabs(got - want) <= rtol * std::max(1.0, std::fabs(want)));
}

}  // namespace

TEST_CASE("cuda: linear layers match the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(1);
  for (int N : {37, 1000}) {
    const int C = 48, OC = 70;
    auto x = uniform(gen, size_t(N) * C), w = uniform(gen, size_t(OC) * C), b = uniform(gen, OC);
    auto dy = uniform(gen, size_t(N) * OC), prior_dx = uniform(gen, size_t(N) * C);
    auto prior_dw = uniform(gen, size_t(OC) * C), prior_db = uniform(gen, OC);
    auto dx_ = to_device(*be, x), dw_ = to_device(*be, w), db_ = to_device(*be, b), ddy = to_device(*be, dy);
    std::string shape = "N=" + std::to_string(N);

    for (bool with_bias : {true, false}) {  // y(N,OC) = x · w^T (+ b)
      DeviceArray y(*be, sizeof(float) * N * OC);
      std::vector<float> want(size_t(N) * OC);
      g.linear_forward(y.f(), dx_.f(), dw_.f(), with_bias ? db_.f() : nullptr, N, C, OC);
      c.linear_forward(want.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
      check_close(to_host<float>(*be, y, want.size()), want, 1e-4, "linear_forward " + shape);
    }
    {  // y = gelu(x · w^T + b), dgelu = gelu'(x · w^T + b)
      DeviceArray dgelu(*be, sizeof(float) * N * OC), y(*be, sizeof(float) * N * OC);
      std::vector<float> want_dgelu(size_t(N) * OC), want_y(size_t(N) * OC);
      g.linear_gelu_forward(dgelu.f(), y.f(), dx_.f(), dw_.f(), db_.f(), N, C, OC);
      c.linear_gelu_forward(want_dgelu.data(), want_y.data(), x.data(), w.data(), b.data(), N, C, OC);
      check_close(to_host<float>(*be, dgelu, want_dgelu.size()), want_dgelu, 1e-4, "linear_gelu_forward dgelu " + shape);
      check_close(to_host<float>(*be, y, want_y.size()), want_y, 1e-4, "linear_gelu_forward y " + shape);
    }
    for (bool acc : {false, true}) {  // dx(N,C) (+)= dy · w
      auto gdx = to_device(*be, prior_dx);
      std::vector<float> want = prior_dx;
      g.linear_backward_input(gdx.f(), ddy.f(), dw_.f(), N, C, OC, acc);
      c.linear_backward_input(want.data(), dy.data(), w.data(), N, C, OC, acc);
      check_close(to_host<float>(*be, gdx, want.size()), want, 1e-4, "linear_backward_input " + shape);
    }
    for (bool acc : {false, true}) {  // dw(OC,C) (+)= dy^T · x; db(OC) (+)= Σ dy
      for (bool with_db : {true, false}) {
        auto gdw = to_device(*be, prior_dw), gdb = to_device(*be, prior_db);
        std::vector<float> want_dw = prior_dw, want_db = prior_db;
        g.linear_backward_weight(gdw.f(), with_db ? gdb.f() : nullptr, ddy.f(), dx_.f(), N, C, OC, acc);
        c.linear_backward_weight(want_dw.data(), with_db ? want_db.data() : nullptr, dy.data(), x.data(), N, C, OC,
                                 acc);
        check_close(to_host<float>(*be, gdw, want_dw.size()), want_dw, 1e-4, "linear_backward_weight dw " + shape);
        check_close(to_host<float>(*be, gdb, want_db.size()), want_db, 1e-4, "linear_backward_weight db " + shape);
      }
    }
    {  // dpre = dy * dgelu, in place on dy
      auto pre = uniform(gen, size_t(N) * OC, 0.f, 1.1f);  // a saved derivative lies in about [-0.13, 1.13]
      auto gpre = to_device(*be, pre), gdy = to_device(*be, dy);
      std::vector<float> want = dy;
      g.gelu_backward(gdy.f(), gdy.f(), gpre.f(), pre.size());
      c.gelu_backward(want.data(), want.data(), pre.data(), pre.size());
      check_close(to_host<float>(*be, gdy, want.size()), want, 1e-4, "gelu_backward " + shape);
    }
  }
}

TEST_CASE("cuda: grouped linear matmuls match the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(14);
  // experts of different row counts (one empty, one of a single row) over two widths, as the experts of a
  // mixture of experts: gate/up (C → DE) and down (DE → C)
  const int C = 96, DE = 40;
  const std::vector<int> counts = {37, 0, 1, 250, 64, 5};
  const int groups = int(counts.size());
  int rows = 0;
  for (int n : counts) rows += n;
  auto x = uniform(gen, size_t(rows) * C), dy = uniform(gen, size_t(rows) * DE);
  std::vector<std::vector<float>> w;
  for (int e = 0; e < groups; ++e) w.push_back(uniform(gen, size_t(DE) * C));  // (DE,C) per expert
  auto gx = to_device(*be, x), gdy = to_device(*be, dy);
  std::vector<DeviceArray> gw;
  for (auto& m : w) gw.push_back(to_device(*be, m));

  {  // y(n,DE) = x(n,C) · w^T per expert
    std::vector<float> want(size_t(rows) * DE, 0.f);
    DeviceArray y(*be, sizeof(float) * want.size());
    std::vector<LinearGroup> on_gpu, on_cpu;
    for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e) {
      on_gpu.push_back({y.f() + size_t(at) * DE, gx.f() + size_t(at) * C, gw[size_t(e)].f(), counts[size_t(e)], C, DE});
      on_cpu.push_back({want.data() + size_t(at) * DE, x.data() + size_t(at) * C, w[size_t(e)].data(),
                        counts[size_t(e)], C, DE});
    }
    g.linear_forward_grouped(on_gpu.data(), groups);
    c.linear_forward_grouped(on_cpu.data(), groups);
    check_close(to_host<float>(*be, y, want.size()), want, 1e-4, "linear_forward_grouped");
  }
  {  // dx(n,C) = dy(n,DE) · w, then the same again added: two products into each output, in list order
    auto prior = uniform(gen, size_t(rows) * C);
    std::vector<float> want = prior;
    auto dx = to_device(*be, prior);
    std::vector<LinearGroup> on_gpu, on_cpu;
    for (bool add : {false, true})
      for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e) {
        const int other = (e + 1) % groups;  // the added product uses another expert's weight
        const int we = add ? other : e;
        on_gpu.push_back({dx.f() + size_t(at) * C, gdy.f() + size_t(at) * DE, gw[size_t(we)].f(), counts[size_t(e)],
                          C, DE, add});
        on_cpu.push_back({want.data() + size_t(at) * C, dy.data() + size_t(at) * DE, w[size_t(we)].data(),
                          counts[size_t(e)], C, DE, add});
      }
    g.linear_backward_input_grouped(on_gpu.data(), int(on_gpu.size()));
    c.linear_backward_input_grouped(on_cpu.data(), int(on_cpu.size()));
    check_close(to_host<float>(*be, dx, want.size()), want, 1e-4, "linear_backward_input_grouped");
  }
  for (bool acc : {false, true}) {  // dw(DE,C) (+)= dy^T · x per expert; expert 3 also gets expert 0's rows
    std::vector<std::vector<float>> want;
    std::vector<DeviceArray> dw;
    for (int e = 0; e < groups; ++e) {
      want.push_back(uniform(gen, size_t(DE) * C));
      dw.push_back(to_device(*be, want.back()));
    }
    std::vector<LinearGroup> on_gpu, on_cpu;
    for (int e = 0, at = 0; e < groups; at += counts[size_t(e)], ++e) {
      on_gpu.push_back({dw[size_t(e)].f(), gdy.f() + size_t(at) * DE, gx.f() + size_t(at) * C, counts[size_t(e)], C,
                        DE, acc});
      on_cpu.push_back({want[size_t(e)].data(), dy.data() + size_t(at) * DE, x.data() + size_t(at) * C,
                        counts[size_t(e)], C, DE, acc});
    }
    on_gpu.push_back({dw[3].f(), gdy.f(), gx.f(), counts[0], C, DE, true});
    on_cpu.push_back({want[3].data(), dy.data(), x.data(), counts[0], C, DE, true});
    g.linear_backward_weight_grouped(on_gpu.data(), int(on_gpu.size()));
    c.linear_backward_weight_grouped(on_cpu.data(), int(on_cpu.size()));
    for (int e = 0; e < groups; ++e)
      check_close(to_host<float>(*be, dw[size_t(e)], want[size_t(e)].size()), want[size_t(e)], 1e-4,
                  std::string("linear_backward_weight_grouped ") + (acc ? "accumulate " : "") + "expert " +
                      std::to_string(e) + " n=" + std::to_string(counts[size_t(e)]));
  }
}

TEST_CASE("cuda: layernorm matches the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(2);
  for (auto [N, C] : {std::pair{70, 96}, std::pair{300, 1000}}) {
    std::string shape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
    auto x = uniform(gen, size_t(N) * C, -2.f, 3.f), w = uniform(gen, C), b = uniform(gen, C);
    auto dy = uniform(gen, size_t(N) * C), prior = uniform(gen, size_t(N) * C);
    auto prior_w = uniform(gen, C), prior_b = uniform(gen, C);
    auto gx = to_device(*be, x), gw = to_device(*be, w), gb = to_device(*be, b), gdy = to_device(*be, dy);
    DeviceArray y(*be, sizeof(float) * N * C), mean(*be, sizeof(float) * N), rstd(*be, sizeof(float) * N);
    std::vector<float> want_y(size_t(N) * C), want_mean(N), want_rstd(N);
    g.layernorm_forward(y.f(), mean.f(), rstd.f(), gx.f(), gw.f(), gb.f(), N, C);
    c.layernorm_forward(want_y.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(), b.data(), N, C);
    check_close(to_host<float>(*be, y, want_y.size()), want_y, 1e-4, "layernorm_forward y " + shape);
    check_close(to_host<float>(*be, mean, N), want_mean, 1e-4, "layernorm_forward mean " + shape);
    check_close(to_host<float>(*be, rstd, N), want_rstd, 1e-4, "layernorm_forward rstd " + shape);
    // backward from the CPU statistics, so both sides differentiate the same point
    auto gmean = to_device(*be, want_mean), grstd = to_device(*be, want_rstd);
    for (bool acc : {false, true}) {
      auto gdx = to_device(*be, prior);
      std::vector<float> want = prior;
      g.layernorm_backward_input(gdx.f(), gdy.f(), gx.f(), gmean.f(), grstd.f(), gw.f(), N, C, acc);
      c.layernorm_backward_input(want.data(), dy.data(), x.data(), want_mean.data(), want_rstd.data(), w.data(), N, C,
                                 acc);
      check_close(to_host<float>(*be, gdx, want.size()), want, 1e-4, "layernorm_backward_input " + shape);

      auto gdw = to_device(*be, prior_w), gdb = to_device(*be, prior_b);
      std::vector<float> want_dw = prior_w, want_db = prior_b;
      g.layernorm_backward_weight(gdw.f(), gdb.f(), gdy.f(), gx.f(), gmean.f(), grstd.f(), N, C, acc);
      c.layernorm_backward_weight(want_dw.data(), want_db.data(), dy.data(), x.data(), want_mean.data(),
                                  want_rstd.data(), N, C, acc);
      check_close(to_host<float>(*be, gdw, C), want_dw, 1e-4, "layernorm_backward_weight dw " + shape);
      check_close(to_host<float>(*be, gdb, C), want_db, 1e-4, "layernorm_backward_weight db " + shape);
    }
  }
}

TEST_CASE("cuda: causal attention matches the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(3);
  struct Shape { int B, T, C, NH; };
  for (Shape s : {Shape{2, 33, 48, 4}, Shape{4, 64, 64, 2}, Shape{3, 7, 24, 3}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    std::string shape = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                        " NH=" + std::to_string(NH);
    auto qkv = uniform(gen, size_t(B) * T * 3 * C, -2.f, 2.f), dy = uniform(gen, size_t(B) * T * C);
    auto gqkv = to_device(*be, qkv), gdy = to_device(*be, dy);
    DeviceArray y(*be, sizeof(float) * B * T * C), att(*be, sizeof(float) * B * NH * T * T);
    std::vector<float> want_y(size_t(B) * T * C), want_att(size_t(B) * NH * T * T);
    g.attention_forward(y.f(), att.f(), gqkv.f(), B, T, C, NH);
    c.attention_forward(want_y.data(), want_att.data(), qkv.data(), B, T, C, NH);
    check_close(to_host<float>(*be, y, want_y.size()), want_y, 1e-3, "attention_forward y " + shape);
    check_close(to_host<float>(*be, att, want_att.size()), want_att, 1e-3, "attention_forward att " + shape);

    // the scratch holds one sample's (NH,T,T), whatever B
    const size_t scratch_floats = be->kernels().attention_scratch_floats(B, T, C, NH);
    CHECK(scratch_floats == size_t(NH) * T * T);
    DeviceArray dqkv(*be, sizeof(float) * qkv.size());
    DeviceArray scratch(*be, sizeof(float) * scratch_floats);
    std::vector<float> want_dqkv(qkv.size()), cpu_scratch(c.attention_scratch_floats(B, T, C, NH));
    g.attention_backward(dqkv.f(), gdy.f(), gqkv.f(), att.f(), scratch.f(), B, T, C, NH);
    c.attention_backward(want_dqkv.data(), dy.data(), qkv.data(), want_att.data(), cpu_scratch.data(), B, T, C, NH);
    check_close(to_host<float>(*be, dqkv, want_dqkv.size()), want_dqkv, 1e-3, "attention_backward dqkv " + shape);
  }
}

TEST_CASE("cuda: embedding matches the CPU and is deterministic", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(4);
  const int B = 3, T = 20, C = 40, V = 300;
  auto tok = tokens(gen, size_t(B) * T, V);
  for (size_t i = 0; i < tok.size(); i += 3) tok[i] = 7;  // a frequent token: many rows scatter into one
  auto wte = uniform(gen, size_t(V) * C), wpe = uniform(gen, size_t(T) * C), dx = uniform(gen, size_t(B) * T * C);
  auto prior_wte = uniform(gen, wte.size()), prior_wpe = uniform(gen, wpe.size());
  auto gtok = to_device(*be, tok), gwte = to_device(*be, wte), gwpe = to_device(*be, wpe), gdx = to_device(*be, dx);
  DeviceArray x(*be, sizeof(float) * B * T * C);
  std::vector<float> want_x(size_t(B) * T * C);
  g.embedding_forward(x.f(), gtok.i(), gwte.f(), gwpe.f(), B, T, C);
  c.embedding_forward(want_x.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  check_close(to_host<float>(*be, x, want_x.size()), want_x, 1e-6, "embedding_forward");
  for (bool acc_wte : {false, true}) {
    for (bool acc_wpe : {false, true}) {
      auto dwte = to_device(*be, prior_wte), dwpe = to_device(*be, prior_wpe);
      std::vector<float> want_wte = prior_wte, want_wpe = prior_wpe;
      g.embedding_backward(dwte.f(), dwpe.f(), gdx.f(), gtok.i(), B, T, C, V, acc_wte, acc_wpe);
      c.embedding_backward(want_wte.data(), want_wpe.data(), dx.data(), tok.data(), B, T, C, V, acc_wte, acc_wpe);
      auto got_wte = to_host<float>(*be, dwte, want_wte.size());
      check_close(got_wte, want_wte, 1e-5, "embedding_backward dwte");
      check_close(to_host<float>(*be, dwpe, want_wpe.size()), want_wpe, 1e-5, "embedding_backward dwpe");
      // the same call again gives the same bits
      auto again = to_device(*be, prior_wte);
      g.embedding_backward(again.f(), dwpe.f(), gdx.f(), gtok.i(), B, T, C, V, acc_wte, acc_wpe);
      CHECK(to_host<float>(*be, again, want_wte.size()) == got_wte);
    }
  }
}

TEST_CASE("cuda: embedding backward over a large vocabulary matches the CPU and is deterministic", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(13);
  // vocabulary far larger than the tokens; a few hot tokens repeat hundreds of times, one over a thousand,
  // next to tokens seen once, the first and the last token id; C not a multiple of the column tile
  const int B = 4, T = 512, C = 200, V = 151936;
  const size_t N = size_t(B) * T;
  auto tok = tokens(gen, N, V);
  std::uniform_int_distribution<int> hot(0, 7);
  for (size_t i = 0; i < N; ++i) {
    if (i % 2 == 0) tok[i] = 11;
    else if (i % 5 == 1) tok[i] = 1000 + hot(gen);
  }
  tok[3] = 0;
  tok[N - 2] = V - 1;
  auto dx = uniform(gen, N * C), prior_wte = uniform(gen, size_t(V) * C), prior_wpe = uniform(gen, size_t(T) * C);
  auto gtok = to_device(*be, tok), gdx = to_device(*be, dx);
  for (bool acc_wte : {false, true}) {
    const std::string what = std::string("embedding_backward dwte V=151936 ") + (acc_wte ? "accumulate" : "write");
    auto dwte = to_device(*be, prior_wte), dwpe = to_device(*be, prior_wpe);
    std::vector<float> want_wte = prior_wte, want_wpe = prior_wpe;
    g.embedding_backward(dwte.f(), dwpe.f(), gdx.f(), gtok.i(), B, T, C, V, acc_wte, true);
    c.embedding_backward(want_wte.data(), want_wpe.data(), dx.data(), tok.data(), B, T, C, V, acc_wte, true);
    auto got_wte = to_host<float>(*be, dwte, want_wte.size());
    check_close(got_wte, want_wte, 1e-6, what);  // the same additions in the same order as the CPU
    check_close(to_host<float>(*be, dwpe, want_wpe.size()), want_wpe, 1e-5, "embedding_backward dwpe V=151936");
    auto again = to_device(*be, prior_wte);
    g.embedding_backward(again.f(), dwpe.f(), gdx.f(), gtok.i(), B, T, C, V, acc_wte, true);
    CHECK(to_host<float>(*be, again, want_wte.size()) == got_wte);
  }
}

TEST_CASE("cuda: softmax cross-entropy matches the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(5);
  for (auto [N, V] : {std::pair{50, 300}, std::pair{9, 5000}}) {
    std::string shape = "N=" + std::to_string(N) + " V=" + std::to_string(V);
    auto logits = uniform(gen, size_t(N) * V, -5.f, 5.f);
    auto targets = tokens(gen, N, V);
    const float scale = 0.37f;
    auto gbuf = to_device(*be, logits), gt = to_device(*be, targets);
    auto gloss = to_device(*be, std::vector<double>{0.5});
    std::vector<float> want = logits;
    double want_loss = 0.5;
    g.softmax_xent_forward(gbuf.f(), gloss.d(), gbuf.f(), gt.i(), N, V, scale);  // in place
    c.softmax_xent_forward(want.data(), &want_loss, want.data(), targets.data(), N, V, scale);
    check_close(to_host<float>(*be, gbuf, want.size()), want, 1e-4, "softmax_xent_forward probs " + shape);
    check_close(to_host<double>(*be, gloss, 1)[0], want_loss, 1e-5, "softmax_xent_forward loss " + shape);
    g.softmax_xent_backward(gbuf.f(), gbuf.f(), gt.i(), N, V, scale);  // in place
    c.softmax_xent_backward(want.data(), want.data(), targets.data(), N, V, scale);
    check_close(to_host<float>(*be, gbuf, want.size()), want, 1e-4, "softmax_xent_backward " + shape);
  }
}

TEST_CASE("cuda: elementwise, sum of squares and AdamW match the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(6);
  const size_t n = 100003;
  auto a = uniform(gen, n), b = uniform(gen, n);
  auto ga = to_device(*be, a), gb = to_device(*be, b);
  CHECK(to_host<float>(*be, ga, n) == a);  // upload/download round trip is exact
  {
    DeviceArray y(*be, sizeof(float) * n);
    std::vector<float> want(n);
    g.add(y.f(), ga.f(), gb.f(), n);
    c.add(want.data(), a.data(), b.data(), n);
    CHECK(to_host<float>(*be, y, n) == want);
    g.accumulate(y.f(), ga.f(), n);
    c.accumulate(want.data(), a.data(), n);
    CHECK(to_host<float>(*be, y, n) == want);
    g.fill(y.f(), 2.5f, n);
    CHECK(to_host<float>(*be, y, n) == std::vector<float>(n, 2.5f));
    g.copy(y.f(), gb.f(), sizeof(float) * n);
    g.copy(y.f(), y.f(), sizeof(float) * n);  // to itself: nothing happens
    CHECK(to_host<float>(*be, y, n) == b);
    be->zero(y.f(), sizeof(float) * n);
    CHECK(to_host<float>(*be, y, n) == std::vector<float>(n, 0.f));
  }
  {
    auto acc = to_device(*be, std::vector<double>{1.25});
    double want = 1.25;
    g.sum_squares(acc.d(), ga.f(), n);
    c.sum_squares(&want, a.data(), n);
    double got = to_host<double>(*be, acc, 1)[0];
    check_close(got, want, 1e-5, "sum_squares");
    auto again = to_device(*be, std::vector<double>{1.25});
    g.sum_squares(again.d(), ga.f(), n);
    CHECK(to_host<double>(*be, again, 1)[0] == got);  // deterministic
  }
  {
    auto m = uniform(gen, n, -0.1f, 0.1f), v = uniform(gen, n, 0.f, 0.01f);
    auto gp = to_device(*be, a), gm = to_device(*be, m), gv = to_device(*be, v);
    AdamWArgs args;
    args.lr = 3e-3f;
    args.weight_decay = 0.1f;
    args.grad_scale = 0.7f;
    args.step = 3;
    std::vector<float> want_p = a, want_m = m, want_v = v;
    g.adamw(gp.f(), gb.f(), gm.f(), gv.f(), n, args);
    c.adamw(want_p.data(), b.data(), want_m.data(), want_v.data(), n, args);
    check_close(to_host<float>(*be, gp, n), want_p, 1e-5, "adamw param");
    check_close(to_host<float>(*be, gm, n), want_m, 1e-5, "adamw m");
    check_close(to_host<float>(*be, gv, n), want_v, 1e-5, "adamw v");
  }
}

TEST_CASE("cuda: rmsnorm matches the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(7);
  const float eps = 1e-6f;
  for (auto [N, C] : {std::pair{70, 96}, std::pair{300, 1000}, std::pair{5, 2048}}) {
    std::string shape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
    auto x = uniform(gen, size_t(N) * C, -2.f, 3.f), w = uniform(gen, C, 0.5f, 1.5f);
    auto dy = uniform(gen, size_t(N) * C), prior = uniform(gen, size_t(N) * C), prior_w = uniform(gen, C);
    auto gx = to_device(*be, x), gw = to_device(*be, w), gdy = to_device(*be, dy);
    DeviceArray y(*be, sizeof(float) * N * C), rstd(*be, sizeof(float) * N);
    std::vector<float> want_y(size_t(N) * C), want_rstd(N);
    g.rmsnorm_forward(y.f(), rstd.f(), gx.f(), gw.f(), N, C, eps);
    c.rmsnorm_forward(want_y.data(), want_rstd.data(), x.data(), w.data(), N, C, eps);
    check_close(to_host<float>(*be, y, want_y.size()), want_y, 1e-5, "rmsnorm_forward y " + shape);
    check_close(to_host<float>(*be, rstd, N), want_rstd, 1e-5, "rmsnorm_forward rstd " + shape);
    auto grstd = to_device(*be, want_rstd);  // both sides differentiate at the CPU statistics
    for (bool acc : {false, true}) {
      auto gdx = to_device(*be, prior);
      std::vector<float> want = prior;
      g.rmsnorm_backward_input(gdx.f(), gdy.f(), gx.f(), grstd.f(), gw.f(), N, C, acc);
      c.rmsnorm_backward_input(want.data(), dy.data(), x.data(), want_rstd.data(), w.data(), N, C, acc);
      check_close(to_host<float>(*be, gdx, want.size()), want, 1e-4, "rmsnorm_backward_input " + shape);
      auto gdw = to_device(*be, prior_w);
      std::vector<float> want_dw = prior_w;
      g.rmsnorm_backward_weight(gdw.f(), gdy.f(), gx.f(), grstd.f(), N, C, acc);
      c.rmsnorm_backward_weight(want_dw.data(), dy.data(), x.data(), want_rstd.data(), N, C, acc);
      auto got_dw = to_host<float>(*be, gdw, C);
      check_close(got_dw, want_dw, 1e-4, "rmsnorm_backward_weight " + shape);
      auto again = to_device(*be, prior_w);  // the same bits again: no atomics
      g.rmsnorm_backward_weight(again.f(), gdy.f(), gx.f(), grstd.f(), N, C, acc);
      CHECK(to_host<float>(*be, again, C) == got_dw);
    }
  }
}

TEST_CASE("cuda: rope matches the CPU, forward and inverse", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(8);
  struct Shape { int B, T, H, D; float theta; };
  for (Shape s : {Shape{2, 70, 4, 64, 10000.f}, Shape{1, 4096, 2, 128, 1e6f}, Shape{3, 5, 1, 6, 500.f},
                  Shape{4, 1000, 3, 128, 1e6f}}) {
    std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                        " D=" + std::to_string(s.D);
    auto x = uniform(gen, size_t(s.B) * s.T * s.H * s.D);
    for (bool inverse : {false, true}) {
      auto gx = to_device(*be, x);
      std::vector<float> want = x;
      g.rope(gx.f(), s.B, s.T, s.H, s.D, s.theta, inverse);
      c.rope(want.data(), s.B, s.T, s.H, s.D, s.theta, inverse);
      check_close(to_host<float>(*be, gx, want.size()), want, 1e-5,
                  std::string(inverse ? "rope inverse " : "rope ") + shape);
    }
  }
}

TEST_CASE("cuda: swiglu matches the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(9);
  for (size_t n : {size_t(37), size_t(100003)}) {
    std::string shape = "n=" + std::to_string(n);
    auto gate = uniform(gen, n, -20.f, 20.f), up = uniform(gen, n), da = uniform(gen, n);
    auto ggate = to_device(*be, gate), gup = to_device(*be, up), gda = to_device(*be, da);
    DeviceArray a(*be, sizeof(float) * n), dg(*be, sizeof(float) * n), du(*be, sizeof(float) * n);
    std::vector<float> want_a(n), want_dg(n), want_du(n);
    g.swiglu_forward(a.f(), ggate.f(), gup.f(), n);
    c.swiglu_forward(want_a.data(), gate.data(), up.data(), n);
    check_close(to_host<float>(*be, a, n), want_a, 1e-5, "swiglu_forward " + shape);
    g.swiglu_backward(dg.f(), du.f(), gda.f(), ggate.f(), gup.f(), n);
    c.swiglu_backward(want_dg.data(), want_du.data(), da.data(), gate.data(), up.data(), n);
    check_close(to_host<float>(*be, dg, n), want_dg, 1e-5, "swiglu_backward dg " + shape);
    check_close(to_host<float>(*be, du, n), want_du, 1e-5, "swiglu_backward du " + shape);
  }
}

TEST_CASE("cuda: token embedding matches the CPU and is deterministic", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(10);
  for (auto [N, C, V] : {std::tuple{60, 40, 300}, std::tuple{1000, 96, 5000}, std::tuple{4096, 130, 100000}}) {
    std::string shape = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V);
    auto tok = tokens(gen, size_t(N), V);
    for (size_t i = 0; i < tok.size(); i += 3) tok[i] = 7;  // a frequent token: many rows scatter into one
    auto w = uniform(gen, size_t(V) * C), dx = uniform(gen, size_t(N) * C), prior = uniform(gen, size_t(V) * C);
    auto gtok = to_device(*be, tok), gw = to_device(*be, w), gdx = to_device(*be, dx);
    DeviceArray x(*be, sizeof(float) * N * C);
    std::vector<float> want_x(size_t(N) * C);
    g.token_embedding_forward(x.f(), gtok.i(), gw.f(), N, C);
    c.token_embedding_forward(want_x.data(), tok.data(), w.data(), N, C);
    CHECK(to_host<float>(*be, x, want_x.size()) == want_x);  // a gather is exact
    for (bool acc : {false, true}) {
      auto dw = to_device(*be, prior);
      std::vector<float> want = prior;
      g.token_embedding_backward(dw.f(), gdx.f(), gtok.i(), N, C, V, acc);
      c.token_embedding_backward(want.data(), dx.data(), tok.data(), N, C, V, acc);
      auto got = to_host<float>(*be, dw, want.size());
      check_close(got, want, 1e-5, std::string("token_embedding_backward ") + (acc ? "accumulate " : "") + shape);
      auto again = to_device(*be, prior);
      g.token_embedding_backward(again.f(), gdx.f(), gtok.i(), N, C, V, acc);
      CHECK(to_host<float>(*be, again, want.size()) == got);
    }
  }
}

TEST_CASE("cuda: grouped-query attention matches the CPU and is deterministic", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(11);
  struct Shape { int B, T, H, KV, D; };
  // grouped, single key/value head, multi-head with an odd head size, and D = 256 (over 48 KiB of shared memory)
  for (Shape s : {Shape{2, 70, 4, 2, 64}, Shape{1, 130, 2, 1, 128}, Shape{2, 33, 3, 3, 40}, Shape{1, 45, 2, 1, 256},
                  Shape{1, 1, 2, 2, 16}}) {
    std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                        " KV=" + std::to_string(s.KV) + " D=" + std::to_string(s.D);
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.KV * s.D;
    const size_t nl = size_t(s.B) * s.H * s.T;
    auto q = uniform(gen, nq, -2.f, 2.f), k = uniform(gen, nk, -2.f, 2.f), v = uniform(gen, nk);
    auto dy = uniform(gen, nq);
    auto gq = to_device(*be, q), gk = to_device(*be, k), gv = to_device(*be, v), gdy = to_device(*be, dy);
    DeviceArray y(*be, sizeof(float) * nq), lse(*be, sizeof(float) * nl);
    std::vector<float> want_y(nq), want_lse(nl);
    g.gqa_attention_forward(y.f(), lse.f(), gq.f(), gk.f(), gv.f(), s.B, s.T, s.H, s.KV, s.D);
    c.gqa_attention_forward(want_y.data(), want_lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D);
    check_close(to_host<float>(*be, y, nq), want_y, 1e-4, "gqa_attention_forward y " + shape);
    check_close(to_host<float>(*be, lse, nl), want_lse, 1e-5, "gqa_attention_forward lse " + shape);

    // backward from the CPU forward's y and lse, so both sides differentiate the same point
    auto cy = to_device(*be, want_y), clse = to_device(*be, want_lse);
    DeviceArray scratch(*be, sizeof(float) * be->kernels().gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
    auto dq = to_device(*be, std::vector<float>(nq, 1e3f)), dk = to_device(*be, std::vector<float>(nk, 1e3f)),
         dv = to_device(*be, std::vector<float>(nk, 1e3f));  // written, not accumulated
    std::vector<float> want_dq(nq), want_dk(nk), want_dv(nk);
    std::vector<float> cpu_scratch(c.gqa_attention_scratch_floats(s.B, s.T, s.H, s.KV, s.D));
    g.gqa_attention_backward(dq.f(), dk.f(), dv.f(), gdy.f(), gq.f(), gk.f(), gv.f(), cy.f(), clse.f(), scratch.f(),
                             s.B, s.T, s.H, s.KV, s.D);
    c.gqa_attention_backward(want_dq.data(), want_dk.data(), want_dv.data(), dy.data(), q.data(), k.data(), v.data(),
                             want_y.data(), want_lse.data(), cpu_scratch.data(), s.B, s.T, s.H, s.KV, s.D);
    auto got_dq = to_host<float>(*be, dq, nq), got_dk = to_host<float>(*be, dk, nk),
         got_dv = to_host<float>(*be, dv, nk);
    // dq = scale * sum_j P_ij (dy_i . v_j - dy_i . y_i) k_j, and dk alike with q: terms of up to sqrt(D) |dy| |v|
    // |k| that cancel exactly at T = 1 (P = 1, y = v), where dq and dk are zero and only their rounding is left
    auto peak = [](const std::vector<float>& x) {
      double m = 0;
      for (float e : x) m = std::max(m, std::fabs(double(e)));
      return m;
    };
    const double terms = std::sqrt(double(s.D)) * peak(dy) * peak(v);
    check_close(got_dq, want_dq, 1e-3, "gqa_attention_backward dq " + shape, 1e-4 * terms * peak(k));
    check_close(got_dk, want_dk, 1e-3, "gqa_attention_backward dk " + shape, 1e-4 * terms * peak(q));
    check_close(got_dv, want_dv, 1e-3, "gqa_attention_backward dv " + shape);
    // the same call again gives the same bits
    g.gqa_attention_backward(dq.f(), dk.f(), dv.f(), gdy.f(), gq.f(), gk.f(), gv.f(), cy.f(), clse.f(), scratch.f(),
                             s.B, s.T, s.H, s.KV, s.D);
    CHECK(to_host<float>(*be, dq, nq) == got_dq);
    CHECK(to_host<float>(*be, dk, nk) == got_dk);
    CHECK(to_host<float>(*be, dv, nk) == got_dv);
  }
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


TEST_CASE("cuda: mixture-of-experts row kernels match the CPU", "[cuda]") {
  SKIP_WITHOUT_GPU();
  auto be = make_backend("cuda", 1, 0);
  Kernels& g = be->kernels();
  CpuKernels c(2);
  std::mt19937 gen(12);
  struct Shape { int n, K, m, C; };
  // odd width, a power of two, one column, and a row wider than a block (C > 512)
  for (Shape sh : {Shape{60, 2, 90, 37}, Shape{3000, 4, 9000, 256}, Shape{40, 3, 50, 1}, Shape{100, 8, 500, 1000}}) {
    std::string shape = "n=" + std::to_string(sh.n) + " K=" + std::to_string(sh.K) + " m=" + std::to_string(sh.m) +
                        " C=" + std::to_string(sh.C);
    const size_t nk = size_t(sh.n) * sh.K, nc = size_t(sh.n) * sh.C, mc = size_t(sh.m) * sh.C;
    // rows(m) with repeats; pos(n,K) with repeats, a quarter dropped and the first token fully dropped
    auto rows = tokens(gen, size_t(sh.m), sh.n);
    auto pos = tokens(gen, nk, sh.m);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& p : pos)
      if (u(gen) < 0.25f) p = -1;
    for (int k = 0; k < sh.K; ++k) pos[size_t(k)] = -1;
    auto x = uniform(gen, nc), e = uniform(gen, mc), scale = uniform(gen, size_t(sh.m)), w = uniform(gen, nk);
    auto prior = uniform(gen, nc);
    auto grows = to_device(*be, rows), gpos = to_device(*be, pos), gx = to_device(*be, x), ge = to_device(*be, e),
         gscale = to_device(*be, scale), gw = to_device(*be, w);
    // gather (one product) and combine (one fma per term, k in order) do the CPU's operations, so they should
    // agree to the bit; rows_dot sums in double on both sides in different orders: within a float ulp.

    for (bool scaled : {true, false}) {
      const std::string what = std::string("gather_rows ") + (scaled ? "" : "unscaled ") + shape;
      DeviceArray out(*be, sizeof(float) * mc);
      std::vector<float> want(mc);
      g.gather_rows(out.f(), gx.f(), grows.i(), scaled ? gscale.f() : nullptr, sh.m, sh.C);
      c.gather_rows(want.data(), x.data(), rows.data(), scaled ? scale.data() : nullptr, sh.m, sh.C);
      auto got = to_host<float>(*be, out, mc);
      check_close(got, want, 1e-6, what);
      g.gather_rows(out.f(), gx.f(), grows.i(), scaled ? gscale.f() : nullptr, sh.m, sh.C);
      CHECK(to_host<float>(*be, out, mc) == got);
    }

    for (bool weighted : {true, false})
      for (bool acc : {false, true}) {
        const std::string what = std::string("combine_rows ") + (weighted ? "" : "unweighted ") +
                                 (acc ? "accumulate " : "") + shape;
        auto out = to_device(*be, prior);
        std::vector<float> want = prior;
        g.combine_rows(out.f(), ge.f(), gpos.i(), weighted ? gw.f() : nullptr, sh.n, sh.K, sh.C, acc);
        c.combine_rows(want.data(), e.data(), pos.data(), weighted ? w.data() : nullptr, sh.n, sh.K, sh.C, acc);
        auto got = to_host<float>(*be, out, nc);
        check_close(got, want, 1e-6, what);
        auto again = to_device(*be, prior);
        g.combine_rows(again.f(), ge.f(), gpos.i(), weighted ? gw.f() : nullptr, sh.n, sh.K, sh.C, acc);
        CHECK(to_host<float>(*be, again, nc) == got);
      }

    DeviceArray dots(*be, sizeof(float) * nk);
    std::vector<float> want_dots(nk);
    g.rows_dot(dots.f(), gx.f(), ge.f(), gpos.i(), sh.n, sh.K, sh.C);
    c.rows_dot(want_dots.data(), x.data(), e.data(), pos.data(), sh.n, sh.K, sh.C);
    auto got_dots = to_host<float>(*be, dots, nk);
    check_close(got_dots, want_dots, 1e-5, "rows_dot " + shape);
    g.rows_dot(dots.f(), gx.f(), ge.f(), gpos.i(), sh.n, sh.K, sh.C);
    CHECK(to_host<float>(*be, dots, nk) == got_dots);
  }
}

#endif  // PIPER_HAVE_CUDA
