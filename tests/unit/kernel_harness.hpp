// One kernel test harness: a case names its tensors and how they start, the call on one backend's buffers,
// what to compare, and optionally a double-precision reference and finite-difference gradients. The CPU
// runner (test_kernel_cases.cpp) and the CUDA runner (test_cuda_kernels.cpp) take every case of one table.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace piper::test {

enum class Type { F32, I32, F64 };

// A tensor in host memory: one of the three vectors is used, by type.
struct HostTensor {
  Type type = Type::F32;
  std::vector<float> f;
  std::vector<int32_t> i;
  std::vector<double> d;
  size_t count() const;
  size_t bytes() const;
  const void* data() const;
  void* data();
  std::vector<double> as_double() const;
};
using Tensors = std::map<std::string, HostTensor>;

HostTensor f32(std::vector<float> v);
HostTensor i32(std::vector<int32_t> v);
HostTensor f64(std::vector<double> v);
std::vector<float> uniform(std::mt19937& gen, size_t n, float lo = -1.f, float hi = 1.f);
std::vector<int32_t> tokens(std::mt19937& gen, size_t n, int hi);  // each in [0, hi)

// One backend's copy of a case's tensors (uploaded at construction), and the scratch a call asks for. Each
// buffer is followed by guard bytes of a known pattern: a write past a tensor's end fails the case.
class Buffers {
 public:
  Buffers(Backend& be, const Tensors& start);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  float* f(const std::string& name);
  int32_t* i(const std::string& name);
  double* d(const std::string& name);
  float* scratch(size_t floats);  // freed with the buffers
  HostTensor download(const std::string& name) const;
  std::vector<std::string> overrun() const;  // the tensors (and "scratch N") whose guard bytes were written

 private:
  void* at(const std::string& name, Type type);
  Backend* be_;
  const Tensors* start_;
  std::map<std::string, void*> p_;
  std::vector<std::pair<void*, size_t>> scratch_;
};

// A compared output. rtol 0: bit for bit. Errors are relative to max(|want|, 1% of max |want|, min_scale), or,
// against a reference that also writes "<tensor>.scale" (doubles), to that scale element by element (a bound of
// the rounding, such as the sum of the magnitudes of the terms).
struct Out {
  std::string tensor;
  double rtol_cuda;              // CUDA against the CPU
  double rtol_reference = 1e-5;  // the CPU against the case's double reference, where it has one
  double min_scale = 0;          // for results that are zero by cancellation: the size of the terms summed
  double reference_floor = 0;    // against the reference only: below this size an error counts as absolute
};

// d loss / d input, by central differences of the case's double loss, against the kernel's output `grad`.
struct Gradient {
  std::string input, grad;
  std::function<double(const Tensors&)> loss;
  double rtol = 1e-2;
};

// Another call that must give the case's outputs on the same backend: in place against out of place, grouped
// against one call per group, accumulate against overwrite then add, one kernel against another.
struct Twin {
  std::string what;
  std::function<void(Kernels&, Buffers&)> call;
  double rtol = 0;                  // 0: bit for bit
  std::vector<std::string> outs{};  // the compared outputs; empty: all of the case's
  double min_scale = 0;             // below this size of result an error counts as absolute
};

struct KernelCase {
  std::string name{};                              // kernel and shape, as the summaries print it
  std::function<Tensors(std::mt19937&)> make{};    // every tensor the call reads or writes, as it starts
  std::function<void(Kernels&, Buffers&)> call{};  // the kernel call on one backend's buffers
  std::vector<Out> outs{};
  std::function<void(Tensors&)> reference{};  // optional: writes the outs, computed in double
  std::vector<Gradient> gradients{};          // optional
  double threads_rtol = 0;       // 1 thread against 2 on the CPU: 0 bit for bit (BLAS products may block apart)
  bool cuda_repeatable = false;  // CUDA gives the same bits on a second call (no atomics, fixed order)
  std::vector<Twin> twins{};     // optional
  std::function<void(const Tensors& start, const Tensors& out)> property{};  // optional CHECKs on any backend's outs
};

// Every kernel of the Kernels interface, on the shapes that matter to it (kernel_cases.cpp).
const std::vector<KernelCase>& kernel_cases();

// The seed of a case's inputs, from its name: the same inputs in every build and runner.
uint32_t case_seed(const KernelCase& c);

// Runs one case's call (or another call on its tensors) on `be` from `start` and returns the case's compared
// outputs; fails a CHECK when the call wrote past the end of a buffer.
Tensors run_case(Backend& be, const KernelCase& c, const Tensors& start);
Tensors run_call(Backend& be, const KernelCase& c, const std::function<void(Kernels&, Buffers&)>& call,
                 const Tensors& start);

// Every check of a case that needs only one backend's outputs `got`: the twins (run on `be`) and the property.
// A twin promised bit for bit is held to the out's rtol_cuda on a backend that does not repeat its bits.
void check_twins_and_property(Backend& be, const KernelCase& c, const Tensors& start, const Tensors& got,
                              const char* prefix, bool repeatable);

// Largest relative error of got against want (see Out); prints "PREFIX | what | worst ..." for summaries.
// Returns false (and fails a CHECK) when over rtol or not finite.
bool check_close(const HostTensor& got, const HostTensor& want, double rtol, const std::string& what,
                 double min_scale = 0, const char* prefix = "cpu", const std::vector<double>* scale = nullptr);

// The numeric gradient check of one Gradient on the CPU outputs of a case.
void check_gradient(const Gradient& g, const Tensors& start, const Tensors& cpu_out, const std::string& what);

}  // namespace piper::test
