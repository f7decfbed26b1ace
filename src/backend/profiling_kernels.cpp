// ProfilingKernels (see profiling_kernels.hpp): every call forwards to the wrapped backend's kernels between
// two clock reads; the totals are kept under one mutex (calls are microseconds to milliseconds long).
#include "backend/profiling_kernels.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "util/timer.hpp"

namespace piper {

namespace {

thread_local std::string t_region = "(none)";

double matmul_flops(int N, int C, int OC) { return 2.0 * double(N) * double(C) * double(OC); }

std::string shape_key(const char* kernel, int N, int C, int OC) {
  char b[160];
  std::snprintf(b, sizeof(b), "%-22s N=%-6d C=%-6d OC=%-6d", kernel, N, C, OC);
  return b;
}

// A grouped call counts as one call with the FLOPs of all its products, keyed by its first product's shape.
double grouped_flops(const LinearGroup* groups, int count) {
  double flops = 0;
  for (int i = 0; i < count; ++i) flops += matmul_flops(groups[i].N, groups[i].C, groups[i].OC);
  return flops;
}

std::string grouped_shape_key(const char* kernel, const LinearGroup* groups, int count) {
  return count > 0 ? shape_key(kernel, groups[0].N, groups[0].C, groups[0].OC) : std::string();
}

}  // namespace

void ProfilingKernels::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  p_ = KernelProfile{};
}

KernelProfile ProfilingKernels::take(double wall_seconds, int64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  KernelProfile out = p_;
  out.wall_seconds = wall_seconds;
  out.steps = steps;
  return out;
}

void ProfilingKernels::begin_region(const char* name) {
  t_region = name ? name : "(none)";
  k_.begin_region(name);
}

template <typename F>
void ProfilingKernels::timed(const char* kernel, F&& f, double flops, const char* shape, int64_t downloads) {
  const double t0 = now_seconds();
  f();
  const double dt = now_seconds() - t0;
  std::lock_guard<std::mutex> lock(mu_);
  for (KernelTotals* t : {&p_.by_kernel[kernel], &p_.by_region[t_region]}) {
    t->calls += 1;
    t->seconds += dt;
    t->flops += flops;
    t->downloads += downloads;
  }
  if (shape) {
    KernelTotals& t = p_.by_matmul_shape[shape];
    t.calls += 1;
    t.seconds += dt;
    t.flops += flops;
  }
}

