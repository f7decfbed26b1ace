// Qwen3 mixture-of-experts MLP half of a layer, x + Σ_k w_k · expert_k(norm x), as three segments so that
// an exchange can sit between them: dispatch (norm, router, routing kernels, the routed rows in expert order),
// experts (each expert's SwiGLU on its rows) and combine (weights and residual). Routing runs on the device; the
// experts learn their row counts from SegmentIO::counts, which the plan brings to the host. In a bf16 run the routed
// rows, both ways (inputs and outputs of the experts, and their gradients), are bf16: half the bytes exchanged.
// Shapes: n = b·T tokens, C d_model, E experts, K top_k, DE d_expert, A = worst-case kept assignments.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ragged_rows.hpp"
#include "model/act_output.hpp"
#include "model/qwen3/qwen3_segments.hpp"
#include "model/stash_carver.hpp"
#include "util/error.hpp"

namespace piper::qwen3 {

namespace {

const size_t f = sizeof(float), i32 = sizeof(int32_t);

struct MoeShape {
  int b, T, n, C, E, K, DE, A;
  int S;         // the shared experts' summed width (0: none)
  int capacity;  // kept assignments per sequence and expert: ⌈factor · T · K / E⌉, or T · K when dropless
  bool norm_topk;
  float eps;
  // The routed rows as bf16 (a bf16 run's, C even): the experts' inputs and the gradients of their outputs are read
  // by matmuls alone, which round them anyway; their outputs and the gradients of their inputs are rounded.
  bool bf16_rows;
  int row_words;  // 4-byte words of a routed row, the exchange's unit (backend/ragged_rows.hpp): C, or C/2 in bf16
  bool bf16;      // the activations only matmuls read are bf16 (ModelDims::bf16_matmul_inputs)
  MoeShape(const ModelDims& d, int samples)
      : b(samples), T(d.seq_len), n(samples * d.seq_len), C(d.d_model), E(d.moe_experts), K(d.moe_top_k),
        DE(d.moe_d_expert), S(moe_shared_width(d)), norm_topk(d.moe_norm_topk_prob), eps(float(d.norm_eps)),
        bf16_rows(d.bf16_matmul_inputs && d.d_model % 2 == 0), row_words(bf16_rows ? C / 2 : C),
        bf16(d.bf16_matmul_inputs) {
    const double factor = d.moe_capacity_factor;
    capacity = factor <= 0 ? T * K : int(std::ceil(factor * double(T) * double(K) / double(E)));
    // worst case: every assignment kept (dropless), or every expert full in every sequence
    A = std::min(n * K, b * E * capacity);
  }
  // Routed rows at `rows` (a RaggedRows view's) at their width.
  Act routed(float* rows) const { return Act(rows, bf16_rows); }
  ConstAct routed(const float* rows) const { return ConstAct(rows, bf16_rows); }
};

// The dispatch stash, shared with the combine (its link): forward → backward state of the routing, the
// input kept for the residual, and the slots the combine's backward fills for the dispatch's.
struct DispatchStash {
  float *x, *h, *rstd, *probs, *weight, *token_weight, *fraction, *dweight, *dresidual, *dshared;
  int32_t *selected, *position, *token, *counts;
  size_t bytes;
  DispatchStash(void* p, const MoeShape& s) {
    StashCarver c(p);
    x = c.keep<float>(int64_t(s.n) * s.C);             // input, for the combine's residual (n,C)
    h = c.keep<float>(int64_t(s.n) * s.C);             // normed input (n,C)
    rstd = c.keep<float>(s.n);                          // (n)
    probs = c.keep<float>(int64_t(s.n) * s.E);          // (n,E); the router logits until routed
    selected = c.keep<int32_t>(int64_t(s.n) * s.K);     // (n,K)
    weight = c.keep<float>(int64_t(s.n) * s.K);         // (n,K)
    position = c.keep<int32_t>(int64_t(s.n) * s.K);     // (n,K), -1 dropped
    token = c.keep<int32_t>(s.A);                       // (A) token of each kept assignment, expert-ordered; -1 after
    token_weight = c.keep<float>(s.A);                  // (A)
    counts = c.keep<int32_t>(s.E);                      // (E) kept assignments per expert
    fraction = c.keep<float>(int64_t(s.b) * s.E);       // (b,E)
    dweight = c.keep<float>(int64_t(s.n) * s.K);        // from the combine's backward: d combine weights (n,K)
    dresidual = c.keep<float>(int64_t(s.n) * s.C);      // from the combine's backward: d output (n,C)
    dshared = c.keep<float>(s.S > 0 ? int64_t(s.n) * s.C : 0);  // from it too: d normed input, shared path (n,C)
    bytes = c.bytes();
  }
};

struct DispatchWStash {
  float *dlogits, *dh;
  size_t bytes;
  DispatchWStash(void* p, const MoeShape& s) {
    StashCarver c(p);
    dlogits = c.keep<float>(int64_t(s.n) * s.E);  // (n,E)
    dh = c.keep<float>(int64_t(s.n) * s.C);       // d normed input (n,C)
    bytes = c.bytes();
  }
};

// Rank `shard` of a tensor-parallel group of `shards` routes its share of the microbatch: sequences
// [shard·b/k, (shard+1)·b/k), token rows from row0. Its input and output are the whole microbatch's (n,C) — the
// output is partial: its rows, zeros elsewhere, summed over the group — and the routed rows are its share's alone.
struct SampleShare {
  int samples;
  int64_t row0;
  SampleShare(const ModelDims& d, int samples_, int shards, int shard)
      : samples(samples_ / shards), row0(int64_t(shard) * (samples_ / shards) * d.seq_len) {}
};

// The weight of the balance loss, Σ_q Σ_e f·P, in the training loss: aux_loss_coef / sequences of the global batch
// (loss_scale is 1 / its tokens); the forward and the router's backward use the same.
double balance_scale(const ModelDims& d, const SegmentIO& io, const MoeShape& s) {
  return d.moe_aux_loss_coef * double(io.loss_scale) * s.T;
}

// ---------------------------------------------------------------- dispatch: x(n,C) → rows for the experts
SegmentSizes dispatch_sizes(const Segment& seg, const ModelDims& d, int samples) {
  MoeShape s(d, samples / std::max(1, seg.shards));
  SegmentSizes z;
  z.input_bytes = size_t(samples) * s.T * s.C * f;  // the whole microbatch (n,C)
  z.out_bytes = RaggedRows::bytes(s.E, s.A, s.row_words);  // counts per expert, then the rows in expert order
  z.stash_bytes = DispatchStash(nullptr, s).bytes;
  z.wstash_bytes = DispatchWStash(nullptr, s).bytes;
  z.workspace_bytes = z.wstash_bytes;
  return z;
}

void dispatch_forward(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  const SampleShare share(d, io.samples, io.shards, io.shard);
  MoeShape s(d, share.samples);
  DispatchStash st(io.stash, s);
  const float* x = io.in + share.row0 * s.C;                          // this rank's tokens (n,C)
  k.copy(st.x, x, size_t(s.n) * s.C * f);
  k.rmsnorm_forward(st.h, st.rstd, x, io.w[kMoeNorm], s.n, s.C, s.eps);  // (n,C)
  k.linear_forward(st.probs, st.h, io.w[kRouter], nullptr, s.n, s.C, s.E);   // router logits (n,E)
  const float* bias = seg.params.size() > kRouterBias ? io.w[kRouterBias] : nullptr;  // the selection bias (E)
  k.moe_route(st.probs, st.selected, st.weight, st.probs, bias, s.n, s.E, s.K, s.norm_topk);
  // kept assignments in expert order; loads (before capacity) and dropped ones into the statistics block
  k.moe_assign(st.position, st.counts, st.token, st.token_weight, st.fraction, io.routing, st.selected, st.weight,
               s.n, s.T, s.E, s.K, s.capacity, s.A);
  if (io.balance_loss && d.moe_aux_loss_coef != 0)
    k.moe_balance_loss(io.balance_loss, st.fraction, st.probs, s.n, s.T, s.E, balance_scale(d, io, s));
  RaggedRows out(io.out, s.E);
  k.copy(out.counts, st.counts, size_t(s.E) * i32);
  k.gather_rows(s.routed(out.rows), st.h, st.token, nullptr, s.A, s.C);  // (A,C), expert-ordered, zeros after the kept
}

void dispatch_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const SampleShare share(d, io.samples, io.shards, io.shard);
  MoeShape s(d, share.samples);
  DispatchStash st(io.stash, s);
  DispatchWStash ws(io.wstash, s);
  RaggedRows dx(io.dout, s.E);  // d expert inputs, expert-ordered
  k.combine_rows(ws.dh, s.routed(dx.rows), st.position, nullptr, s.n, s.K, s.C, false);  // d normed input from experts
  if (s.S > 0) k.accumulate(ws.dh, st.dshared, size_t(s.n) * s.C);             // + from the shared experts
  // router: d combine weights (from the combine) and the balance loss → d logits
  k.moe_router_backward(ws.dlogits, st.probs, st.selected, st.weight, st.fraction, st.dweight, s.n, s.T, s.E, s.K,
                        s.norm_topk, balance_scale(d, io, s));
  k.linear_backward_input(ws.dh, ws.dlogits, io.w[kRouter], s.n, s.C, s.E, true);  // + router path
  if (io.shards > 1) k.fill(io.din, 0.f, size_t(io.samples) * s.T * s.C);           // other ranks' rows
  float* din = io.din + share.row0 * s.C;
  k.copy(din, st.dresidual, size_t(s.n) * s.C * f);                                 // residual path
  k.rmsnorm_backward_input(din, ws.dh, st.x, st.rstd, io.w[kMoeNorm], s.n, s.C, true);
}

void dispatch_backward_weight(Kernels& k, const Segment& seg, const ModelDims& d, const SegmentIO& io) {
  MoeShape s(d, SampleShare(d, io.samples, io.shards, io.shard).samples);
  DispatchStash st(io.stash, s);
  DispatchWStash ws(io.wstash, s);
  // the selection bias is not trained: its gradient is zero (written, so that no buffer keeps another value)
  if (seg.params.size() > kRouterBias && !io.accumulate(kRouterBias)) k.fill(io.g[kRouterBias], 0.f, size_t(s.E));
  k.linear_backward_weight(io.g[kRouter], nullptr, ws.dlogits, st.h, s.n, s.C, s.E, io.accumulate(kRouter));
  k.rmsnorm_backward_weight(io.g[kMoeNorm], ws.dh, st.x, st.rstd, s.n, s.C, io.accumulate(kMoeNorm));
}

// ---------------------------------------------------------------- experts: rows → SwiGLU of their expert
// Input and output: counts of (source rank, local expert) parts, then the rows of each part in that order.
// With one shard the parts are the E experts; with S shards this rank holds experts [shard·E/S, +E/S) and
// receives from each of the S ranks its rows for them.
// Rows received, worst case: from each of the S ranks, all its assignments, or with a capacity at most that
// capacity for each of its sequences and each of this rank's experts.
struct ExpertsShape : MoeShape {
  int shards, local, parts, rows;
  ExpertsShape(const ModelDims& d, int samples, int shards_)
      : MoeShape(d, samples), shards(shards_), local(d.moe_experts / shards_), parts(d.moe_experts),
        rows(shards_ * std::min(A, b * local * capacity)) {}
};

// A SwiGLU over (rows, width) — the routed experts' rows, or every token through the shared experts:
// forward → backward, the gate and up projections (kept by selective recompute) and silu(g)·u (recomputed),
// (rows,width) each. With `bf16` (the routed experts of a bf16 run) all three are bf16 activations: a is read by
// the down product alone, g and u by SwiGLU and its backward as a held stash would give them back; otherwise fp32.
struct SwigluStash {
  Act g, u, a;
  size_t bytes, kept_bytes;
  SwigluStash(StashParts p, int64_t rows, int width, bool bf16 = false) {
    StashCarver c(p);
    g = c.keep_act(rows * width, bf16);
    u = c.keep_act(rows * width, bf16);
    c.tail_act(a, rows * width, bf16);
    c.finish();
    bytes = c.bytes();
    kept_bytes = c.kept_bytes;
  }
  SwigluStash(void* p, int64_t rows, int width) : SwigluStash(StashParts::of(p), rows, width) {}
};

// Its backward input → backward weight: d g and d u (rows,width) each, read by products alone (bf16 with `bf16`).
struct SwigluWStash {
  Act dg, du;
  size_t bytes;
  SwigluWStash(void* p, int64_t rows, int width, bool bf16 = false) {
    StashCarver c(p);
    dg = c.keep_act(rows * width, bf16);
    du = c.keep_act(rows * width, bf16);
    bytes = c.bytes();
  }
};

// The parts of a received buffer: first row and count of each, and the global expert it belongs to, from the
// counts the host knows (SegmentIO::counts).
struct Part {
  int expert, first, count;
};
std::vector<Part> parts_of(const ExpertsShape& s, const SegmentIO& io) {
  PIPER_CHECK(io.counts, "segment of experts without its row counts on the host");
  std::vector<Part> parts;
  int at = 0;
  for (int p = 0; p < s.parts; ++p) {
    parts.push_back({io.shard * s.local + p % s.local, at, io.counts[p]});
    at += io.counts[p];
  }
  return parts;
}

const float* expert_param(const SegmentIO& io, int e, int which) { return io.w[3 * e + which]; }
enum { kGate, kUp, kDown };

SegmentSizes experts_sizes(const Segment& seg, const ModelDims& d, int samples) {
  ExpertsShape s(d, samples, std::max(1, seg.shards));
  SegmentSizes z;
  z.input_bytes = z.out_bytes = RaggedRows::bytes(s.parts, s.rows, s.row_words);
  const SwigluStash st(StashParts{}, s.rows, s.DE, s.bf16);
  z.stash_bytes = st.bytes;
  z.stash_kept_bytes = st.kept_bytes;
  z.wstash_bytes = SwigluWStash(nullptr, s.rows, s.DE, s.bf16).bytes;
  // + d(silu(g)·u) (backward), or in bf16 the fp32 products g, then u, before their rounding (forward); with bf16
  // rows also the fp32 sums before their rounding: outputs (forward), d inputs (backward)
  z.workspace_bytes = z.wstash_bytes + size_t(s.rows) * s.DE * f + (s.bf16_rows ? size_t(s.rows) * s.C * f : 0);
  z.ragged_parts = s.parts;
  z.ragged_width = s.row_words;
  return z;
}

// Routed rows (rows,C) of fp32 sums: the ragged buffer's rows themselves, or with bf16 rows the workspace after
// `skip` floats, rounded into them once complete (finish).
struct RowSums {
  float *rows, *sums;
  int C;
  RowSums(float* rows_, float* workspace, size_t skip, const ExpertsShape& s)
      : rows(rows_), sums(s.bf16_rows ? workspace + skip : rows_), C(s.C) {}
  void finish(Kernels& k, int count) const {  // the first `count` rows complete
    if (sums != rows) k.to_bf16(reinterpret_cast<uint16_t*>(rows), sums, size_t(count) * C);
  }
};

// Every expert's matmuls of one kind go to the backend as one grouped call (parts are independent products);
// SwiGLU and its backward run once over all rows, which the parts fill contiguously from row 0.
void experts_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  ExpertsShape s(d, io.samples, io.shards);
  SwigluStash st(StashParts::of(io), s.rows, s.DE, s.bf16);
  RaggedRows in(io.in, s.parts), out(io.out, s.parts);
  const RowSums y(out.rows, io.workspace, 0, s);  // the outputs (rows,C)
  // bf16: g, then u, as fp32 products after the outputs' sums (rows,DE), each rounded into the stash
  float* room = io.workspace + (s.bf16_rows ? size_t(s.rows) * s.C : 0);
  float *g = fp32_room(st.g, room), *u = fp32_room(st.u, room);
  k.copy(out.counts, in.counts, size_t(s.parts) * i32);
  std::vector<LinearGroup> gate, up, down;
  int rows = 0;
  for (const Part& p : parts_of(s, io)) {
    if (p.count == 0) continue;
    const int64_t xo = int64_t(p.first) * s.C, fo = int64_t(p.first) * s.DE;
    const ConstAct x = s.routed(in.rows).at(xo);  // (count,C)
    gate.push_back({g + fo, x, expert_param(io, p.expert, kGate), p.count, s.C, s.DE, false});  // (count,DE)
    up.push_back({u + fo, x, expert_param(io, p.expert, kUp), p.count, s.C, s.DE, false});      // (count,DE)
    down.push_back({y.sums + xo, st.a.at(fo), expert_param(io, p.expert, kDown), p.count, s.DE, s.C, false});
    rows = p.first + p.count;
  }
  if (st.g.bf16) {  // one projection at a time through the room
    k.linear_forward_grouped(gate.data(), int(gate.size()));
    settle(k, st.g, room, size_t(rows) * s.DE);
    k.linear_forward_grouped(up.data(), int(up.size()));
    settle(k, st.u, room, size_t(rows) * s.DE);
  } else {
    gate.insert(gate.end(), up.begin(), up.end());
    k.linear_forward_grouped(gate.data(), int(gate.size()));
  }
  k.swiglu_forward(st.a, st.g, st.u, size_t(rows) * s.DE);  // (rows,DE)
  k.linear_forward_grouped(down.data(), int(down.size()));  // (count,C) per part
  y.finish(k, rows);
}

