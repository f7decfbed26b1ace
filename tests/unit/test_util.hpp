// Helpers shared by the numeric unit tests: seeded random tensors, double-precision reference
// implementations of the layer math, central finite differences, closeness checks and guarded buffers.
// References are written from the textbook definitions, independently of the code under test.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace piper::test {

// A small text file in the temporary folder, for jobs that only need data.path to name a readable file.
inline std::string scratch_data_file() {
  const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/piper-unit-data.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f) {
    for (int i = 0; i < 64; ++i) std::fputs("the quick brown fox jumps over the lazy dog\n", f);
    std::fclose(f);
  }
  return path;
}

// ---- random inputs ----
struct Rand {
  std::mt19937_64 gen;
  explicit Rand(uint64_t seed) : gen(seed) {}
  std::vector<float> normal(size_t n, double stddev = 1.0, double mean = 0.0) {
    std::normal_distribution<double> d(mean, stddev);
    std::vector<float> v(n);
    for (auto& x : v) x = float(d(gen));
    return v;
  }
  std::vector<int32_t> ints(size_t n, int lo, int hi) {  // uniform in [lo, hi)
    std::uniform_int_distribution<int> d(lo, hi - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
};

// Elementwise a - b and a + b in double (for perturbed inputs and gradient checks).
inline std::vector<double> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = double(a[i]) - double(b[i]);
  return d;
}

template <typename T>
std::vector<double> plus(const std::vector<float>& a, const std::vector<T>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = double(a[i]) + double(b[i]);
  return d;
}

// ---- double-precision references (row-major) ----
inline double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

inline double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  double u = k * (x + 0.044715 * x * x * x);
  double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// y(N,OC) = x(N,C) w(OC,C)^T + b(OC)
template <typename TX, typename TW>
std::vector<double> linear_ref(const std::vector<TX>& x, const std::vector<TW>& w, const TW* b, int N, int C, int OC) {
  std::vector<double> y(size_t(N) * OC);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) {
      double s = b ? double(b[o]) : 0.0;
      for (int c = 0; c < C; ++c) s += double(x[size_t(r) * C + c]) * double(w[size_t(o) * C + c]);
      y[size_t(r) * OC + o] = s;
    }
  return y;
}

// y = (x - mean) / sqrt(var + 1e-5) * w + b per row; biased variance.
template <typename TX, typename TW>
std::vector<double> layernorm_ref(const std::vector<TX>& x, const std::vector<TW>& w, const std::vector<TW>& b, int N,
                                  int C, std::vector<double>* mean = nullptr, std::vector<double>* rstd = nullptr) {
  std::vector<double> y(size_t(N) * C);
  if (mean) mean->assign(size_t(N), 0.0);
  if (rstd) rstd->assign(size_t(N), 0.0);
  for (int r = 0; r < N; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += double(x[size_t(r) * C + c]);
    m /= C;
    for (int c = 0; c < C; ++c) v += (double(x[size_t(r) * C + c]) - m) * (double(x[size_t(r) * C + c]) - m);
    v /= C;
    double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c)
      y[size_t(r) * C + c] = (double(x[size_t(r) * C + c]) - m) * rs * double(w[size_t(c)]) + double(b[size_t(c)]);
    if (mean) (*mean)[size_t(r)] = m;
    if (rstd) (*rstd)[size_t(r)] = rs;
  }
  return y;
}