// x(N,C) · w(OC,C)^T and its two backward matmuls: each 2·N·C·OC FLOPs.
void ProfilingKernels::linear_forward(float* y, ConstAct x, const float* w, const float* b, int N, int C, int OC) {
  std::string s = shape_key("linear_forward", N, C, OC);
  timed("linear_forward", [&] { k_.linear_forward(y, x, w, b, N, C, OC); }, matmul_flops(N, C, OC), s.c_str());
}
void ProfilingKernels::linear_forward_to_bf16(uint16_t* y, ConstAct x, const float* w, const float* b, int N, int C,
                                              int OC, float* room) {
  std::string s = shape_key("linear_forward_to_bf16", N, C, OC);
  timed("linear_forward_to_bf16", [&] { k_.linear_forward_to_bf16(y, x, w, b, N, C, OC, room); },
        matmul_flops(N, C, OC), s.c_str());
}
void ProfilingKernels::linear_gelu_forward(Act dgelu, Act y, ConstAct x, const float* w, const float* b, int N,
                                           int C, int OC, float* room) {
  std::string s = shape_key("linear_gelu_forward", N, C, OC);
  timed("linear_gelu_forward", [&] { k_.linear_gelu_forward(dgelu, y, x, w, b, N, C, OC, room); },
        matmul_flops(N, C, OC),
        s.c_str());
}
void ProfilingKernels::linear_backward_input(float* dx, ConstAct dy, const float* w, int N, int C, int OC,
                                             bool accumulate) {
  std::string s = shape_key("linear_backward_input", N, C, OC);
  timed("linear_backward_input", [&] { k_.linear_backward_input(dx, dy, w, N, C, OC, accumulate); },
        matmul_flops(N, C, OC), s.c_str());
}
void ProfilingKernels::linear_backward_weight(float* dw, float* db, ConstAct dy, ConstAct x, int N, int C,
                                              int OC, bool accumulate) {
  std::string s = shape_key("linear_backward_weight", N, C, OC);
  timed("linear_backward_weight", [&] { k_.linear_backward_weight(dw, db, dy, x, N, C, OC, accumulate); },
        matmul_flops(N, C, OC), s.c_str());
}
void ProfilingKernels::linear_forward_grouped(const LinearGroup* groups, int count) {
  std::string s = grouped_shape_key("linear_forward_grouped", groups, count);
  timed("linear_forward_grouped", [&] { k_.linear_forward_grouped(groups, count); }, grouped_flops(groups, count),
        s.empty() ? nullptr : s.c_str());
}
void ProfilingKernels::linear_backward_input_grouped(const LinearGroup* groups, int count) {
  std::string s = grouped_shape_key("linear_backward_input_grouped", groups, count);
  timed("linear_backward_input_grouped", [&] { k_.linear_backward_input_grouped(groups, count); },
        grouped_flops(groups, count), s.empty() ? nullptr : s.c_str());
}
void ProfilingKernels::linear_backward_weight_grouped(const LinearGroup* groups, int count) {
  std::string s = grouped_shape_key("linear_backward_weight_grouped", groups, count);
  timed("linear_backward_weight_grouped", [&] { k_.linear_backward_weight_grouped(groups, count); },
        grouped_flops(groups, count), s.empty() ? nullptr : s.c_str());
}
void ProfilingKernels::gelu_backward(float* dpre, const float* dy, ConstAct dgelu, size_t n) {
  timed("gelu_backward", [&] { k_.gelu_backward(dpre, dy, dgelu, n); });
}
void ProfilingKernels::layernorm_forward(Act y, float* mean, float* rstd, const float* x, const float* w,
                                         const float* b, int N, int C) {
  timed("layernorm_forward", [&] { k_.layernorm_forward(y, mean, rstd, x, w, b, N, C); });
}
void ProfilingKernels::layernorm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                                                const float* rstd, const float* w, int N, int C, bool accumulate) {
  timed("layernorm_backward_input", [&] { k_.layernorm_backward_input(dx, dy, x, mean, rstd, w, N, C, accumulate); });
}
void ProfilingKernels::layernorm_backward_weight(float* dw, float* db, const float* dy, const float* x,
                                                 const float* mean, const float* rstd, int N, int C, bool accumulate) {
  timed("layernorm_backward_weight",
        [&] { k_.layernorm_backward_weight(dw, db, dy, x, mean, rstd, N, C, accumulate); });
}
void ProfilingKernels::embedding_forward(float* x, const int32_t* tok, const float* wte, const float* wpe, int B,
                                         int T, int C) {
  timed("embedding_forward", [&] { k_.embedding_forward(x, tok, wte, wpe, B, T, C); });
}
void ProfilingKernels::embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tok, int B, int T,
                                          int C, int V, bool accumulate_wte, bool accumulate_wpe) {
  timed("embedding_backward",
        [&] { k_.embedding_backward(dwte, dwpe, dx, tok, B, T, C, V, accumulate_wte, accumulate_wpe); });
}
void ProfilingKernels::rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C,
                                       float eps) {
  timed("rmsnorm_forward", [&] { k_.rmsnorm_forward(y, rstd, x, w, N, C, eps); });
}
void ProfilingKernels::rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd,
                                              const float* w, int N, int C, bool accumulate) {
  timed("rmsnorm_backward_input", [&] { k_.rmsnorm_backward_input(dx, dy, x, rstd, w, N, C, accumulate); });
}
void ProfilingKernels::rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N,
                                               int C, bool accumulate) {
  timed("rmsnorm_backward_weight", [&] { k_.rmsnorm_backward_weight(dw, dy, x, rstd, N, C, accumulate); });
}
void ProfilingKernels::rope(float* x, int B, int T, int H, int D, float theta, bool inverse) {
  timed("rope", [&] { k_.rope(x, B, T, H, D, theta, inverse); });
}
void ProfilingKernels::gqa_attention_forward(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v,
                                             int B, int T, int H, int KV, int D, HeadRows rows) {
  timed("gqa_attention_forward", [&] { k_.gqa_attention_forward(y, lse, q, k, v, B, T, H, KV, D, rows); });
}
void ProfilingKernels::gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, ConstAct q,
                                              ConstAct k, ConstAct v, ConstAct y, const float* lse,
                                              float* scratch, int B, int T, int H, int KV, int D, HeadRows rows) {
  timed("gqa_attention_backward",
        [&] { k_.gqa_attention_backward(dq, dk, dv, dy, q, k, v, y, lse, scratch, B, T, H, KV, D, rows); });
}
void ProfilingKernels::swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n) {
  timed("swiglu_forward", [&] { k_.swiglu_forward(a, g, u, n); });
}
void ProfilingKernels::swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u,
                                       size_t n) {
  timed("swiglu_backward", [&] { k_.swiglu_backward(dg, du, da, g, u, n); });
}
void ProfilingKernels::token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) {
  timed("token_embedding_forward", [&] { k_.token_embedding_forward(x, tok, w, N, C); });
}
void ProfilingKernels::token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                                bool accumulate) {
  timed("token_embedding_backward", [&] { k_.token_embedding_backward(dw, dx, tok, N, C, V, accumulate); });
}
void ProfilingKernels::softmax_xent_forward(float* probs, double* loss_sum, const float* logits,
                                            const int32_t* targets, int N, int V, float scale) {
  timed("softmax_xent_forward", [&] { k_.softmax_xent_forward(probs, loss_sum, logits, targets, N, V, scale); });
}
void ProfilingKernels::vocab_xent_stats(float* stats, const float* logits, const int32_t* targets, int N, int Vl,
                                        int v0) {
  timed("vocab_xent_stats", [&] { k_.vocab_xent_stats(stats, logits, targets, N, Vl, v0); });
}
void ProfilingKernels::vocab_xent_finish(float* probs, double* loss_sum, const float* logits, const float* all,
                                         const int32_t* targets, int N, int Vl, int ranks, float scale) {
  timed("vocab_xent_finish", [&] { k_.vocab_xent_finish(probs, loss_sum, logits, all, targets, N, Vl, ranks, scale); });
}
void ProfilingKernels::vocab_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int Vl,
                                           int v0, float scale) {
  timed("vocab_xent_backward", [&] { k_.vocab_xent_backward(dlogits, probs, targets, N, Vl, v0, scale); });
}
void ProfilingKernels::vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0,
                                               int Vl) {
  timed("vocab_embedding_forward", [&] { k_.vocab_embedding_forward(x, tok, w, N, C, v0, Vl); });
}
void ProfilingKernels::vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0,
                                                int Vl, bool accumulate) {
  timed("vocab_embedding_backward", [&] { k_.vocab_embedding_backward(dw, dx, tok, N, C, v0, Vl, accumulate); });
}
void ProfilingKernels::softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, int N, int V,
                                             float scale) {
  timed("softmax_xent_backward", [&] { k_.softmax_xent_backward(dlogits, probs, targets, N, V, scale); });
}
void ProfilingKernels::add(float* y, const float* a, const float* b, size_t n) {
  timed("add", [&] { k_.add(y, a, b, n); });
}
void ProfilingKernels::accumulate(float* y, const float* x, size_t n) {
  timed("accumulate", [&] { k_.accumulate(y, x, n); });
}
void ProfilingKernels::fill(float* y, float value, size_t n) {
  timed("fill", [&] { k_.fill(y, value, n); });
}
void ProfilingKernels::to_bf16_with_column_sums(uint16_t* dst, float* sums, const float* src, int N, int C) {
  timed("to_bf16_with_column_sums", [&] { k_.to_bf16_with_column_sums(dst, sums, src, N, C); });
}

