// The CPU runner of the kernel case table (kernel_cases.cpp): every case on 1 and on 2 threads (the same bits,
// or within the case's tolerance where BLAS blocks apart), against its double reference and finite differences.
#include <catch2/catch.hpp>
#include <set>

#include "backend/backend.hpp"
#include "kernel_harness.hpp"

using namespace piper;
using namespace piper::test;

TEST_CASE("kernel cases: names are unique, every out and gradient names a tensor of the case", "[kernels]") {
  std::set<std::string> names;
  for (const KernelCase& c : kernel_cases()) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);
    std::mt19937 gen(case_seed(c));
    const Tensors start = c.make(gen);
    for (const Out& o : c.outs) CHECK(start.count(o.tensor) == 1);
    for (const Gradient& g : c.gradients) {
      CHECK(start.count(g.input) == 1);
      bool out = false;
      for (const Out& o : c.outs) out = out || o.tensor == g.grad;
      CHECK(out);
    }
  }
  CHECK(names.size() > 100);
}

TEST_CASE("kernel cases on the CPU: 1 and 2 threads agree, and match the double references and finite differences",
          "[kernels]") {
  auto one = make_backend("cpu", 1, 0), two = make_backend("cpu", 2, 0);
  for (const KernelCase& c : kernel_cases()) {
    std::mt19937 gen(case_seed(c));
    const Tensors start = c.make(gen);
    Tensors a = run_case(*one, c, start), b = run_case(*two, c, start);
    for (const Out& o : c.outs)
      check_close(b.at(o.tensor), a.at(o.tensor), c.threads_rtol, c.name + " " + o.tensor + ": 2 threads vs 1", 0,
                  "cpu-threads");
    if (c.reference) {
      Tensors want = start;
      c.reference(want);
      for (const Out& o : c.outs)
        check_close(b.at(o.tensor), want.at(o.tensor), o.rtol_reference, c.name + " " + o.tensor, o.min_scale,
                    "cpu-vs-reference");
    }
    for (const Gradient& g : c.gradients) check_gradient(g, start, b, c.name);
  }
}