// silu(g)·u over the rows received, from the kept projections: what selective recompute redoes.
void experts_rerun_tail(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  ExpertsShape s(d, io.samples, io.shards);
  SwigluStash st(StashParts::of(io), s.rows, s.DE, s.bf16);
  int rows = 0;
  for (const Part& p : parts_of(s, io)) rows = p.first + p.count;
  k.swiglu_forward(st.a, st.g, st.u, size_t(rows) * s.DE);  // (rows,DE)
}

void experts_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  ExpertsShape s(d, io.samples, io.shards);
  SwigluStash st(StashParts::of(io), s.rows, s.DE, s.bf16);
  SwigluWStash ws(io.wstash, s.rows, s.DE, s.bf16);
  float* da = io.workspace;  // (rows,DE)
  RaggedRows dy(io.dout, s.parts), dx(io.din, s.parts);
  const RowSums dx_sums(dx.rows, io.workspace, size_t(s.rows) * s.DE, s);  // d inputs (rows,C), after da
  k.copy(dx.counts, dy.counts, size_t(s.parts) * i32);
  std::vector<LinearGroup> down, gate, up;
  int rows = 0;
  for (const Part& p : parts_of(s, io)) {
    if (p.count == 0) continue;
    const int64_t xo = int64_t(p.first) * s.C, fo = int64_t(p.first) * s.DE;
    float* dxp = dx_sums.sums + xo;  // (count,C)
    down.push_back({da + fo, s.routed(dy.rows).at(xo), expert_param(io, p.expert, kDown), p.count, s.DE, s.C, false});
    gate.push_back({dxp, ws.dg.at(fo), expert_param(io, p.expert, kGate), p.count, s.C, s.DE, false});
    up.push_back({dxp, ws.du.at(fo), expert_param(io, p.expert, kUp), p.count, s.C, s.DE, true});
    rows = p.first + p.count;
  }
  k.linear_backward_input_grouped(down.data(), int(down.size()));         // da (count,DE) per part
  k.swiglu_backward(ws.dg, ws.du, da, st.g, st.u, size_t(rows) * s.DE);  // (rows,DE)
  gate.insert(gate.end(), up.begin(), up.end());  // each part's dx: the gate's product, then the up's added
  k.linear_backward_input_grouped(gate.data(), int(gate.size()));         // dx (count,C) per part
  dx_sums.finish(k, rows);
}