void ProfilingKernels::gelu_backward_to_bf16(uint16_t* dpre, float* sums, const float* dy, ConstAct dgelu, int N,
                                             int C) {
  timed("gelu_backward_to_bf16", [&] { k_.gelu_backward_to_bf16(dpre, sums, dy, dgelu, N, C); });
}
void ProfilingKernels::to_bf16(uint16_t* dst, const float* src, size_t n) {
  timed("to_bf16", [&] { k_.to_bf16(dst, src, n); });
}
void ProfilingKernels::from_bf16(float* dst, const uint16_t* src, size_t n) {
  timed("from_bf16", [&] { k_.from_bf16(dst, src, n); });
}
void ProfilingKernels::copy(void* dst, const void* src, size_t bytes) {
  timed("copy", [&] { k_.copy(dst, src, bytes); });
}
void ProfilingKernels::sum_squares(double* acc, const float* x, size_t n) {
  timed("sum_squares", [&] { k_.sum_squares(acc, x, n); });
}
void ProfilingKernels::adamw(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& args) {
  timed("adamw", [&] { k_.adamw(param, grad, m, v, n, args); });
}
void ProfilingKernels::gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m,
                                   int C) {
  timed("gather_rows", [&] { k_.gather_rows(dst, src, rows, scale, m, C); });
}
void ProfilingKernels::combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K,
                                    int C, bool accumulate) {
  timed("combine_rows", [&] { k_.combine_rows(dst, src, pos, w, n, K, C, accumulate); });
}
void ProfilingKernels::rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C) {
  timed("rows_dot", [&] { k_.rows_dot(out, a, b, pos, n, K, C); });
}

