// Kernel cases of the element-wise and memory calls: add, accumulate, fill, copy, upload and download, the sum of
// squares (gradient clipping) and the AdamW update, against references of their exact or double results.
#include <cmath>

#include "kernel_cases.hpp"

namespace piper::test {

namespace {

void memory_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(37), size_t(100003)}) {  // the second splits across threads
    const std::string shape = dims({{"n", long(n)}});
    auto start = [=](std::mt19937& gen) {
      Tensors t;
      t["a"] = f32(uniform(gen, n));
      t["b"] = f32(uniform(gen, n));
      t["y"] = f32(uniform(gen, n));
      t["ids"] = i32({3, -1, 7});
      t["ids_out"] = i32({0, 0, 0});
      return t;
    };
    auto each = [](Tensors& t, auto f) {
      for (size_t k = 0; k < t["y"].f.size(); ++k) t["y"].f[k] = f(t["a"].f[k], t["b"].f[k], t["y"].f[k]);
    };
    cases.push_back({.name = "add " + shape,  // y = a + b
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { k.add(b.f("y"), b.f("a"), b.f("b"), n); },
                     .outs = {{"y", 0, 0}},
                     .reference = [=](Tensors& t) { each(t, [](float a, float b, float) { return a + b; }); },
                     .cuda_repeatable = true});
    cases.push_back({.name = "accumulate twice " + shape,  // y += a, y += b
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.accumulate(b.f("y"), b.f("a"), n);
                           k.accumulate(b.f("y"), b.f("b"), n);
                         },
                     .outs = {{"y", 0, 0}},
                     .reference = [=](Tensors& t) { each(t, [](float a, float b, float y) { return (y + a) + b; }); },
                     .cuda_repeatable = true});
    cases.push_back({.name = "fill, neighbours untouched " + shape,  // y[1 .. n-1) = 2.5
                     .make = start,
                     .call = [=](Kernels& k, Buffers& b) { k.fill(b.f("y") + 1, 2.5f, n - 2); },
                     .outs = {{"y", 0, 0}},
                     .reference =
                         [=](Tensors& t) {
                           for (size_t k = 1; k + 1 < n; ++k) t["y"].f[k] = 2.5f;
                         }});
    cases.push_back({.name = "copy, a copy to itself, and an untyped copy of ints " + shape,
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.copy(b.f("y"), b.f("b"), sizeof(float) * (n - 1));  // the last element stays
                           k.copy(b.f("y"), b.f("y"), sizeof(float) * n);
                           k.copy(b.i("ids_out"), b.i("ids"), sizeof(int32_t) * 3);
                         },
                     .outs = {{"y", 0, 0}, {"ids_out", 0, 0}},
                     .reference =
                         [=](Tensors& t) {
                           for (size_t k = 0; k + 1 < n; ++k) t["y"].f[k] = t["b"].f[k];
                           t["ids_out"] = t["ids"];
                         }});
    cases.push_back({.name = "download then upload " + shape,  // through host memory, bit for bit
                     .make = start,
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           std::vector<float> host_copy(n);
                           k.download(host_copy.data(), b.f("a"), sizeof(float) * n);
                           k.upload(b.f("y"), host_copy.data(), sizeof(float) * n);
                         },
                     .outs = {{"y", 0, 0}},
                     .reference = [=](Tensors& t) { t["y"] = t["a"]; }});
  }
}

void sum_squares_cases(std::vector<KernelCase>& cases) {
  for (size_t n : {size_t(1), size_t(1000), size_t(100003), size_t(200003)}) {
    cases.push_back({.name = "sum_squares " + dims({{"n", long(n)}}),  // acc += Σ a², summed in double
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t;
                           t["a"] = f32(uniform(gen, n, -3.f, 3.f));
                           t["acc"] = f64({2.25});  // added to
                           return t;
                         },
                     .call = [=](Kernels& k, Buffers& b) { k.sum_squares(b.d("acc"), b.f("a"), n); },
                     .outs = {{"acc", 1e-5, 1e-7}},  // squares of floats summed in double, in chunks
                     .reference =
                         [=](Tensors& t) {
                           for (float a : t["a"].f) t["acc"].d[0] += double(a) * a;
                         },
                     .cuda_repeatable = true});
  }
}

// Five steps of torch.optim.AdamW (foreach=False), from moments that are already there: p *= 1 − lr·wd;
// m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²; p −= lr / (1−β1^t) · m / (sqrt(v) / sqrt(1−β2^t) + eps), with g the
// gradient times grad_scale (0.25 at step 3: clipping). Every seventh gradient is zero: decay only.
void adamw_cases(std::vector<KernelCase>& cases) {
  constexpr int kSteps = 5;
  AdamWArgs args;
  args.lr = 1e-2f;
  args.beta1 = 0.9f;
  args.beta2 = 0.95f;
  args.eps = 1e-8f;
  args.weight_decay = 0.1f;
  auto step_args = [=](int step) {
    AdamWArgs a = args;
    a.step = step;
    a.grad_scale = step == 3 ? 0.25f : 1.0f;
    return a;
  };
  for (size_t n : {size_t(53), size_t(40000), size_t(100003)}) {  // the larger ones split across threads
    cases.push_back({.name = "adamw, five steps " + dims({{"n", long(n)}}),
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t;
                           t["p"] = f32(uniform(gen, n));
                           auto g = uniform(gen, n * kSteps, -0.3f, 0.3f);
                           for (size_t i = 0; i < g.size(); i += 7) g[i] = 0.f;
                           t["g"] = f32(g);
                           t["m"] = f32(uniform(gen, n, -0.1f, 0.1f));
                           t["v"] = f32(uniform(gen, n, 0.f, 0.01f));
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           for (int step = 1; step <= kSteps; ++step)
                             k.adamw(b.f("p"), b.f("g") + size_t(step - 1) * n, b.f("m"), b.f("v"), n, step_args(step));
                         },
                     .outs = {{"p", 1e-5, 3e-6, 0, 1}, {"m", 1e-5}, {"v", 1e-5}},
                     .reference =
                         [=](Tensors& t) {
                           std::vector<double> p(t["p"].f.begin(), t["p"].f.end()), m(t["m"].f.begin(), t["m"].f.end()),
                               v(t["v"].f.begin(), t["v"].f.end());
                           for (int step = 1; step <= kSteps; ++step) {
                             const AdamWArgs a = step_args(step);
                             const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
                             const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
                             for (size_t i = 0; i < n; ++i) {
                               const double g = double(t["g"].f[size_t(step - 1) * n + i]) * double(a.grad_scale);
                               p[i] *= 1 - lr * wd;
                               m[i] = b1 * m[i] + (1 - b1) * g;
                               v[i] = b2 * v[i] + (1 - b2) * g * g;
                               p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
                             }
                           }
                           t["p"] = as_f32(p);
                           t["m"] = as_f32(m);
                           t["v"] = as_f32(v);
                         }});
  }
}

}  // namespace

void add_elementwise_cases(std::vector<KernelCase>& cases) {
  memory_cases(cases);
  sum_squares_cases(cases);
  adamw_cases(cases);
}

}  // namespace piper::test