void experts_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  ExpertsShape s(d, io.samples, io.shards);
  SwigluStash st(StashParts::of(io), s.rows, s.DE, s.bf16);
  SwigluWStash ws(io.wstash, s.rows, s.DE, s.bf16);
  RaggedRows in(io.in, s.parts), dy(io.dout, s.parts);
  std::vector<bool> written(size_t(s.E), false);  // this call has written expert e's gradients
  std::vector<LinearGroup> products;  // parts of one expert (one per source rank) add into its gradients in order
  for (const Part& p : parts_of(s, io)) {
    if (p.count == 0) continue;
    const int i = 3 * p.expert;
    const int64_t xo = int64_t(p.first) * s.C, fo = int64_t(p.first) * s.DE;
    const bool add = written[size_t(p.expert)] || io.accumulate(i);
    const ConstAct x = s.routed(in.rows).at(xo), dyp = s.routed(dy.rows).at(xo);  // (count,C) each
    products.push_back({io.g[i + kDown], dyp, st.a.at(fo), p.count, s.DE, s.C, add});   // (C,DE)
    products.push_back({io.g[i + kGate], ws.dg.at(fo), x, p.count, s.C, s.DE, add});   // (DE,C)
    products.push_back({io.g[i + kUp], ws.du.at(fo), x, p.count, s.C, s.DE, add});     // (DE,C)
    written[size_t(p.expert)] = true;
  }
  k.linear_backward_weight_grouped(products.data(), int(products.size()));
  for (int e = io.shard * s.local; e < (io.shard + 1) * s.local; ++e) {  // experts without tokens
    const int i = 3 * e;
    if (written[size_t(e)] || io.accumulate(i)) continue;
    k.fill(io.g[i + kGate], 0.f, size_t(s.DE) * s.C);
    k.fill(io.g[i + kUp], 0.f, size_t(s.DE) * s.C);
    k.fill(io.g[i + kDown], 0.f, size_t(s.C) * s.DE);
  }
}

