// Kernel cases of mixture-of-experts routing on the device: the router (softmax, top-k with and without a selection
// bias), capacity and the expert-ordered assignment list with its statistics, the balance loss and the router
// backward, against references written plainly (moe_routing_reference.hpp and loops here); and gather_rows past the
// kept rows of a routing (index -1).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernel_cases.hpp"
#include "moe_routing_reference.hpp"

namespace piper::test {

namespace {

struct RouteShape {
  int n, E, K;
  bool norm_topk, bias;
};

void route_cases(std::vector<KernelCase>& cases) {
  for (RouteShape s : {RouteShape{200, 8, 2, true, false}, RouteShape{333, 64, 8, false, true},
                       RouteShape{50, 128, 8, true, true}, RouteShape{1000, 6, 1, true, false}}) {
    const size_t ne = size_t(s.n) * s.E, nk = size_t(s.n) * s.K;
    auto route = [=](Kernels& k, Buffers& b, bool in_place) {
      float* probs = b.f("probs");
      if (in_place) k.copy(probs, b.f("logits"), ne * sizeof(float));
      k.moe_route(probs, b.i("selected"), b.f("weight"), in_place ? probs : b.f("logits"), s.bias ? b.f("bias") : nullptr,
                  s.n, s.E, s.K, s.norm_topk);
    };
    cases.push_back(
        {.name = "moe_route " + dims({{"n", s.n}, {"E", s.E}, {"K", s.K}}) + (s.norm_topk ? " normalized" : "") +
                 (s.bias ? " biased" : ""),
         .make =
             [=](std::mt19937& gen) {
               Tensors t;
               t["logits"] = f32(uniform(gen, ne, -3.f, 3.f));
               t["bias"] = f32(uniform(gen, size_t(s.E), -0.05f, 0.05f));
               t["probs"] = f32(filled(ne, std::nanf("")));
               t["selected"] = i32(std::vector<int32_t>(nk, -9));
               t["weight"] = f32(filled(nk, std::nanf("")));
               return t;
             },
         .call = [=](Kernels& k, Buffers& b) { route(k, b, false); },
         .outs = {{"probs", 1e-5, 1e-6}, {"selected", 0, 0}, {"weight", 1e-5, 1e-6}},
         .reference =
             [=](Tensors& t) {
               const moe::RouterShape r{s.n, 1, s.E, s.K, s.norm_topk, 0.0};
               const moe::Routing want = moe::route(r, t["logits"].f.data(), s.bias ? t["bias"].f.data() : nullptr);
               t["probs"] = f32(want.probs);
               t["selected"] = i32(want.selected);
               t["weight"] = f32(want.weight);
             },
         .cuda_repeatable = true,
         .twins = {Twin{.what = "in place", .call = [=](Kernels& k, Buffers& b) { route(k, b, true); }}},
         .property =
             [=](const Tensors&, const Tensors& out) {  // distinct experts; normalized weights sum to 1
               bool ok = true;
               for (int t = 0; t < s.n; ++t) {
                 const int32_t* sel = out.at("selected").i.data() + size_t(t) * s.K;
                 double sum = 0;
                 for (int k = 0; k < s.K; ++k) {
                   ok = ok && sel[k] >= 0 && sel[k] < s.E && std::count(sel, sel + s.K, sel[k]) == 1;
                   sum += out.at("weight").f[size_t(t) * s.K + k];
                 }
                 ok = ok && (!s.norm_topk || std::fabs(sum - 1.0) < 1e-5);
               }
               CHECK(ok);
             }});
  }
}

struct AssignShape {
  int sequences, T, E, K, capacity;
  int A() const { return std::min(sequences * T * K, sequences * E * capacity); }
};

void assign_cases(std::vector<KernelCase>& cases) {
  // dropless, a capacity that binds sometimes, one that binds hard, and a Qwen3-235B-like router (E 128, top-8)
  for (AssignShape s : {AssignShape{4, 50, 8, 2, 100}, AssignShape{6, 40, 16, 4, 10}, AssignShape{3, 64, 8, 2, 5},
                        AssignShape{4, 512, 128, 8, 40}}) {
    const int n = s.sequences * s.T, A = s.A();
    const size_t nk = size_t(n) * s.K;
    cases.push_back(
        {.name = "moe_assign " + dims({{"sequences", s.sequences}, {"T", s.T}, {"E", s.E}, {"K", s.K},
                                       {"capacity", s.capacity}}),
         .make =
             [=](std::mt19937& gen) {  // the experts and weights of a real router on random logits
               std::vector<float> logits = uniform(gen, size_t(n) * s.E, -2.f, 2.f);
               for (int t = 0; t < n; t += 3) logits[size_t(t) * s.E] += 3.f;  // expert 0 popular: it overflows
               const moe::Routing r = moe::route({n, s.T, s.E, s.K, true, 0.0}, logits.data());
               Tensors t;
               t["selected"] = i32(r.selected);
               t["weight"] = f32(r.weight);
               t["position"] = i32(std::vector<int32_t>(nk, -9));
               t["counts"] = i32(std::vector<int32_t>(size_t(s.E), -9));
               t["token"] = i32(std::vector<int32_t>(size_t(A), -9));
               t["token_weight"] = f32(filled(size_t(A), std::nanf("")));
               t["fraction"] = f32(filled(size_t(s.sequences) * s.E, std::nanf("")));
               std::vector<double> prior(size_t(s.E) + 1);
               for (auto& v : prior) v = double(gen() % 50);  // statistics add to what is there
               t["stats"] = f64(prior);
               return t;
             },
         .call =
             [=](Kernels& k, Buffers& b) {
               k.moe_assign(b.i("position"), b.i("counts"), b.i("token"), b.f("token_weight"), b.f("fraction"),
                            b.d("stats"), b.i("selected"), b.f("weight"), n, s.T, s.E, s.K, s.capacity, A);
             },
         .outs = {{"position", 0, 0},
                  {"counts", 0, 0},
                  {"token", 0, 0},
                  {"token_weight", 0, 0},
                  {"fraction", 0, 0},
                  {"stats", 0, 0}},
         .reference =
             [=](Tensors& t) {  // expert by expert, sequence by sequence, token by token
               const auto& sel = t["selected"].i;
               std::vector<int32_t> position(nk, -1), counts(size_t(s.E), 0), token(size_t(A), -1);
               std::vector<float> token_weight(size_t(A), 0.f), fraction(size_t(s.sequences) * s.E, 0.f);
               std::vector<double> stats = t["stats"].d;
               int at = 0;
               for (int e = 0; e < s.E; ++e)
                 for (int q = 0; q < s.sequences; ++q) {
                   int seen = 0;
                   for (size_t a = size_t(q) * s.T * s.K; a < size_t(q + 1) * s.T * s.K; ++a) {
                     if (sel[a] != e) continue;
                     if (seen++ >= s.capacity) continue;
                     position[a] = at;
                     token[size_t(at)] = int32_t(a / size_t(s.K));
                     token_weight[size_t(at)] = t["weight"].f[a];
                     ++at, ++counts[size_t(e)];
                   }
                   fraction[size_t(q) * s.E + e] = float(seen) * (float(s.E) / float(s.K * s.T));
                   stats[size_t(e)] += seen;
                 }
               stats[size_t(s.E)] += double(nk) - at;
               t["position"] = i32(position);
               t["counts"] = i32(counts);
               t["token"] = i32(token);
               t["token_weight"] = f32(token_weight);
               t["fraction"] = f32(fraction);
               t["stats"] = f64(stats);
             },
         .cuda_repeatable = true,
         .property =
             [=](const Tensors&, const Tensors& out) {  // the capacity binds where the case says it does
               int kept = 0;
               for (int32_t c : out.at("counts").i) kept += c;
               CHECK((s.capacity >= s.T * s.K) == (kept == int(nk)));
             }});
  }
}

void balance_cases(std::vector<KernelCase>& cases) {
  for (auto [sequences, T, E] : {std::tuple{2, 7, 4}, std::tuple{5, 300, 64}, std::tuple{1, 4096, 128}}) {
    const int n = sequences * T;
    const double scale = 0.37;
    cases.push_back({.name = "moe_balance_loss " + dims({{"sequences", sequences}, {"T", T}, {"E", E}}),
                     .make =
                         [=](std::mt19937& gen) {
                           Tensors t;
                           t["fraction"] = f32(uniform(gen, size_t(sequences) * E, 0.f, 2.f));
                           t["probs"] = f32(uniform(gen, size_t(n) * E, 0.f, 1.f));
                           t["loss"] = f64({0.25});  // added to
                           return t;
                         },
                     .call =
                         [=](Kernels& k, Buffers& b) {
                           k.moe_balance_loss(b.d("loss"), b.f("fraction"), b.f("probs"), n, T, E, scale);
                         },
                     .outs = {{"loss", 1e-12, 1e-12}},
                     .reference =
                         [=](Tensors& t) {
                           double sum = 0;
                           for (int q = 0; q < sequences; ++q)
                             for (int e = 0; e < E; ++e) {
                               double mean = 0;
                               for (int i = q * T; i < (q + 1) * T; ++i) mean += t["probs"].f[size_t(i) * E + e];
                               sum += double(t["fraction"].f[size_t(q) * E + e]) * mean / T;
                             }
                           t["loss"] = f64({0.25 + scale * sum});
                         },
                     .cuda_repeatable = true});
  }
}

void router_backward_cases(std::vector<KernelCase>& cases) {
  for (RouteShape s : {RouteShape{120, 8, 2, true, false}, RouteShape{300, 64, 8, false, false},
                       RouteShape{72, 128, 8, true, false}}) {
    const int T = 12;  // sequences of 12 tokens
    const size_t ne = size_t(s.n) * s.E, nk = size_t(s.n) * s.K;
    const double balance_scale = 0.3;
    cases.push_back(
        {.name = "moe_router_backward " + dims({{"n", s.n}, {"E", s.E}, {"K", s.K}}) +
                 (s.norm_topk ? " normalized" : ""),
         .make =
             [=](std::mt19937& gen) {
               std::vector<float> logits = uniform(gen, ne, -2.f, 2.f);
               const moe::Routing r = moe::route({s.n, T, s.E, s.K, s.norm_topk, 1.0}, logits.data());
               std::vector<float> dweight = uniform(gen, nk);
               for (size_t a = 0; a < nk; ++a)
                 if (r.position[a] < 0) dweight[a] = 0.f;  // dropped assignments carry no gradient
               Tensors t;
               t["probs"] = f32(r.probs);
               t["selected"] = i32(r.selected);
               t["weight"] = f32(r.weight);
               t["fraction"] = f32(r.fraction);
               t["dweight"] = f32(dweight);
               t["dlogits"] = f32(filled(ne, std::nanf("")));
               return t;
             },
         .call =
             [=](Kernels& k, Buffers& b) {
               k.moe_router_backward(b.f("dlogits"), b.f("probs"), b.i("selected"), b.f("weight"), b.f("fraction"),
                                     b.f("dweight"), s.n, T, s.E, s.K, s.norm_topk, balance_scale);
             },
         .outs = {{"dlogits", 1e-5, 1e-5, 1e-3}},  // entries near 0 by cancellation: against the terms' size
         .reference =
             [=](Tensors& t) {  // d probs, then through the softmax, in double
               std::vector<double> dl(ne);
               for (int i = 0; i < s.n; ++i) {
                 const float* p = t["probs"].f.data() + size_t(i) * s.E;
                 const int32_t* sel = t["selected"].i.data() + size_t(i) * s.K;
                 const float* w = t["weight"].f.data() + size_t(i) * s.K;
                 const float* dw = t["dweight"].f.data() + size_t(i) * s.K;
                 std::vector<double> dp(size_t(s.E));
                 for (int e = 0; e < s.E; ++e)
                   dp[size_t(e)] = balance_scale * t["fraction"].f[size_t(i / T) * s.E + e] / T;
                 double picked = 0, dot = 0;
                 for (int k = 0; k < s.K; ++k) picked += p[sel[k]], dot += double(dw[k]) * w[k];
                 for (int k = 0; k < s.K; ++k) dp[size_t(sel[k])] += s.norm_topk ? (dw[k] - dot) / picked : dw[k];
                 double pdp = 0;
                 for (int e = 0; e < s.E; ++e) pdp += p[e] * dp[size_t(e)];
                 for (int e = 0; e < s.E; ++e) dl[size_t(i) * s.E + e] = p[e] * (dp[size_t(e)] - pdp);
               }
               t["dlogits"] = as_f32(dl);
             },
         .cuda_repeatable = true});
  }
}

// A routing's worst-case rows: kept rows first, then -1 (and one -1 in between): those rows are written zero.
void gather_past_kept_cases(std::vector<KernelCase>& cases) {
  const int n = 50, m = 80, C = 37;
  cases.push_back({.name = "gather_rows with rows past the kept " + dims({{"m", m}, {"C", C}}),
                   .make =
                       [=](std::mt19937& gen) {
                         std::vector<int32_t> rows = tokens(gen, size_t(m), n);
                         for (int i = 60; i < m; ++i) rows[size_t(i)] = -1;
                         rows[7] = -1;
                         Tensors t;
                         t["rows"] = i32(rows);
                         t["x"] = f32(uniform(gen, size_t(n) * C));
                         t["scale"] = f32(uniform(gen, size_t(m)));
                         t["gathered"] = f32(filled(size_t(m) * C, std::nanf("")));
                         return t;
                       },
                   .call = [=](Kernels& k,
                               Buffers& b) { k.gather_rows(b.f("gathered"), b.f("x"), b.i("rows"), b.f("scale"), m, C); },
                   .outs = {{"gathered", 1e-6, 0}},
                   .reference =
                       [=](Tensors& t) {
                         for (int a = 0; a < m; ++a) {
                           const int r = t["rows"].i[size_t(a)];
                           for (int c = 0; c < C; ++c)
                             t["gathered"].f[size_t(a) * C + c] =
                                 r < 0 ? 0.f : float(double(t["x"].f[size_t(r) * C + c]) * t["scale"].f[size_t(a)]);
                         }
                       },
                   .cuda_repeatable = true});
}

}  // namespace

void add_moe_routing_cases(std::vector<KernelCase>& cases) {
  route_cases(cases);
  assign_cases(cases);
  balance_cases(cases);
  router_backward_cases(cases);
  gather_past_kept_cases(cases);
}

}  // namespace piper::test
