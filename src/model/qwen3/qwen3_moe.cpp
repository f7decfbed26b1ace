// Qwen3 mixture-of-experts MLP half of a layer: x + Σ_k w_k · expert_k(norm x), with the router, top-k,
// capacity and balance loss of moe_routing.hpp, and each expert's SwiGLU on the rows routed to it.
// Shapes: n = b·T tokens, C d_model, E experts, K top_k, DE d_expert, A = worst-case kept assignments.
#include <algorithm>
#include <vector>

#include "model/qwen3/moe_routing.hpp"
#include "model/qwen3/qwen3_segments.hpp"

namespace piper::qwen3 {

namespace {

const size_t f = sizeof(float), i32 = sizeof(int32_t);

struct MoeShape {
  int b, T, n, C, E, K, DE, A;
  float eps;
  moe::RouterShape router;
  MoeShape(const ModelDims& d, int samples)
      : b(samples), T(d.seq_len), n(samples * d.seq_len), C(d.d_model), E(d.moe_experts), K(d.moe_top_k),
        DE(d.moe_d_expert), eps(float(d.norm_eps)) {
    router = {n, T, E, K, d.moe_norm_topk_prob, d.moe_capacity_factor};
    // worst case: every assignment kept (dropless), or every expert full in every sequence
    A = std::min(n * K, b * E * router.capacity());
  }
};

// Carves consecutive 4-byte ranges (floats or int32) out of one buffer.
struct Carver {
  char* base;
  size_t at = 0;
  explicit Carver(void* p) : base(static_cast<char*>(p)) {}
  template <typename T>
  T* take(int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + at) : nullptr;
    at += size_t(count) * 4;
    return p;
  }
};

// Forward → backward: normed input, routing (probabilities, picks, weights, positions, the expert-ordered
// tokens and their weights, expert offsets, per-sequence fractions) and every expert's activations.
struct MoeStash {
  float *h, *rstd, *probs, *weight, *token_weight, *fraction, *x, *g, *u, *a, *y;
  int32_t *selected, *position, *token, *offsets;
  size_t bytes;
  MoeStash(void* p, const MoeShape& s) {
    Carver c(p);
    h = c.take<float>(int64_t(s.n) * s.C);             // (n,C)
    rstd = c.take<float>(s.n);                          // (n)
    probs = c.take<float>(int64_t(s.n) * s.E);          // (n,E); the router logits until routed
    selected = c.take<int32_t>(int64_t(s.n) * s.K);     // (n,K)
    weight = c.take<float>(int64_t(s.n) * s.K);         // (n,K)
    position = c.take<int32_t>(int64_t(s.n) * s.K);     // (n,K), -1 dropped
    token = c.take<int32_t>(s.A);                       // (A)
    token_weight = c.take<float>(s.A);                  // (A)
    offsets = c.take<int32_t>(s.E + 1);                 // (E+1)
    fraction = c.take<float>(int64_t(s.b) * s.E);       // (b,E)
    x = c.take<float>(int64_t(s.A) * s.C);              // expert inputs (A,C)
    g = c.take<float>(int64_t(s.A) * s.DE);             // gate projections (A,DE)
    u = c.take<float>(int64_t(s.A) * s.DE);             // up projections (A,DE)
    a = c.take<float>(int64_t(s.A) * s.DE);             // silu(g)·u (A,DE)
    y = c.take<float>(int64_t(s.A) * s.C);              // expert outputs (A,C)
    bytes = c.at;
  }
};

// Backward-input → backward-weight.
struct MoeWStash {
  float *dy, *dg, *du, *dlogits, *dh;
  size_t bytes;
  MoeWStash(void* p, const MoeShape& s) {
    Carver c(p);
    dy = c.take<float>(int64_t(s.A) * s.C);        // d expert outputs (A,C)
    dg = c.take<float>(int64_t(s.A) * s.DE);       // (A,DE)
    du = c.take<float>(int64_t(s.A) * s.DE);       // (A,DE)
    dlogits = c.take<float>(int64_t(s.n) * s.E);   // (n,E)
    dh = c.take<float>(int64_t(s.n) * s.C);        // d normed input (n,C)
    bytes = c.at;
  }
};

// Scratch of the fused/split backward-input after the wstash: d(silu(g)·u) (A,DE), d expert inputs (A,C),
// d combine weights (n,K).
struct MoeWork {
  float *da, *dx, *dweight;
  size_t bytes;
  MoeWork(void* p, const MoeShape& s) {
    Carver c(p);
    da = c.take<float>(int64_t(s.A) * s.DE);
    dx = c.take<float>(int64_t(s.A) * s.C);
    dweight = c.take<float>(int64_t(s.n) * s.K);
    bytes = c.at;
  }
};

const float* expert_param(const SegmentIO& io, int e, int which) { return io.w[kMoeExperts + 3 * e + which]; }
enum { kGate, kUp, kDown };

SegmentSizes moe_sizes(const Segment&, const ModelDims& d, int samples) {
  MoeShape s(d, samples);
  SegmentSizes z;
  z.input_bytes = z.out_bytes = size_t(s.n) * s.C * f;
  z.stash_bytes = MoeStash(nullptr, s).bytes;
  z.wstash_bytes = MoeWStash(nullptr, s).bytes;
  z.workspace_bytes = z.wstash_bytes + MoeWork(nullptr, s).bytes;
  return z;
}

// The routing decided in the forward, read back from the stash (host copies).
moe::Routing load_routing(Kernels& k, const MoeShape& s, const MoeStash& st) {
  moe::Routing r;
  r.probs.resize(size_t(s.n) * s.E);
  r.selected.resize(size_t(s.n) * s.K);
  r.weight.resize(size_t(s.n) * s.K);
  r.fraction.resize(size_t(s.b) * s.E);
  r.offsets.resize(size_t(s.E) + 1);
  k.download(r.probs.data(), st.probs, r.probs.size() * f);
  k.download(r.selected.data(), st.selected, r.selected.size() * i32);
  k.download(r.weight.data(), st.weight, r.weight.size() * f);
  k.download(r.fraction.data(), st.fraction, r.fraction.size() * f);
  k.download(r.offsets.data(), st.offsets, r.offsets.size() * i32);
  return r;
}

void moe_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  MoeShape s(d, io.samples);
  MoeStash st(io.stash, s);
  k.rmsnorm_forward(st.h, st.rstd, io.in, io.w[kMoeNorm], s.n, s.C, s.eps);  // (n,C)
  k.linear_forward(st.probs, st.h, io.w[kRouter], nullptr, s.n, s.C, s.E);   // router logits (n,E)
  std::vector<float> logits(size_t(s.n) * s.E);
  k.download(logits.data(), st.probs, logits.size() * f);
  const moe::Routing r = moe::route(s.router, logits.data());
  k.upload(st.probs, r.probs.data(), r.probs.size() * f);
  k.upload(st.selected, r.selected.data(), r.selected.size() * i32);
  k.upload(st.weight, r.weight.data(), r.weight.size() * f);
  k.upload(st.position, r.position.data(), r.position.size() * i32);
  k.upload(st.token, r.token.data(), r.token.size() * i32);
  k.upload(st.token_weight, r.token_weight.data(), r.token_weight.size() * f);
  k.upload(st.offsets, r.offsets.data(), r.offsets.size() * i32);
  k.upload(st.fraction, r.fraction.data(), r.fraction.size() * f);
  if (io.balance_loss) *io.balance_loss += d.moe_aux_loss_coef * double(io.loss_scale) * s.T * r.balance;