// ---------------------------------------------------------------- combine: expert outputs → x + Σ_k w_k y_k
// With shared experts also + SwiGLU_shared(h), h the dispatch's normed input: a = silu(h·Wgᵀ)·(h·Wuᵀ) (n,S), a·Wdᵀ.
SegmentSizes combine_sizes(const Segment& seg, const ModelDims& d, int samples) {
  MoeShape s(d, samples / std::max(1, seg.shards));
  SegmentSizes z;
  z.input_bytes = RaggedRows::bytes(s.E, s.A, s.row_words);  // the experts' outputs back in the dispatch's order
  z.out_bytes = size_t(samples) * s.T * s.C * f;      // the whole microbatch (n,C)
  if (s.S > 0) {
    z.stash_bytes = SwigluStash(nullptr, s.n, s.S).bytes;
    z.wstash_bytes = SwigluWStash(nullptr, s.n, s.S).bytes;
    z.workspace_bytes = z.wstash_bytes + size_t(s.n) * s.S * f;  // (a fused backward's wstash first) + d a (n,S)
  }
  return z;
}

void combine_forward(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const SampleShare share(d, io.samples, io.shards, io.shard);
  MoeShape s(d, share.samples);
  DispatchStash link(io.link, s);
  RaggedRows y(io.in, s.E);
  if (io.shards > 1) k.fill(io.out, 0.f, size_t(io.samples) * s.T * s.C);  // other ranks' rows
  float* out = io.out + share.row0 * s.C;                                  // this rank's (n,C)
  if (s.S > 0) {  // out = SwiGLU_shared(h), then the residual and the routed experts are added
    SwigluStash st(io.stash, s.n, s.S);
    k.linear_forward(st.g.f32(), link.h, io.w[kSharedGate], nullptr, s.n, s.C, s.S);  // (n,S), fp32
    k.linear_forward(st.u.f32(), link.h, io.w[kSharedUp], nullptr, s.n, s.C, s.S);    // (n,S), fp32
    k.swiglu_forward(st.a, st.g, st.u, size_t(s.n) * s.S);
    k.linear_forward(out, st.a, io.w[kSharedDown], nullptr, s.n, s.S, s.C);     // (n,C)
    k.accumulate(out, link.x, size_t(s.n) * s.C);                              // + residual
  } else {
    k.copy(out, link.x, size_t(s.n) * s.C * f);  // residual
  }
  k.combine_rows(out, s.routed(y.rows), link.position, link.weight, s.n, s.K, s.C, true);  // + Σ_k w_k · y
}