void ProfilingKernels::moe_route(float* probs, int32_t* selected, float* weight, const float* logits,
                                 const float* bias, int n, int E, int K, bool norm_topk) {
  timed("moe_route", [&] { k_.moe_route(probs, selected, weight, logits, bias, n, E, K, norm_topk); });
}
void ProfilingKernels::moe_assign(int32_t* position, int32_t* counts, int32_t* token, float* token_weight,
                                  float* fraction, double* stats, const int32_t* selected, const float* weight, int n,
                                  int T, int E, int K, int capacity, int A) {
  timed("moe_assign", [&] {
    k_.moe_assign(position, counts, token, token_weight, fraction, stats, selected, weight, n, T, E, K, capacity, A);
  });
}
void ProfilingKernels::moe_balance_loss(double* loss, const float* fraction, const float* probs, int n, int T, int E,
                                        double scale) {
  timed("moe_balance_loss", [&] { k_.moe_balance_loss(loss, fraction, probs, n, T, E, scale); });
}
void ProfilingKernels::moe_router_backward(float* dlogits, const float* probs, const int32_t* selected,
                                           const float* weight, const float* fraction, const float* dweight, int n,
                                           int T, int E, int K, bool norm_topk, double balance_scale) {
  timed("moe_router_backward", [&] {
    k_.moe_router_backward(dlogits, probs, selected, weight, fraction, dweight, n, T, E, K, norm_topk, balance_scale);
  });
}
void ProfilingKernels::upload(void* dst, const void* host_src, size_t bytes) {
  timed("upload", [&] { k_.upload(dst, host_src, bytes); });
}
void ProfilingKernels::download(void* host_dst, const void* src, size_t bytes) {
  timed("download", [&] { k_.download(host_dst, src, bytes); }, 0, nullptr, 1);
}

std::string format_profile(const KernelProfile& p, int rank) {
  std::string out;
  char line[256];
  const double steps = double(std::max<int64_t>(1, p.steps));
  double kernel_total = 0;
  for (const auto& [name, t] : p.by_kernel) kernel_total += t.seconds;
  std::snprintf(line, sizeof(line),
                "profile rank %d: %lld steps, %.2f ms per step, %.2f ms of it in kernels (%.0f%%)\n", rank,
                static_cast<long long>(p.steps), p.wall_seconds / steps * 1e3, kernel_total / steps * 1e3,
                p.wall_seconds > 0 ? 100.0 * kernel_total / p.wall_seconds : 0.0);
  out += line;
  auto table = [&](const char* title, const std::map<std::string, KernelTotals>& m, bool rate) {
    std::vector<std::pair<std::string, KernelTotals>> rows(m.begin(), m.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::snprintf(line, sizeof(line), "  %-48s %10s %10s %7s%s\n", title, "calls/step", "ms/step", "share",
                  rate ? "   GFLOP/s" : "  to-host/step");
    out += line;
    for (const auto& [name, t] : rows) {
      std::snprintf(line, sizeof(line), "  %-48s %10.1f %10.3f %6.1f%%", name.c_str(), double(t.calls) / steps,
                    t.seconds / steps * 1e3, kernel_total > 0 ? 100.0 * t.seconds / kernel_total : 0.0);
      out += line;
      if (rate)
        std::snprintf(line, sizeof(line), " %9.1f", t.seconds > 0 ? t.flops / t.seconds / 1e9 : 0.0);
      else
        std::snprintf(line, sizeof(line), " %13.1f", double(t.downloads) / steps);
      out += line;
      out += "\n";
    }
  };
  table("kernel", p.by_kernel, false);
  table("region (model segment)", p.by_region, false);
  table("matmul shape", p.by_matmul_shape, true);
  return out;
}

}  // namespace piper
