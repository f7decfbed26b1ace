// Causal grouped-query attention (GPT-2's multi-head one: KV = H) of a bf16 run's matmul precision on tensor cores,
// flash style: q, k, v (fp32 rounded, or bf16 activations as they are) and dy rounded to bf16 into shared memory,
// every product nvcuda::wmma 16×16×16 with fp32 accumulators; softmax and its statistics in fp32. q (and dq) rows
// are qstride elements apart, k and v (and dk, dv) kstride apart; y and dy are packed (H·D).
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;                // warps per block; each owns 16 of the block's rows
constexpr int kBlockRows = 16 * kWarps;  // 64: query rows (forward, dq) or key rows (dk, dv) of a block
constexpr int kKeyTile = 64;             // keys per shared-memory tile (forward, dq); = kBlockRows, see below
constexpr int kQueryTile = 32;           // queries per tile (dk, dv)
constexpr int kMaxD = 128;               // head dimensions up to this, padded with zeros to a multiple of 16
constexpr int kPad16 = 8;                // bf16 row padding in elements (wmma's ldm: a multiple of 8)
constexpr int kPad32 = 4;                // fp32 row padding in elements (wmma's ldm: a multiple of 4)
static_assert(kKeyTile == kBlockRows, "every valid query row of a block sees the first key of each of its tiles");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;   // B(k,n) at [k·ld + n]
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B(k,n) at [n·ld + k]: Xᵀ
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Offset of one (sequence, head) in x(B,T,heads,D) whose rows are `stride` elements apart (heads · D packed): row i
// of it is at + i · stride.
__device__ inline int64_t head_offset(int b, int head, int T, int64_t stride, int D) {
  return int64_t(b) * T * stride + int64_t(head) * D;
}

// The head dimension D padded with zero columns to a multiple of 16, the k of the wmma products.
__host__ __device__ inline int padded(int D) { return (D + 15) / 16 * 16; }

// One warp: out1(16, 16·tiles) = A1(16, Dp) · B1(16·tiles, Dp)ᵀ and out2 = A2 · B2ᵀ alike (the two products the
// backward passes make of each tile), wmma 16×16×16 with fp32 accumulators. A and B are bf16 rows of stride ldh;
// the outputs fp32, row-major with stride ldo.
__device__ inline void two_products_abt(float* out1, float* out2, const bf16* a1, const bf16* b1, const bf16* a2,
                                        const bf16* b2, int ldh, int ldo, int Dp, int tiles) {
  for (int n = 0; n < tiles; ++n) {
    FragC acc1, acc2;
    wmma::fill_fragment(acc1, 0.f);
    wmma::fill_fragment(acc2, 0.f);
    for (int kk = 0; kk < Dp; kk += 16) {
      FragA a;
      FragBt bt;
      wmma::load_matrix_sync(a, a1 + kk, ldh);
      wmma::load_matrix_sync(bt, b1 + n * 16 * ldh + kk, ldh);
      wmma::mma_sync(acc1, a, bt, acc1);
      wmma::load_matrix_sync(a, a2 + kk, ldh);
      wmma::load_matrix_sync(bt, b2 + n * 16 * ldh + kk, ldh);
      wmma::mma_sync(acc2, a, bt, acc2);
    }
    wmma::store_matrix_sync(out1 + n * 16, acc1, ldo, wmma::mem_row_major);
    wmma::store_matrix_sync(out2 + n * 16, acc2, ldo, wmma::mem_row_major);
  }
}

// An element as a bf16 operand: fp32 rounded to nearest even, bf16 as it is.
__device__ inline bf16 as_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ inline bf16 as_bf16(bf16 x) { return x; }

// dst(n, ld) bf16, Dp = padded(D) columns = rows [r0, r0 + n) of a (T, D) view (fp32 or bf16) with row stride
// `stride`, fp32 rounded to nearest even; rows past T and columns past D are zero. The whole block copies.
template <typename In>
__device__ inline void load_rows_bf16(bf16* dst, int ld, const In* src, int64_t stride, int r0, int n, int T, int D) {
  const int Dp = padded(D);
  for (int e = threadIdx.x; e < n * Dp; e += blockDim.x) {
    const int r = e / Dp, c = e % Dp;
    dst[r * ld + c] = r0 + r < T && c < D ? as_bf16(src[int64_t(r0 + r) * stride + c]) : __float2bfloat16_rn(0.f);
  }
}

