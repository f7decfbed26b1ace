// The profiling decorator: results are the wrapped kernels' own, and calls, FLOPs and regions are counted
// where they happened.
#include <catch2/catch.hpp>

#include <vector>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/profiling_kernels.hpp"

using namespace piper;

TEST_CASE("profiling kernels forward every call and count it by kernel, region and matmul shape", "[profile]") {
  CpuKernels cpu(1);
  ProfilingKernels prof(cpu);
  const int N = 8, C = 5, OC = 3;
  std::vector<float> x(N * C), w(OC * C), b(OC), y_ref(N * OC), y(N * OC);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.25f - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 5) * 0.125f - 0.25f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i);
  cpu.linear_forward(y_ref.data(), x.data(), w.data(), b.data(), N, C, OC);

  prof.begin_region("model.layers.0.mlp");
  prof.linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  prof.linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  CHECK(y == y_ref);
  prof.begin_region("head");
  std::vector<float> s(N * OC);
  prof.add(s.data(), y.data(), y.data(), s.size());
  CHECK(s[5] == 2 * y[5]);

  KernelProfile p = prof.take(1.0, 2);
  CHECK(p.by_kernel.at("linear_forward").calls == 2);
  CHECK(p.by_kernel.at("linear_forward").flops == Approx(2 * 2.0 * N * C * OC));
  CHECK(p.by_kernel.at("add").calls == 1);
  CHECK(p.by_kernel.at("add").flops == 0);
  CHECK(p.by_region.at("model.layers.0.mlp").calls == 2);
  CHECK(p.by_region.at("head").calls == 1);
  REQUIRE(p.by_matmul_shape.size() == 1);
  CHECK(p.by_matmul_shape.begin()->first.find("N=8") != std::string::npos);
  std::string text = format_profile(p, 0);
  CHECK(text.find("linear_forward") != std::string::npos);
  CHECK(text.find("GFLOP/s") != std::string::npos);

  prof.reset();
  CHECK(prof.take(0, 0).by_kernel.empty());
}