  const int m = r.offsets[size_t(s.E)];
  k.gather_rows(st.x, st.h, st.token, nullptr, m, s.C);  // expert inputs (m,C), expert-ordered
  for (int e = 0; e < s.E; ++e) {
    const int o = r.offsets[size_t(e)], ne = r.offsets[size_t(e) + 1] - o;
    if (ne == 0) continue;
    const int64_t xo = int64_t(o) * s.C, fo = int64_t(o) * s.DE;
    k.linear_forward(st.g + fo, st.x + xo, expert_param(io, e, kGate), nullptr, ne, s.C, s.DE);  // (ne,DE)
    k.linear_forward(st.u + fo, st.x + xo, expert_param(io, e, kUp), nullptr, ne, s.C, s.DE);    // (ne,DE)
    k.swiglu_forward(st.a + fo, st.g + fo, st.u + fo, size_t(ne) * s.DE);
    k.linear_forward(st.y + xo, st.a + fo, expert_param(io, e, kDown), nullptr, ne, s.DE, s.C);  // (ne,C)
  }
  k.copy(io.out, io.in, size_t(s.n) * s.C * f);                                   // residual
  k.combine_rows(io.out, st.y, st.position, st.weight, s.n, s.K, s.C, true);     // + Σ_k w_k · y
}