// dst(n, ld) = 0 over Dp columns
__device__ inline void zero_rows(float* dst, int ld, int n, int Dp) {
  for (int e = threadIdx.x; e < n * Dp; e += blockDim.x) dst[(e / Dp) * ld + e % Dp] = 0.f;
}

// Shared memory of the kernels, carved in order, each piece 128-byte aligned (wmma wants 32-byte aligned tiles:
// rows and columns at multiples of 16 of a piece keep that).
struct Carver {
  size_t bytes = 0;
  __host__ __device__ size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n + 127) / 128 * 128;
    return at;
  }
};

// The forward's shared memory for head dimension D (Dp columns).
struct ForwardSmem {
  size_t q, k, v, s, p, o;
  size_t bytes;
  __host__ __device__ explicit ForwardSmem(int D) {
    const int Dp = padded(D);
    Carver c;
    q = c.take(sizeof(bf16) * kBlockRows * (Dp + kPad16));  // (64, Dp+8) query rows of the block
    k = c.take(sizeof(bf16) * kKeyTile * (Dp + kPad16));    // (64, Dp+8) keys of the tile
    v = c.take(sizeof(bf16) * kKeyTile * (Dp + kPad16));    // (64, Dp+8) values of the tile
    s = c.take(sizeof(float) * kBlockRows * (kKeyTile + kPad32));  // (64, 68) scores of the tile
    p = c.take(sizeof(bf16) * kBlockRows * (kKeyTile + kPad16));   // (64, 72) exp(s − running max), rounded
    o = c.take(sizeof(float) * kBlockRows * (Dp + kPad32));         // (64, Dp+4) output accumulators
    bytes = c.bytes;
  }
};

