// The table of kernel cases: every Kernels call on the shapes that matter to it (odd sizes, sizes that split
// across threads or CUDA blocks, repeated and dropped indices). A new kernel is one row in a family's file.
#include "kernel_cases.hpp"

namespace piper::test {

std::string dims(std::initializer_list<std::pair<const char*, long>> d) {
  std::string s;
  for (const auto& [name, v] : d) {
    if (!s.empty()) s += ' ';
    s.append(name).append("=").append(std::to_string(v));
  }
  return s;
}

CpuKernels& host() {
  static CpuKernels k(1);
  return k;
}

HostTensor as_f32(const std::vector<double>& v) { return f32(std::vector<float>(v.begin(), v.end())); }

std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

double dot(const std::vector<float>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += double(a[k]) * b[k];
  return s;
}

std::vector<double> add_prior(std::vector<double> v, const std::vector<float>& prior, bool accumulate) {
  if (accumulate)
    for (size_t k = 0; k < v.size(); ++k) v[k] += prior[k];
  return v;
}

std::vector<int32_t> hot_tokens(std::mt19937& gen, size_t n, int V) {  // every third row scatters into token 7
  auto tok = tokens(gen, n, V);
  for (size_t i = 0; i < tok.size(); i += 3) tok[i] = 7;
  return tok;
}

std::function<void(const Tensors&, const Tensors&)> untouched_row(std::string tensor, int row, int width,
                                                                  bool accumulate) {
  return [=](const Tensors& start, const Tensors& out) {
    for (int c = 0; c < width; ++c) {
      const size_t at = size_t(row) * width + c;
      CHECK(out.at(tensor).f[at] == (accumulate ? start.at(tensor).f[at] : 0.f));
    }
  };
}

Twin overwrite_then_add(std::vector<std::pair<std::string, size_t>> outs,
                        std::function<void(Kernels&, Buffers&, const std::vector<float*>&)> overwrite, double rtol) {
  return {.what = "accumulate against overwrite then add",
          .call =
              [=](Kernels& k, Buffers& b) {
                std::vector<float*> tmp;
                for (const auto& [name, n] : outs) tmp.push_back(b.scratch(n));
                overwrite(k, b, tmp);
                for (size_t o = 0; o < outs.size(); ++o) k.accumulate(b.f(outs[o].first), tmp[o], outs[o].second);
              },
          .rtol = rtol,
          .outs = {},
          .min_scale = rtol > 0 ? 1.0 : 0.0};  // the priors are of size 1: one rounding of the sum apart
}

const std::vector<KernelCase>& kernel_cases() {
  static const std::vector<KernelCase> cases = [] {
    std::vector<KernelCase> c;
    add_gpt2_cases(c);
    add_qwen3_cases(c);
    add_moe_cases(c);
    add_moe_routing_cases(c);
    add_tensor_parallel_cases(c);
    add_elementwise_cases(c);
    add_bf16_cases(c);
    add_bf16_activation_cases(c);
    add_bf16_moe_cases(c);
    return c;
  }();
  return cases;
}

}  // namespace piper::test