void moe_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  MoeShape s(d, io.samples);
  MoeStash st(io.stash, s);
  MoeWStash ws(io.wstash, s);
  MoeWork wk(io.workspace, s);
  const moe::Routing r = load_routing(k, s, st);
  const int m = r.offsets[size_t(s.E)];
  k.gather_rows(ws.dy, io.dout, st.token, st.token_weight, m, s.C);   // d expert outputs = w · dout (m,C)
  k.rows_dot(wk.dweight, io.dout, st.y, st.position, s.n, s.K, s.C);  // d combine weights (n,K)
  for (int e = 0; e < s.E; ++e) {
    const int o = r.offsets[size_t(e)], ne = r.offsets[size_t(e) + 1] - o;
    if (ne == 0) continue;
    const int64_t xo = int64_t(o) * s.C, fo = int64_t(o) * s.DE;
    k.linear_backward_input(wk.da + fo, ws.dy + xo, expert_param(io, e, kDown), ne, s.DE, s.C, false);
    k.swiglu_backward(ws.dg + fo, ws.du + fo, wk.da + fo, st.g + fo, st.u + fo, size_t(ne) * s.DE);
    k.linear_backward_input(wk.dx + xo, ws.dg + fo, expert_param(io, e, kGate), ne, s.C, s.DE, false);
    k.linear_backward_input(wk.dx + xo, ws.du + fo, expert_param(io, e, kUp), ne, s.C, s.DE, true);
  }
  k.combine_rows(ws.dh, wk.dx, st.position, nullptr, s.n, s.K, s.C, false);  // d normed input from experts
  // router: d combine weights (and the balance loss) → d logits, on the host
  std::vector<float> dweight(size_t(s.n) * s.K), dlogits(size_t(s.n) * s.E);
  k.download(dweight.data(), wk.dweight, dweight.size() * f);
  moe::router_backward(s.router, r, dweight.data(), d.moe_aux_loss_coef * double(io.loss_scale) * s.T,
                       dlogits.data());
  k.upload(ws.dlogits, dlogits.data(), dlogits.size() * f);
  k.linear_backward_input(ws.dh, ws.dlogits, io.w[kRouter], s.n, s.C, s.E, true);  // + router path
  k.copy(io.din, io.dout, size_t(s.n) * s.C * f);                                 // residual path
  k.rmsnorm_backward_input(io.din, ws.dh, io.in, st.rstd, io.w[kMoeNorm], s.n, s.C, true);
}

void moe_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  MoeShape s(d, io.samples);
  MoeStash st(io.stash, s);
  MoeWStash ws(io.wstash, s);
  std::vector<int32_t> offsets(size_t(s.E) + 1);
  k.download(offsets.data(), st.offsets, offsets.size() * i32);
  for (int e = 0; e < s.E; ++e) {
    const int o = offsets[size_t(e)], ne = offsets[size_t(e) + 1] - o;
    const int p = kMoeExperts + 3 * e;
    float *gg = io.g[p + kGate], *gu = io.g[p + kUp], *gd = io.g[p + kDown];
    if (ne == 0) {  // no tokens: zero gradient (written when this is the first writer of the step)
      if (!io.accumulate(p + kGate)) k.fill(gg, 0.f, size_t(s.DE) * s.C);
      if (!io.accumulate(p + kUp)) k.fill(gu, 0.f, size_t(s.DE) * s.C);
      if (!io.accumulate(p + kDown)) k.fill(gd, 0.f, size_t(s.C) * s.DE);
      continue;
    }
    const int64_t xo = int64_t(o) * s.C, fo = int64_t(o) * s.DE;
    k.linear_backward_weight(gd, nullptr, ws.dy + xo, st.a + fo, ne, s.DE, s.C, io.accumulate(p + kDown));
    k.linear_backward_weight(gg, nullptr, ws.dg + fo, st.x + xo, ne, s.C, s.DE, io.accumulate(p + kGate));
    k.linear_backward_weight(gu, nullptr, ws.du + fo, st.x + xo, ne, s.C, s.DE, io.accumulate(p + kUp));
  }
  k.linear_backward_weight(io.g[kRouter], nullptr, ws.dlogits, st.h, s.n, s.C, s.E, io.accumulate(kRouter));
  k.rmsnorm_backward_weight(io.g[kMoeNorm], ws.dh, io.in, st.rstd, s.n, s.C, io.accumulate(kMoeNorm));
}

}  // namespace

const SegmentType& moe_type() {
  static const SegmentType t{"qwen3.moe", DataSlot::None, true, false, moe_sizes, moe_forward, moe_backward_input,
                             moe_backward_weight, nullptr, nullptr, true};
  return t;
}

}  // namespace piper::qwen3