void combine_backward_input(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const SampleShare share(d, io.samples, io.shards, io.shard);
  MoeShape s(d, share.samples);
  const float* dout = io.dout + share.row0 * s.C;  // this rank's rows (n,C)
  DispatchStash link(io.link, s);
  RaggedRows y(io.in, s.E), dy(io.din, s.E);
  k.copy(dy.counts, link.counts, size_t(s.E) * i32);                                // the dispatch's counts
  k.gather_rows(s.routed(dy.rows), dout, link.token, link.token_weight, s.A, s.C);  // w · dout (A,C), 0 after the kept
  k.rows_dot(link.dweight, dout, s.routed(y.rows), link.position, s.n, s.K, s.C);      // d weights (n,K)
  k.copy(link.dresidual, dout, size_t(s.n) * s.C * f);                                    // residual
  if (s.S > 0) {  // shared experts: d h into the dispatch's stash, d g and d u for the weights
    SwigluStash st(io.stash, s.n, s.S);
    SwigluWStash ws(io.wstash, s.n, s.S);
    float* da = io.workspace;                                                                  // (n,S)
    k.linear_backward_input(da, dout, io.w[kSharedDown], s.n, s.S, s.C, false);
    k.swiglu_backward(ws.dg, ws.du, da, st.g, st.u, size_t(s.n) * s.S);
    k.linear_backward_input(link.dshared, ws.dg, io.w[kSharedGate], s.n, s.C, s.S, false);
    k.linear_backward_input(link.dshared, ws.du, io.w[kSharedUp], s.n, s.C, s.S, true);
  }
}