// Block (4 warps) per (64 query rows, head, sequence); warp w owns rows i0 + 16w + [0, 16). Key tiles
// [j0, j0 + 64), j0 ≤ the block's last row, as flash attention: S = Q Kᵀ (wmma), then row by row the fp32 running
// max m and sum l (each lane two keys), P̃ = exp(scale·s − m) rounded to bf16, O ← O·exp(m_old − m) + P̃ V (wmma).
// y(B,T,H,D) = O / l and lse(B,H,T) = m + log l, as gqa_forward_kernel's contract.
template <typename In>
__global__ void __launch_bounds__(kWarps * 32)
    gqa_forward_bf16_kernel(float* y, float* lse, const In* q, const In* k, const In* v, int T, int H, int KV, int D,
                            int64_t qstride, int64_t kstride, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ForwardSmem L(D);
  const int Dp = padded(D);  // the columns of the shared tiles, D and zeros
  const int ldh = Dp + kPad16, lds = kKeyTile + kPad32, ldp = kKeyTile + kPad16, ldo = Dp + kPad32;
  bf16* qs = reinterpret_cast<bf16*>(smem + L.q);
  bf16* ks = reinterpret_cast<bf16*>(smem + L.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + L.v);
  float* ss = reinterpret_cast<float*>(smem + L.s);
  bf16* ps = reinterpret_cast<bf16*>(smem + L.p);
  float* os = reinterpret_cast<float*>(smem + L.o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
  const int i0 = blockIdx.x * kBlockRows, r0 = warp * 16;  // the block's first row; the warp's first in the block
  const int64_t ystride = int64_t(H) * D;
  const In* kb = k + head_offset(b, kvh, T, kstride, D);
  const In* vb = v + head_offset(b, kvh, T, kstride, D);
  load_rows_bf16(qs, ldh, q + head_offset(b, h, T, qstride, D), qstride, i0, kBlockRows, T, D);
  zero_rows(os, ldo, kBlockRows, Dp);
  float m_run[16], l_run[16];  // the warp's rows: running max and sum (every lane holds them)
#pragma unroll
  for (int r = 0; r < 16; ++r) m_run[r] = -INFINITY, l_run[r] = 0.f;
  const int last = min(T - 1, i0 + kBlockRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (and Q, O are written)
    load_rows_bf16(ks, ldh, kb, kstride, j0, kKeyTile, T, D);
    load_rows_bf16(vs, ldh, vb, kstride, j0, kKeyTile, T, D);
    __syncthreads();
    if (i0 + r0 >= T) continue;  // uniform over the warp: none of its rows exists (no barrier below)
    // S_w(16, 64) = Q_w(16, D) · K_tile(64, D)ᵀ
    for (int n = 0; n < kKeyTile / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < Dp; kk += 16) {
        FragA a;
        FragBt bt;
        wmma::load_matrix_sync(a, qs + r0 * ldh + kk, ldh);
        wmma::load_matrix_sync(bt, ks + n * 16 * ldh + kk, ldh);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(ss + r0 * lds + n * 16, acc, lds, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {  // online softmax of row i; lane owns keys j0 + lane and j0 + lane + 32
      const int i = i0 + r0 + r;
      bf16* prow = ps + (r0 + r) * ldp;
      if (i >= T) {  // a row past the end (uniform over the warp): nothing to add
        prow[lane] = prow[lane + 32] = __float2bfloat16_rn(0.f);
        continue;
      }
      const float* srow = ss + (r0 + r) * lds;
      const bool see0 = j0 + lane <= i, see1 = j0 + lane + 32 <= i;  // causal; j ≤ i < T
      const float s0 = see0 ? srow[lane] * scale : -INFINITY;
      const float s1 = see1 ? srow[lane + 32] * scale : -INFINITY;
      const float m_new = fmaxf(m_run[r], warp_max(fmaxf(s0, s1)));  // finite: key j0 ≤ i0 ≤ i is seen
      const float p0 = see0 ? expf(s0 - m_new) : 0.f, p1 = see1 ? expf(s1 - m_new) : 0.f;
      const float corr = expf(m_run[r] - m_new);  // 0 on the first tile (m = −inf)
      l_run[r] = l_run[r] * corr + warp_sum(p0 + p1);
      m_run[r] = m_new;
      prow[lane] = __float2bfloat16_rn(p0);
      prow[lane + 32] = __float2bfloat16_rn(p1);
      float* orow = os + (r0 + r) * ldo;
      for (int c = lane; c < D; c += 32) orow[c] *= corr;
    }
    __syncwarp();
    // O_w(16, D) += P̃_w(16, 64) · V_tile(64, D)
    for (int n = 0; n < Dp / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, os + r0 * ldo + n * 16, ldo, wmma::mem_row_major);
      for (int kk = 0; kk < kKeyTile; kk += 16) {
        FragA a;
        FragB bv;
        wmma::load_matrix_sync(a, ps + r0 * ldp + kk, ldp);
        wmma::load_matrix_sync(bv, vs + kk * ldh + n * 16, ldh);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(os + r0 * ldo + n * 16, acc, ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (i0 + r0 >= T) return;
  float* yb = y + head_offset(b, h, T, ystride, D);
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int i = i0 + r0 + r;
    if (i < T) {
      const float inv = 1.0f / l_run[r];
      const float* orow = os + (r0 + r) * ldo;
      for (int c = lane; c < D; c += 32) yb[int64_t(i) * ystride + c] = orow[c] * inv;
      if (lane == 0) lse[(int64_t(b) * H + h) * T + i] = m_run[r] + logf(l_run[r]);
    }
  }
}

// The dq kernel's shared memory for head dimension D (Dp columns).
struct DqSmem {
  size_t q, g, k, v, s, dp, ds, acc;
  size_t bytes;
  __host__ __device__ explicit DqSmem(int D) {
    const int Dp = padded(D);
    Carver c;
    q = c.take(sizeof(bf16) * kBlockRows * (Dp + kPad16));  // (64, Dp+8) query rows of the block
    g = c.take(sizeof(bf16) * kBlockRows * (Dp + kPad16));  // (64, Dp+8) their dy rows
    k = c.take(sizeof(bf16) * kKeyTile * (Dp + kPad16));    // (64, Dp+8) keys of the tile
    v = c.take(sizeof(bf16) * kKeyTile * (Dp + kPad16));    // (64, Dp+8) values of the tile
    s = c.take(sizeof(float) * kBlockRows * (kKeyTile + kPad32));   // (64, 68) scores
    dp = c.take(sizeof(float) * kBlockRows * (kKeyTile + kPad32));  // (64, 68) dP = dy · vᵀ
    ds = c.take(sizeof(bf16) * kBlockRows * (kKeyTile + kPad16));   // (64, 72) dS rounded
    acc = c.take(sizeof(float) * kBlockRows * (Dp + kPad32));        // (64, Dp+4) dq accumulators
    bytes = c.bytes;
  }
};

// Like the forward: block per (64 query rows, head, sequence), warp per 16 rows, key tiles j0 ≤ the last row.
// S = Q Kᵀ and dP = dY Vᵀ (wmma); P = exp(scale·s − lse), dS = P (dP − drow) in fp32, rounded; dq += dS K (wmma).
// dq(B,T,H,D) = scale · the sum. Keys in tile order: deterministic.
template <typename In>
__global__ void __launch_bounds__(kWarps * 32)
    gqa_dq_bf16_kernel(float* dq, const float* dy, const In* q, const In* k, const In* v, const float* lse,
                       const float* drow, int T, int H, int KV, int D, int64_t qstride, int64_t kstride,
                       float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const DqSmem L(D);
  const int Dp = padded(D);  // the columns of the shared tiles, D and zeros
  const int ldh = Dp + kPad16, lds = kKeyTile + kPad32, ldd = kKeyTile + kPad16, lda = Dp + kPad32;
  bf16* qs = reinterpret_cast<bf16*>(smem + L.q);
  bf16* gs = reinterpret_cast<bf16*>(smem + L.g);
  bf16* ks = reinterpret_cast<bf16*>(smem + L.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + L.v);
  float* ss = reinterpret_cast<float*>(smem + L.s);
  float* dps = reinterpret_cast<float*>(smem + L.dp);
  bf16* dss = reinterpret_cast<bf16*>(smem + L.ds);
  float* accs = reinterpret_cast<float*>(smem + L.acc);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
  const int i0 = blockIdx.x * kBlockRows, r0 = warp * 16;
  const int64_t ystride = int64_t(H) * D;
  const int64_t qoff = head_offset(b, h, T, qstride, D), yoff = head_offset(b, h, T, ystride, D);
  const In* kb = k + head_offset(b, kvh, T, kstride, D);
  const In* vb = v + head_offset(b, kvh, T, kstride, D);
  load_rows_bf16(qs, ldh, q + qoff, qstride, i0, kBlockRows, T, D);
  load_rows_bf16(gs, ldh, dy + yoff, ystride, i0, kBlockRows, T, D);
  zero_rows(accs, lda, kBlockRows, Dp);
  const int64_t stat0 = (int64_t(b) * H + h) * T;  // (B,H,T) index of row 0
  float l_row[16], d_row[16];                      // lse and drow of the warp's rows
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int i = i0 + r0 + r;
    l_row[r] = i < T ? lse[stat0 + i] : 0.f;
    d_row[r] = i < T ? drow[stat0 + i] : 0.f;
  }
  const int last = min(T - 1, i0 + kBlockRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kKeyTile) {
    __syncthreads();
    load_rows_bf16(ks, ldh, kb, kstride, j0, kKeyTile, T, D);
    load_rows_bf16(vs, ldh, vb, kstride, j0, kKeyTile, T, D);
    __syncthreads();
    if (i0 + r0 >= T) continue;  // uniform over the warp; no barrier below
    // S_w(16, 64) = Q_w · K_tileᵀ; dP_w(16, 64) = dY_w · V_tileᵀ
    two_products_abt(ss + r0 * lds, dps + r0 * lds, qs + r0 * ldh, ks, gs + r0 * ldh, vs, ldh, lds, Dp,
                     kKeyTile / 16);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {  // lane owns keys j0 + lane and j0 + lane + 32 of row i
      const int i = i0 + r0 + r;
      for (int c = lane; c < kKeyTile; c += 32) {
        float ds = 0.f;
        if (i < T && j0 + c <= i) {
          const float p = expf(ss[(r0 + r) * lds + c] * scale - l_row[r]);
          ds = p * (dps[(r0 + r) * lds + c] - d_row[r]);
        }
        dss[(r0 + r) * ldd + c] = __float2bfloat16_rn(ds);
      }
    }
    __syncwarp();
    // dQ_w(16, D) += dS_w(16, 64) · K_tile(64, D)
    for (int n = 0; n < Dp / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, accs + r0 * lda + n * 16, lda, wmma::mem_row_major);
      for (int kk = 0; kk < kKeyTile; kk += 16) {
        FragA a;
        FragB bk;
        wmma::load_matrix_sync(a, dss + r0 * ldd + kk, ldd);
        wmma::load_matrix_sync(bk, ks + kk * ldh + n * 16, ldh);
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(accs + r0 * lda + n * 16, acc, lda, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (i0 + r0 >= T) return;
  for (int r = 0; r < 16; ++r) {
    const int i = i0 + r0 + r;
    if (i >= T) break;
    for (int c = lane; c < D; c += 32) dq[qoff + int64_t(i) * qstride + c] = accs[(r0 + r) * lda + c] * scale;
  }
}

// The dk/dv kernel's shared memory for head dimension D (Dp columns).
struct DkdvSmem {
  size_t k, v, q, g, st, dpt, pt, dst, dk, dv, lse, drow;
  size_t bytes;
  __host__ __device__ explicit DkdvSmem(int D) {
    const int Dp = padded(D);
    Carver c;
    k = c.take(sizeof(bf16) * kBlockRows * (Dp + kPad16));  // (64, Dp+8) key rows of the block
    v = c.take(sizeof(bf16) * kBlockRows * (Dp + kPad16));  // (64, Dp+8) their value rows
    q = c.take(sizeof(bf16) * kQueryTile * (Dp + kPad16));  // (32, Dp+8) query rows of the tile
    g = c.take(sizeof(bf16) * kQueryTile * (Dp + kPad16));  // (32, Dp+8) their dy rows
    st = c.take(sizeof(float) * kBlockRows * (kQueryTile + kPad32));   // (64, 36) Sᵀ: keys × queries
    dpt = c.take(sizeof(float) * kBlockRows * (kQueryTile + kPad32));  // (64, 36) dPᵀ = v · dyᵀ
    pt = c.take(sizeof(bf16) * kBlockRows * (kQueryTile + kPad16));    // (64, 40) Pᵀ rounded
    dst = c.take(sizeof(bf16) * kBlockRows * (kQueryTile + kPad16));   // (64, 40) dSᵀ rounded
    dk = c.take(sizeof(float) * kBlockRows * (Dp + kPad32));            // (64, Dp+4) dk accumulators
    dv = c.take(sizeof(float) * kBlockRows * (Dp + kPad32));            // (64, Dp+4) dv accumulators
    lse = c.take(sizeof(float) * kQueryTile);                          // (32) lse of the tile's rows
    drow = c.take(sizeof(float) * kQueryTile);                         // (32) drow of the tile's rows
    bytes = c.bytes;
  }
};

// Block per (64 key rows, key/value head, sequence); warp w owns keys j0 + 16w + [0, 16). For each query head of
// the group in order and each query tile [i0, i0 + 32) with i0 ≥ j0 (the block's keys are seen from j0 on), in the
// transposed orientation: Sᵀ = K Qᵀ and dPᵀ = V dYᵀ (wmma); Pᵀ = exp(scale·s − lse_i), dSᵀ = Pᵀ (dPᵀ − drow_i) in
// fp32, rounded; dv += Pᵀ dY, dk += dSᵀ Q (wmma). dk = scale · the sum. Fixed order, no atomics: deterministic.
template <typename In>
__global__ void __launch_bounds__(kWarps * 32)
    gqa_dkdv_bf16_kernel(float* dk, float* dv, const float* dy, const In* q, const In* k, const In* v,
                         const float* lse, const float* drow, int T, int H, int KV, int D, int64_t qstride,
                         int64_t kstride, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const DkdvSmem L(D);
  const int Dp = padded(D);  // the columns of the shared tiles, D and zeros
  const int ldh = Dp + kPad16, ldt = kQueryTile + kPad32, ldb = kQueryTile + kPad16, lda = Dp + kPad32;
  bf16* ks = reinterpret_cast<bf16*>(smem + L.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + L.v);
  bf16* qs = reinterpret_cast<bf16*>(smem + L.q);
  bf16* gs = reinterpret_cast<bf16*>(smem + L.g);
  float* st = reinterpret_cast<float*>(smem + L.st);
  float* dpt = reinterpret_cast<float*>(smem + L.dpt);
  bf16* pt = reinterpret_cast<bf16*>(smem + L.pt);
  bf16* dst = reinterpret_cast<bf16*>(smem + L.dst);
  float* dks = reinterpret_cast<float*>(smem + L.dk);
  float* dvs = reinterpret_cast<float*>(smem + L.dv);
  float* lt = reinterpret_cast<float*>(smem + L.lse);
  float* dt = reinterpret_cast<float*>(smem + L.drow);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, kvh = blockIdx.y, G = H / KV;
  const int j0 = blockIdx.x * kBlockRows, r0 = warp * 16;
  const int jw = j0 + r0;  // the warp's first key
  const int64_t ystride = int64_t(H) * D;
  const int64_t koff = head_offset(b, kvh, T, kstride, D);
  load_rows_bf16(ks, ldh, k + koff, kstride, j0, kBlockRows, T, D);
  load_rows_bf16(vs, ldh, v + koff, kstride, j0, kBlockRows, T, D);
  zero_rows(dks, lda, kBlockRows, Dp);
  zero_rows(dvs, lda, kBlockRows, Dp);
  for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
    const int64_t qoff = head_offset(b, h, T, qstride, D), yoff = head_offset(b, h, T, ystride, D);
    const int64_t stat0 = (int64_t(b) * H + h) * T;
    for (int i0 = j0; i0 < T; i0 += kQueryTile) {
      __syncthreads();  // the previous tile is consumed (and K, V, the accumulators are written)
      load_rows_bf16(qs, ldh, q + qoff, qstride, i0, kQueryTile, T, D);
      load_rows_bf16(gs, ldh, dy + yoff, ystride, i0, kQueryTile, T, D);
      if (threadIdx.x < kQueryTile) {
        const int i = i0 + int(threadIdx.x);
        lt[threadIdx.x] = i < T ? lse[stat0 + i] : 0.f;
        dt[threadIdx.x] = i < T ? drow[stat0 + i] : 0.f;
      }
      __syncthreads();
      // uniform over the warp: its keys exist and the tile's last query sees the first of them; no barrier below
      if (jw >= T || jw > i0 + kQueryTile - 1) continue;
      // Sᵀ_w(16, 32) = K_w(16, D) · Q_tile(32, D)ᵀ; dPᵀ_w(16, 32) = V_w · dY_tileᵀ
      two_products_abt(st + r0 * ldt, dpt + r0 * ldt, ks + r0 * ldh, qs, vs + r0 * ldh, gs, ldh, ldt, Dp,
                       kQueryTile / 16);
      __syncwarp();
      for (int r = 0; r < 16; ++r) {  // key j = jw + r; lane owns query i = i0 + lane
        const int j = jw + r, i = i0 + lane;
        float p = 0.f, ds = 0.f;
        if (j < T && i < T && i >= j) {
          p = expf(st[(r0 + r) * ldt + lane] * scale - lt[lane]);
          ds = p * (dpt[(r0 + r) * ldt + lane] - dt[lane]);
        }
        pt[(r0 + r) * ldb + lane] = __float2bfloat16_rn(p);
        dst[(r0 + r) * ldb + lane] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      // dV_w(16, D) += Pᵀ_w(16, 32) · dY_tile(32, D); dK_w(16, D) += dSᵀ_w(16, 32) · Q_tile(32, D)
      for (int n = 0; n < Dp / 16; ++n) {
        FragC acc_v, acc_k;
        wmma::load_matrix_sync(acc_v, dvs + r0 * lda + n * 16, lda, wmma::mem_row_major);
        wmma::load_matrix_sync(acc_k, dks + r0 * lda + n * 16, lda, wmma::mem_row_major);
        for (int kk = 0; kk < kQueryTile; kk += 16) {
          FragA a;
          FragB bm;
          wmma::load_matrix_sync(a, pt + r0 * ldb + kk, ldb);
          wmma::load_matrix_sync(bm, gs + kk * ldh + n * 16, ldh);
          wmma::mma_sync(acc_v, a, bm, acc_v);
          wmma::load_matrix_sync(a, dst + r0 * ldb + kk, ldb);
          wmma::load_matrix_sync(bm, qs + kk * ldh + n * 16, ldh);
          wmma::mma_sync(acc_k, a, bm, acc_k);
        }
        wmma::store_matrix_sync(dvs + r0 * lda + n * 16, acc_v, lda, wmma::mem_row_major);
        wmma::store_matrix_sync(dks + r0 * lda + n * 16, acc_k, lda, wmma::mem_row_major);
      }
      __syncwarp();
    }
  }
  __syncthreads();  // warps that skipped tiles wrote nothing; every accumulator is final
  for (int r = 0; r < 16; ++r) {
    const int j = jw + r;
    if (j >= T) break;
    for (int c = lane; c < D; c += 32) {
      dk[koff + int64_t(j) * kstride + c] = dks[(r0 + r) * lda + c] * scale;
      dv[koff + int64_t(j) * kstride + c] = dvs[(r0 + r) * lda + c];
    }
  }
}

// dst(n) = src(n) rounded to bf16 and kept as fp32: the operands of the fp32 kernels where these do not apply.
__global__ void round_bf16_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
}

// Launches kernel with `bytes` of dynamic shared memory, opting in above the default 48 KiB; a clear error where
// the device has less.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, size_t bytes, cudaStream_t s, Args... args) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  PIPER_CHECK(bytes <= size_t(optin), "bf16 gqa attention: ", bytes, " bytes of shared memory a block, the device ",
              "allows ", optin);
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  kernel<<<grid, kWarps * 32, bytes, s>>>(args...);
  CUDA_CHECK_LAUNCH();
}

void check_grid(int B, int H) {
  PIPER_CHECK(B <= 65535 && H <= 65535, "gqa attention: batch ", B, " or heads ", H, " exceed the grid");
}

}  // namespace

bool gqa_attention_bf16_supported(int D) { return D >= 1 && D <= kMaxD; }

void round_bf16(float* dst, const float* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  round_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

namespace {

// The element type of q, k, v (one width for the three): bf16 bits or fp32.
bool bf16_inputs(ConstAct q, ConstAct k, ConstAct v) {
  PIPER_CHECK(q.bf16 == k.bf16 && k.bf16 == v.bf16, "bf16 gqa attention: q, k and v at different widths");
  return q.bf16;
}
const bf16* bf16_of(ConstAct a) { return reinterpret_cast<const bf16*>(a.bits()); }

}  // namespace

void gqa_attention_forward_bf16(float* y, float* lse, ConstAct q, ConstAct k, ConstAct v, int B, int T, int H,
                                int KV, int D, int64_t qs, int64_t ks, cudaStream_t s) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  PIPER_CHECK(gqa_attention_bf16_supported(D), "bf16 gqa attention: head dimension ", D, " is not in [1, ", kMaxD,
              "]");
  check_grid(B, H);
  const dim3 grid((T + kBlockRows - 1) / kBlockRows, H, B);
  const float scale = 1.0f / sqrtf(float(D));
  if (bf16_inputs(q, k, v))
    launch(gqa_forward_bf16_kernel<bf16>, grid, ForwardSmem(D).bytes, s, y, lse, bf16_of(q), bf16_of(k), bf16_of(v),
           T, H, KV, D, qs, ks, scale);
  else
    launch(gqa_forward_bf16_kernel<float>, grid, ForwardSmem(D).bytes, s, y, lse, q.f32(), k.f32(), v.f32(), T, H,
           KV, D, qs, ks, scale);
}

void gqa_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy, ConstAct q, ConstAct k,
                                 ConstAct v, ConstAct y, const float* lse, float* drow, int B, int T, int H,
                                 int KV, int D, int64_t qs, int64_t ks, cudaStream_t s) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  PIPER_CHECK(gqa_attention_bf16_supported(D), "bf16 gqa attention: head dimension ", D, " is not in [1, ", kMaxD,
              "]");
  check_grid(B, H);
  const float scale = 1.0f / sqrtf(float(D));
  gqa_attention_drow(drow, dy, y, B, T, H, D, s);  // dy · y of every query row, in fp32
  const dim3 dq_grid((T + kBlockRows - 1) / kBlockRows, H, B), dkdv_grid((T + kBlockRows - 1) / kBlockRows, KV, B);
  const float* rows = drow;
  if (bf16_inputs(q, k, v)) {
    launch(gqa_dq_bf16_kernel<bf16>, dq_grid, DqSmem(D).bytes, s, dq, dy, bf16_of(q), bf16_of(k), bf16_of(v), lse,
           rows, T, H, KV, D, qs, ks, scale);
    launch(gqa_dkdv_bf16_kernel<bf16>, dkdv_grid, DkdvSmem(D).bytes, s, dk, dv, dy, bf16_of(q), bf16_of(k),
           bf16_of(v), lse, rows, T, H, KV, D, qs, ks, scale);
  } else {
    launch(gqa_dq_bf16_kernel<float>, dq_grid, DqSmem(D).bytes, s, dq, dy, q.f32(), k.f32(), v.f32(), lse, rows, T,
           H, KV, D, qs, ks, scale);
    launch(gqa_dkdv_bf16_kernel<float>, dkdv_grid, DkdvSmem(D).bytes, s, dk, dv, dy, q.f32(), k.f32(), v.f32(), lse,
           rows, T, H, KV, D, qs, ks, scale);
  }
}

}  // namespace piper::cuda
