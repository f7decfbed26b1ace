// The kernel test harness's machinery: host tensors, a backend's buffers for a case, running a case, and the
// comparisons every runner shares (relative error against a scale, finite differences of a double loss).
#include "kernel_harness.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace piper::test {

size_t HostTensor::count() const { return type == Type::F32 ? f.size() : type == Type::I32 ? i.size() : d.size(); }

size_t HostTensor::bytes() const {
  return count() * (type == Type::F32 ? sizeof(float) : type == Type::I32 ? sizeof(int32_t) : sizeof(double));
}

const void* HostTensor::data() const {
  return type == Type::F32   ? static_cast<const void*>(f.data())
         : type == Type::I32 ? static_cast<const void*>(i.data())
                             : static_cast<const void*>(d.data());
}

void* HostTensor::data() { return const_cast<void*>(static_cast<const HostTensor*>(this)->data()); }

std::vector<double> HostTensor::as_double() const {
  if (type == Type::F32) return {f.begin(), f.end()};
  if (type == Type::I32) return {i.begin(), i.end()};
  return d;
}

HostTensor f32(std::vector<float> v) {
  HostTensor t;
  t.f = std::move(v);
  return t;
}

HostTensor i32(std::vector<int32_t> v) {
  HostTensor t;
  t.type = Type::I32;
  t.i = std::move(v);
  return t;
}

HostTensor f64(std::vector<double> v) {
  HostTensor t;
  t.type = Type::F64;
  t.d = std::move(v);
  return t;
}