void combine_backward_weight(Kernels& k, const Segment&, const ModelDims& d, const SegmentIO& io) {
  const SampleShare share(d, io.samples, io.shards, io.shard);
  MoeShape s(d, share.samples);
  if (s.S == 0) return;
  DispatchStash link(io.link, s);
  SwigluStash st(io.stash, s.n, s.S);
  SwigluWStash ws(io.wstash, s.n, s.S);
  k.linear_backward_weight(io.g[kSharedDown], nullptr, io.dout + share.row0 * s.C, st.a, s.n, s.S, s.C,
                           io.accumulate(kSharedDown));
  k.linear_backward_weight(io.g[kSharedGate], nullptr, ws.dg, link.h, s.n, s.C, s.S, io.accumulate(kSharedGate));
  k.linear_backward_weight(io.g[kSharedUp], nullptr, ws.du, link.h, s.n, s.C, s.S, io.accumulate(kSharedUp));
}

// Auxiliary-loss-free balancing (DeepSeek-V3): an expert loaded below the mean gets its selection bias raised
// by the rate, one above lowered; loads are the global batch's (RoutingStats: E loads, then dropped).
void bias_step(const ModelDims& d, const double* routing, float* delta) {
  const int E = d.moe_experts;
  double mean = 0;
  for (int e = 0; e < E; ++e) mean += routing[e] / E;
  const float rate = float(moe_bias_update_rate(d));
  for (int e = 0; e < E; ++e) delta[e] = routing[e] < mean ? rate : (routing[e] > mean ? -rate : 0.f);
}

