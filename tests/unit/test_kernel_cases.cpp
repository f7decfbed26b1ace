// The CPU runner of the kernel case table (kernel_cases.cpp): every case on 1 and on 2 threads (the same bits,
// or within the case's tolerance where BLAS blocks apart), against its double reference, finite differences,
// twins and property.
#include <catch2/catch.hpp>
#include <algorithm>
#include <set>

#include "backend/backend.hpp"
#include "kernel_harness.hpp"

using namespace piper;
using namespace piper::test;

TEST_CASE("kernel cases: names are unique", "[kernels]") {
  std::set<std::string> names;
  for (const KernelCase& c : kernel_cases()) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);
  }
  CHECK(names.size() > 100);
}

TEST_CASE("kernel cases on the CPU: 1 and 2 threads agree, and match the double references, finite differences, "
          "twins and properties",
          "[kernels]") {
  auto one = make_backend("cpu", 1, 0), two = make_backend("cpu", 2, 0);
  for (const KernelCase& c : kernel_cases()) {
    std::mt19937 gen(case_seed(c));
    const Tensors start = c.make(gen);
    {  // every out and gradient names a tensor of the case
      INFO(c.name);
      for (const Out& o : c.outs) REQUIRE(start.count(o.tensor) == 1);
      for (const Gradient& g : c.gradients) {
        REQUIRE(start.count(g.input) == 1);
        REQUIRE(std::any_of(c.outs.begin(), c.outs.end(), [&](const Out& o) { return o.tensor == g.grad; }));
      }
    }
    Tensors a = run_case(*one, c, start), b = run_case(*two, c, start);
    for (const Out& o : c.outs)
      check_close(b.at(o.tensor), a.at(o.tensor), c.threads_rtol, c.name + " " + o.tensor + ": 2 threads vs 1", 0,
                  "cpu-threads");
    if (c.reference) {
      Tensors want = start;
      c.reference(want);
      for (const Out& o : c.outs) {
        auto scale = want.find(o.tensor + ".scale");
        check_close(b.at(o.tensor), want.at(o.tensor), o.rtol_reference, c.name + " " + o.tensor,
                    std::max(o.min_scale, o.reference_floor),
                    "cpu-vs-reference", scale == want.end() ? nullptr : &scale->second.d);
      }
    }
    for (const Gradient& g : c.gradients) check_gradient(g, start, b, c.name);
    check_twins_and_property(*two, c, start, b, "cpu", true);
  }
}