std::vector<float> uniform(std::mt19937& gen, size_t n, float lo, float hi) {
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

namespace {

// After every buffer: a quiet NaN with a payload no kernel computes, repeated.
constexpr size_t kGuardBytes = 256;

const std::vector<uint32_t>& guard_pattern() {
  static const std::vector<uint32_t> g(kGuardBytes / sizeof(uint32_t), 0x7fc0beefu);
  return g;
}

}  // namespace

Buffers::Buffers(Backend& be, const Tensors& start) : be_(&be), start_(&start) {
  for (const auto& [name, t] : start) {
    char* p = static_cast<char*>(be.allocate(t.bytes() + kGuardBytes));
    if (t.bytes()) be.kernels().upload(p, t.data(), t.bytes());
    be.kernels().upload(p + t.bytes(), guard_pattern().data(), kGuardBytes);
    p_[name] = p;
  }
}

Buffers::~Buffers() {
  for (const auto& [name, p] : p_) be_->release(p, start_->at(name).bytes() + kGuardBytes);
  for (const auto& [p, bytes] : scratch_) be_->release(p, bytes + kGuardBytes);
}

void* Buffers::at(const std::string& name, Type type) {
  auto it = p_.find(name);
  if (it == p_.end()) throw std::logic_error("kernel case: no tensor '" + name + "'");
  if (start_->at(name).type != type) throw std::logic_error("kernel case: tensor '" + name + "' read as another type");
  return it->second;
}

float* Buffers::f(const std::string& name) { return static_cast<float*>(at(name, Type::F32)); }
int32_t* Buffers::i(const std::string& name) { return static_cast<int32_t*>(at(name, Type::I32)); }
double* Buffers::d(const std::string& name) { return static_cast<double*>(at(name, Type::F64)); }

float* Buffers::scratch(size_t floats) {
  const size_t bytes = floats * sizeof(float);
  char* p = static_cast<char*>(be_->allocate(bytes + kGuardBytes));
  be_->kernels().upload(p + bytes, guard_pattern().data(), kGuardBytes);
  scratch_.emplace_back(p, bytes);
  return reinterpret_cast<float*>(p);
}

HostTensor Buffers::download(const std::string& name) const {
  HostTensor t = start_->at(name);
  if (t.bytes()) be_->kernels().download(t.data(), p_.at(name), t.bytes());
  return t;
}

std::vector<std::string> Buffers::overrun() const {
  std::vector<std::string> bad;
  std::vector<uint32_t> guard(guard_pattern().size());
  auto intact = [&](const void* p, size_t bytes) {
    be_->kernels().download(guard.data(), static_cast<const char*>(p) + bytes, kGuardBytes);
    return guard == guard_pattern();
  };
  for (const auto& [name, p] : p_)
    if (!intact(p, start_->at(name).bytes())) bad.push_back(name);
  for (size_t k = 0; k < scratch_.size(); ++k)
    if (!intact(scratch_[k].first, scratch_[k].second)) bad.push_back("scratch " + std::to_string(k));
  return bad;
}

uint32_t case_seed(const KernelCase& c) {  // FNV-1a of the name
  uint32_t h = 2166136261u;
  for (unsigned char ch : c.name) h = (h ^ ch) * 16777619u;
  return h;
}

Tensors run_call(Backend& be, const KernelCase& c, const std::function<void(Kernels&, Buffers&)>& call,
                 const Tensors& start) {
  Buffers bufs(be, start);
  call(be.kernels(), bufs);
  be.synchronize(nullptr);
  Tensors out;
  for (const Out& o : c.outs) out[o.tensor] = bufs.download(o.tensor);
  for (const std::string& name : bufs.overrun()) {
    INFO(c.name << ": the call wrote past the end of " << name);
    CHECK(false);
  }
  return out;
}

Tensors run_case(Backend& be, const KernelCase& c, const Tensors& start) { return run_call(be, c, c.call, start); }

void check_twins_and_property(Backend& be, const KernelCase& c, const Tensors& start, const Tensors& got,
                              const char* prefix, bool repeatable) {
  for (const Twin& t : c.twins) {
    const Tensors twin = run_call(be, c, t.call, start);
    for (const Out& o : c.outs)
      if (t.outs.empty() || std::find(t.outs.begin(), t.outs.end(), o.tensor) != t.outs.end())
        check_close(twin.at(o.tensor), got.at(o.tensor), t.rtol == 0 && !repeatable ? o.rtol_cuda : t.rtol,
                    c.name + " " + o.tensor + ": " + t.what, std::max(o.min_scale, t.min_scale), prefix);
  }
  if (c.property) {
    INFO(c.name << " (" << prefix << ")");
    c.property(start, got);
  }
}

bool check_close(const HostTensor& got_t, const HostTensor& want_t, double rtol, const std::string& what,
                 double min_scale, const char* prefix, const std::vector<double>* scale) {
  // element k as a double, without copying the tensors
  auto at_k = [](const HostTensor& t) {
    return [&t](size_t k) {
      return t.type == Type::F32 ? double(t.f[k]) : t.type == Type::I32 ? double(t.i[k]) : t.d[k];
    };
  };
  const auto got = at_k(got_t), want = at_k(want_t);
  const size_t n = got_t.count();
  REQUIRE(n == want_t.count());
  if (scale) REQUIRE(scale->size() == n);
  if (rtol == 0) {  // bit for bit
    const bool same =
        got_t.type == want_t.type &&
        std::equal(static_cast<const char*>(got_t.data()), static_cast<const char*>(got_t.data()) + got_t.bytes(),
                   static_cast<const char*>(want_t.data()));
    INFO(what << ": not the same bits");
    CHECK(same);
    std::printf("%s | %s | %s\n", prefix, what.c_str(), same ? "the same bits" : "DIFFERENT BITS");
    return same;
  }
  double peak = 0;
  for (size_t k = 0; k < n; ++k) peak = std::max(peak, std::fabs(want(k)));
  const double floor = std::max({peak * 1e-2, min_scale, 1e-30});
  double worst = 0;
  size_t at = 0;
  bool finite = true;
  for (size_t k = 0; k < n; ++k) {
    if (!std::isfinite(got(k))) {
      finite = false;
      at = k;
      break;
    }
    const double err =
        std::fabs(got(k) - want(k)) / (scale ? std::max((*scale)[k], 1e-30) : std::max(std::fabs(want(k)), floor));
    if (err > worst) {
      worst = err;
      at = k;
    }
  }
  std::ostringstream msg;
  msg << what << ": worst relative error " << worst << " at " << at;
  if (n) msg << " (got " << got(at) << ", want " << want(at) << ")";
  INFO(msg.str());
  CHECK(finite);
  CHECK(worst <= rtol);
  std::printf("%s | %s | worst relative error %.3g | tolerance %.3g%s\n", prefix, what.c_str(), worst, rtol,
              finite ? "" : " | NOT FINITE");
  return finite && worst <= rtol;
}

void check_gradient(const Gradient& g, const Tensors& start, const Tensors& cpu_out, const std::string& what) {
  const std::vector<float>& x0 = start.at(g.input).f;
  const std::vector<float>& analytic = cpu_out.at(g.grad).f;
  REQUIRE(x0.size() == analytic.size());
  // every element of a small tensor, else 64 spread over it, first and last included
  std::vector<size_t> at;
  const size_t n = x0.size(), samples = std::min<size_t>(n, 64);
  for (size_t s = 0; s < samples; ++s) at.push_back(samples == 1 ? 0 : s * (n - 1) / (samples - 1));
  std::vector<double> numeric;
  Tensors probe = start;
  std::vector<float>& x = probe.at(g.input).f;
  for (size_t k : at) {
    const float h = 1e-2f * std::max(1.f, std::fabs(x0[k]));
    x[k] = x0[k] + h;
    const double up = g.loss(probe), step_up = double(x[k]);
    x[k] = x0[k] - h;
    const double down = g.loss(probe), step_down = double(x[k]);
    x[k] = x0[k];
    numeric.push_back((up - down) / (step_up - step_down));
  }
  double peak = 0;
  for (double v : numeric) peak = std::max(peak, std::fabs(v));
  double worst = 0;
  size_t worst_at = 0;
  for (size_t s = 0; s < at.size(); ++s) {
    const double err =
        std::fabs(double(analytic[at[s]]) - numeric[s]) / std::max({std::fabs(numeric[s]), 1e-2 * peak, 1e-30});
    if (err > worst) {
      worst = err;
      worst_at = at[s];
    }
  }
  INFO(what << ": d loss / d " << g.input << " against " << g.grad << ": worst relative error " << worst << " at "
            << worst_at);
  CHECK(worst <= g.rtol);
  std::printf("cpu-vs-numeric | %s d/d%s | worst relative error %.3g | tolerance %.3g\n", what.c_str(), g.input.c_str(),
              worst, g.rtol);
}

}  // namespace piper::test