// Over a tensor-parallel group the dispatch and combine hold their parameters whole and work on their share of
// the samples (SampleShare): every gradient is partial.
ParamSplit copied(const ModelDims&, int, int) { return ParamSplit::copy(); }

}  // namespace

const SegmentType& moe_dispatch_type() {
  static const SegmentType t{.name = "qwen3.moe_dispatch", .sizes = dispatch_sizes, .forward = dispatch_forward,
                             .backward_input = dispatch_backward_input, .backward_weight = dispatch_backward_weight,
                             .adds_balance_loss = true, .tp_split = copied,
                             .tp_output = SegmentType::TpOutput::Own, .tp_splits_samples = true,
                             .routed_experts = [](const ModelDims& d) { return d.moe_experts; },
                             .statistics_step = bias_step};
  return t;
}

const SegmentType& moe_experts_type() {
  static const SegmentType t{.name = "qwen3.moe_experts", .sizes = experts_sizes, .forward = experts_forward,
                             .backward_input = experts_backward_input, .backward_weight = experts_backward_weight,
                             .rerun_tail = experts_rerun_tail,
                             .shard_units = [](const ModelDims& d) { return d.moe_experts; }};
  return t;
}

const SegmentType& moe_combine_type() {
  static const SegmentType t{.name = "qwen3.moe_combine", .sizes = combine_sizes, .forward = combine_forward,
                             .backward_input = combine_backward_input, .backward_weight = combine_backward_weight,
                             .link_offset = -2, .tp_split = copied, .tp_input_grad_partial = false,
                             .tp_splits_samples = true};
  return t;
}

}  // namespace piper::qwen3