// Causal multi-head attention over qkv(B,T,3C) (q | k | v, head h at columns h*hd); y(B,T,C); lse(B,NH,T), the
// log-sum-exp of each query row's scores.
template <typename TQ>
std::vector<double> attention_ref(const std::vector<TQ>& qkv, int B, int T, int C, int NH,
                                  std::vector<double>* lse = nullptr) {
  const int hd = C / NH;
  std::vector<double> y(size_t(B) * T * C, 0.0);
  if (lse) lse->assign(size_t(B) * NH * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return double(qkv[(size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * hd + i]);
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(size_t(t) + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += at(b, t, 0, h, i) * at(b, j, 1, h, i);
          s[size_t(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        if (lse) (*lse)[(size_t(b) * NH + h) * T + t] = mx + std::log(z);
        for (int j = 0; j <= t; ++j) {
          double p = s[size_t(j)] / z;
          for (int i = 0; i < hd; ++i) y[(size_t(b) * T + t) * C + size_t(h) * hd + i] += p * at(b, j, 2, h, i);
        }
      }
  return y;
}

// x(B,T,C) = wte[tok] + wpe[t]
template <typename TW>
std::vector<double> embedding_ref(const std::vector<int32_t>& tok, const std::vector<TW>& wte,
                                  const std::vector<TW>& wpe, int B, int T, int C) {
  std::vector<double> x(size_t(B) * T * C);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < C; ++c)
      x[size_t(r) * C + c] = double(wte[size_t(tok[size_t(r)]) * C + c]) + double(wpe[size_t(r % T) * C + c]);
  return x;
}

// Σ_rows -log softmax(logits)[target]; probs(N,V) when asked.
template <typename TL>
double xent_ref(const std::vector<TL>& logits, const std::vector<int32_t>& targets, int N, int V,
                std::vector<double>* probs = nullptr) {
  double total = 0;
  if (probs) probs->assign(size_t(N) * V, 0.0);
  for (int r = 0; r < N; ++r) {
    double mx = -1e300;
    for (int i = 0; i < V; ++i) mx = std::max(mx, double(logits[size_t(r) * V + i]));
    double z = 0;
    for (int i = 0; i < V; ++i) z += std::exp(double(logits[size_t(r) * V + i]) - mx);
    total += std::log(z) - (double(logits[size_t(r) * V + size_t(targets[size_t(r)])]) - mx);
    if (probs)
      for (int i = 0; i < V; ++i) (*probs)[size_t(r) * V + i] = std::exp(double(logits[size_t(r) * V + i]) - mx) / z;
  }
  return total;
}

// ---- comparisons ----
// Largest violation of |got - ref| <= atol + rtol |ref|, as a ratio (<= 1 passes), with where it happened.
struct Closeness {
  double worst_ratio = 0;
  size_t worst_index = 0;
  double got = 0, ref = 0;
  std::string describe(const std::string& what) const {
    std::ostringstream os;
    os << what << ": worst at [" << worst_index << "] got " << got << " expected " << ref
       << " (ratio to tolerance " << worst_ratio << ")";
    return os.str();
  }
};

template <typename TG, typename TR>
Closeness closeness(const std::vector<TG>& got, const std::vector<TR>& ref, double atol, double rtol) {
  Closeness c;
  if (got.size() != ref.size()) {
    c.worst_ratio = 1e30;
    return c;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    double g = double(got[i]), r = double(ref[i]);
    double ratio = std::fabs(g - r) / (atol + rtol * std::fabs(r));
    if (!(ratio <= c.worst_ratio)) {  // also catches NaN
      c.worst_ratio = std::isnan(ratio) ? 1e30 : ratio;
      c.worst_index = i;
      c.got = g;
      c.ref = r;
    }
  }
  return c;
}

#define CHECK_CLOSE(got, ref, atol, rtol, what)                         \
  do {                                                                  \
    auto c_ = ::piper::test::closeness((got), (ref), (atol), (rtol));   \
    INFO(c_.describe(what));                                            \
    CHECK(c_.worst_ratio <= 1.0);                                       \
  } while (0)

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  // memcmp of an empty vector's null data() is undefined (UBSan reports it), even for 0 bytes
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// ---- finite differences ----
// Central differences of f with respect to x[i] for each i in `which` (all elements when empty); x is
// restored. The step is the exact difference of the two float-rounded points, so rounding x ± eps to
// float does not bias the quotient.
inline std::vector<double> numeric_grad(std::vector<float>& x, double eps, const std::function<double()>& f,
                                        const std::vector<size_t>& which = {}) {
  std::vector<double> g(x.size(), 0.0);
  auto one = [&](size_t i) {
    const float x0 = x[i];
    const float xp = float(double(x0) + eps), xm = float(double(x0) - eps);
    x[i] = xp;
    double fp = f();
    x[i] = xm;
    double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (double(xp) - double(xm));
  };
  if (which.empty())
    for (size_t i = 0; i < x.size(); ++i) one(i);
  else
    for (size_t i : which) one(i);
  return g;
}

// Gradient error: max_i |analytic_i - numeric_i| / max(|numeric_i|, floor), over `which` (all when empty).
template <typename TA>
double grad_error(const std::vector<TA>& analytic, const std::vector<double>& numeric, double floor,
                  const std::vector<size_t>& which = {}, size_t* worst = nullptr) {
  double e = 0;
  auto one = [&](size_t i) {
    double r = std::fabs(double(analytic[i]) - numeric[i]) / std::max(std::fabs(numeric[i]), floor);
    if (!(r <= e)) {
      e = std::isnan(r) ? 1e30 : r;
      if (worst) *worst = i;
    }
  };
  if (which.empty())
    for (size_t i = 0; i < numeric.size(); ++i) one(i);
  else
    for (size_t i : which) one(i);
  return e;
}

// Σ w_i y_i in double: the scalar objective whose gradient with respect to y is w.
inline double dot(const std::vector<float>& w, const float* y, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(w[i]) * double(y[i]);
  return s;
}

// ---- guarded buffers ----
// A float buffer with canary words after its end, to catch writes past the size a layout promised.
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  explicit Guarded(size_t bytes = 0) { resize(bytes); }
  void resize(size_t bytes) {
    n_ = (bytes + sizeof(float) - 1) / sizeof(float);
    v_.assign(n_ + kGuard, 0.f);
    for (size_t i = 0; i < kGuard; ++i) std::memcpy(&v_[n_ + i], &kCanary, 4);
  }
  float* data() { return n_ ? v_.data() : nullptr; }
  const float* data() const { return n_ ? v_.data() : nullptr; }
  size_t size() const { return n_; }
  bool intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&v_[n_ + i], &kCanary, 4) != 0) return false;
    return true;
  }

 private:
  static constexpr uint32_t kCanary = 0x7fc0beefu;  // a quiet NaN no kernel writes
  std::vector<float> v_;
  size_t n_ = 0;
};

}  // namespace piper::test
