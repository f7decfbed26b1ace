// CUDA causal grouped-query attention without T×T buffers: the forward and the dq pass run one warp per query
// row (8 rows a block) over shared-memory tiles of 32 keys; dk/dv run one warp per key row over tiles of queries.
// q (and dq) rows are qstride elements apart, k and v (and dk, dv) kstride apart; y and dy are packed (H·D).
#include <cmath>

#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kRows = 8;    // warps per block: query rows (forward, dq) or key rows (dk, dv) of one block
constexpr int kTile = 32;   // keys (forward, dq) or queries (dk, dv) per shared-memory tile: one per lane
constexpr int kMaxD = 256;  // head dimension limit: columns c = lane + 32u, u < NPL ≤ 8, live in registers

// Offset of one (sequence, head) in x(B,T,heads,D) whose rows are `stride` elements apart (heads · D packed): row i
// of it is at + i · stride.
__device__ inline int64_t head_offset(int b, int head, int T, int64_t stride, int D) {
  return int64_t(b) * T * stride + int64_t(head) * D;
}

// Copies rows [r0, r0 + n) of a (T, D) view with row stride `stride` into dst(n, ld); rows past T are zero.
__device__ inline void load_rows(float* dst, int ld, const float* src, int64_t stride, int r0, int n, int T, int D) {
  for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
    const int r = e / D, c = e % D;
    dst[r * ld + c] = r0 + r < T ? src[int64_t(r0 + r) * stride + c] : 0.f;
  }
}

// Block (kRows warps) per (row tile, head, sequence); warp w owns query row i = blockIdx.x·kRows + w. Online
// softmax over key tiles [j0, j0 + 32) with j0 ≤ the block's last row: lane l scores key j0 + l, then the
// warp adds p_j · v_j for the tile's keys in order. y(B,T,H,D) = o / l, lse(B,H,T) = m + log l.
template <int NPL>
__global__ void __launch_bounds__(kRows * 32)
    gqa_forward_kernel(float* y, float* lse, const float* q, const float* k, const float* v, int T, int H, int KV,
                       int D, int64_t qstride, int64_t kstride, float scale) {
  extern __shared__ float smem[];
  const int ld = D + 1;                  // padded rows: lane l reading row l, column c hits distinct banks
  float* ks = smem;                      // (kTile, ld) keys of the tile
  float* vs = ks + kTile * ld;           // (kTile, ld) values of the tile
  float* qsm = vs + kTile * ld;          // (kRows, D) query rows of the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
  const int i0 = blockIdx.x * kRows, i = i0 + warp;
  const int64_t ystride = int64_t(H) * D;
  const float* qb = q + head_offset(b, h, T, qstride, D);
  const float* kb = k + head_offset(b, kvh, T, kstride, D);
  const float* vb = v + head_offset(b, kvh, T, kstride, D);
  load_rows(qsm, D, qb, qstride, i0, kRows, T, D);
  float m = -INFINITY, l = 0.f, o[NPL];
  #pragma unroll
  for (int u = 0; u < NPL; ++u) o[u] = 0.f;
  const int last = min(T - 1, i0 + kRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and the query rows are loaded)
    load_rows(ks, ld, kb, kstride, j0, kTile, T, D);
    load_rows(vs, ld, vb, kstride, j0, kTile, T, D);
    __syncthreads();
    if (i < T && j0 <= i) {  // uniform over the warp
      const int j = j0 + lane;
      float s = -INFINITY;
      if (j <= i) {
        const float* qr = qsm + warp * D;
        const float* kr = ks + lane * ld;
        float dot = 0.f;
        for (int c = 0; c < D; ++c) dot += qr[c] * kr[c];
        s = dot * scale;
      }
      const float m_new = fmaxf(m, warp_max(s));
      const float p = j <= i ? expf(s - m_new) : 0.f;
      const float corr = expf(m - m_new);  // 0 on the first tile (m = −inf)
      l = l * corr + warp_sum(p);
      #pragma unroll
      for (int u = 0; u < NPL; ++u) o[u] *= corr;
      const int n = min(kTile, i - j0 + 1);  // keys of this tile that row i sees
      for (int jj = 0; jj < n; ++jj) {
        const float pj = __shfl_sync(kFullMask, p, jj);
        const float* vr = vs + jj * ld;
        #pragma unroll
        for (int u = 0; u < NPL; ++u) {
          const int c = lane + 32 * u;
          if (c < D) o[u] += pj * vr[c];
        }
      }
      m = m_new;
    }
  }
  if (i < T) {
    const float inv = 1.0f / l;
    float* yr = y + head_offset(b, h, T, ystride, D) + int64_t(i) * ystride;
    #pragma unroll
    for (int u = 0; u < NPL; ++u) {
      const int c = lane + 32 * u;
      if (c < D) yr[c] = o[u] * inv;
    }
    if (lane == 0) lse[(int64_t(b) * H + h) * T + i] = m + logf(l);
  }
}

// One warp per query row, rows in (B,H,T) order: drow(B,H,T) = dy_i · y_i = Σ_j P_ij dP_ij, y read at its width.
template <typename In>
__global__ void gqa_drow_kernel(float* drow, const float* dy, const In* y, int64_t rows, int T, int H, int D) {
  const int64_t w = int64_t(blockIdx.x) * kRows + (threadIdx.x >> 5);
  if (w >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = int(w % T), h = int((w / T) % H), b = int(w / (int64_t(T) * H));
  const int64_t off = head_offset(b, h, T, int64_t(H) * D, D) + int64_t(i) * H * D;
  float s = 0.f;
  for (int c = lane; c < D; c += 32) s += dy[off + c] * load_value(y, off + c);
  s = warp_sum(s);
  if (lane == 0) drow[w] = s;
}

// Like the forward: warp per query row i, key tiles j0 ≤ i. Lane l recomputes P_ij = exp(s_ij − lse_i) and
// dS_ij = P_ij (dy_i · v_j − drow_i) for j = j0 + l; the warp adds dS_ij k_j in key order.
// dq(B,T,H,D) = scale · Σ_j dS_ij k_j.
template <int NPL>
__global__ void __launch_bounds__(kRows * 32)
    gqa_dq_kernel(float* dq, const float* dy, const float* q, const float* k, const float* v, const float* lse,
                  const float* drow, int T, int H, int KV, int D, int64_t qstride, int64_t kstride, float scale) {
  extern __shared__ float smem[];
  const int ld = D + 1;
  float* ks = smem;               // (kTile, ld)
  float* vs = ks + kTile * ld;    // (kTile, ld)
  float* qsm = vs + kTile * ld;   // (kRows, D)
  float* gsm = qsm + kRows * D;   // (kRows, D) dy rows of the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
  const int i0 = blockIdx.x * kRows, i = i0 + warp;
  const int64_t ystride = int64_t(H) * D;
  const int64_t qoff = head_offset(b, h, T, qstride, D), yoff = head_offset(b, h, T, ystride, D);
  const float* kb = k + head_offset(b, kvh, T, kstride, D);
  const float* vb = v + head_offset(b, kvh, T, kstride, D);
  load_rows(qsm, D, q + qoff, qstride, i0, kRows, T, D);
  load_rows(gsm, D, dy + yoff, ystride, i0, kRows, T, D);
  const int64_t stat = (int64_t(b) * H + h) * T + i;  // (B,H,T) index of row i
  const float li = i < T ? lse[stat] : 0.f, di = i < T ? drow[stat] : 0.f;
  float acc[NPL];
  #pragma unroll
  for (int u = 0; u < NPL; ++u) acc[u] = 0.f;
  const int last = min(T - 1, i0 + kRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    load_rows(ks, ld, kb, kstride, j0, kTile, T, D);
    load_rows(vs, ld, vb, kstride, j0, kTile, T, D);
    __syncthreads();
    if (i < T && j0 <= i) {
      const int j = j0 + lane;
      float ds = 0.f;
      if (j <= i) {
        const float* qr = qsm + warp * D;
        const float* gr = gsm + warp * D;
        const float* kr = ks + lane * ld;
        const float* vr = vs + lane * ld;
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < D; ++c) {
          s += qr[c] * kr[c];
          dp += gr[c] * vr[c];
        }
        const float p = expf(s * scale - li);
        ds = p * (dp - di);
      }
      const int n = min(kTile, i - j0 + 1);
      for (int jj = 0; jj < n; ++jj) {
        const float dsj = __shfl_sync(kFullMask, ds, jj);
        const float* kr = ks + jj * ld;
        #pragma unroll
        for (int u = 0; u < NPL; ++u) {
          const int c = lane + 32 * u;
          if (c < D) acc[u] += dsj * kr[c];
        }
      }
    }
  }
  if (i < T) {
    float* out = dq + qoff + int64_t(i) * qstride;
    #pragma unroll
    for (int u = 0; u < NPL; ++u) {
      const int c = lane + 32 * u;
      if (c < D) out[c] = acc[u] * scale;
    }
  }
}

// Block per (key row tile, key/value head, sequence); warp w owns key row j = blockIdx.x·kRows + w. For each
// query head of the group in order and each query tile [i0, i0 + 32) that reaches j, lane l recomputes P_ij and
// dS_ij for i = i0 + l; the warp adds them in query order: dv_j = Σ P_ij dy_i, dk_j = scale · Σ dS_ij q_i.
template <int NPL>
__global__ void __launch_bounds__(kRows * 32)
    gqa_dkdv_kernel(float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,
                    const float* lse, const float* drow, int T, int H, int KV, int D, int64_t qstride,
                    int64_t kstride, float scale) {
  extern __shared__ float smem[];
  const int ld = D + 1;
  float* qt = smem;                // (kTile, ld) query rows of the tile
  float* gt = qt + kTile * ld;     // (kTile, ld) dy rows of the tile
  float* ksm = gt + kTile * ld;    // (kRows, D) key rows of the block
  float* vsm = ksm + kRows * D;    // (kRows, D) value rows of the block
  float* lt = vsm + kRows * D;     // (kTile) lse of the tile's rows
  float* dt = lt + kTile;          // (kTile) drow of the tile's rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, kvh = blockIdx.y, G = H / KV;
  const int j0 = blockIdx.x * kRows, j = j0 + warp;
  const int64_t ystride = int64_t(H) * D;
  const int64_t koff = head_offset(b, kvh, T, kstride, D);
  load_rows(ksm, D, k + koff, kstride, j0, kRows, T, D);
  load_rows(vsm, D, v + koff, kstride, j0, kRows, T, D);
  float acc_k[NPL], acc_v[NPL];
  #pragma unroll
  for (int u = 0; u < NPL; ++u) acc_k[u] = acc_v[u] = 0.f;
  for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
    const int64_t qoff = head_offset(b, h, T, qstride, D), yoff = head_offset(b, h, T, ystride, D);
    const int64_t stat0 = (int64_t(b) * H + h) * T;
    for (int i0 = (j0 / kTile) * kTile; i0 < T; i0 += kTile) {
      __syncthreads();  // the previous tile is consumed (and the key rows are loaded)
      load_rows(qt, ld, q + qoff, qstride, i0, kTile, T, D);
      load_rows(gt, ld, dy + yoff, ystride, i0, kTile, T, D);
      if (threadIdx.x < kTile) {
        const int i = i0 + int(threadIdx.x);
        lt[threadIdx.x] = i < T ? lse[stat0 + i] : 0.f;
        dt[threadIdx.x] = i < T ? drow[stat0 + i] : 0.f;
      }
      __syncthreads();
      if (j < T && i0 + kTile > j) {  // uniform over the warp: some row of the tile sees key j
        const int i = i0 + lane;
        float p = 0.f, ds = 0.f;
        if (i >= j && i < T) {
          const float* qr = qt + lane * ld;
          const float* gr = gt + lane * ld;
          const float* kr = ksm + warp * D;
          const float* vr = vsm + warp * D;
          float s = 0.f, dp = 0.f;
          for (int c = 0; c < D; ++c) {
            s += qr[c] * kr[c];
            dp += gr[c] * vr[c];
          }
          p = expf(s * scale - lt[lane]);
          ds = p * (dp - dt[lane]);
        }
        const int first = max(0, j - i0), end = min(kTile, T - i0);
        for (int ii = first; ii < end; ++ii) {
          const float pi = __shfl_sync(kFullMask, p, ii);
          const float dsi = __shfl_sync(kFullMask, ds, ii);
          const float* qr = qt + ii * ld;
          const float* gr = gt + ii * ld;
          #pragma unroll
          for (int u = 0; u < NPL; ++u) {
            const int c = lane + 32 * u;
            if (c < D) {
              acc_v[u] += pi * gr[c];
              acc_k[u] += dsi * qr[c];
            }
          }
        }
      }
    }
  }
  if (j < T) {
    float* ok = dk + koff + int64_t(j) * kstride;
    float* ov = dv + koff + int64_t(j) * kstride;
    #pragma unroll
    for (int u = 0; u < NPL; ++u) {
      const int c = lane + 32 * u;
      if (c < D) {
        ok[c] = acc_k[u] * scale;
        ov[c] = acc_v[u];
      }
    }
  }
}

// Launches kernel with `bytes` of dynamic shared memory, opting in above the default 48 KiB.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, size_t bytes, cudaStream_t s, Args... args) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  kernel<<<grid, kRows * 32, bytes, s>>>(args...);
  CUDA_CHECK_LAUNCH();
}

// Registers per lane for D columns: 32·NPL ≥ D.
int lanes_per_row(int D) {
  PIPER_CHECK(D > 0 && D <= kMaxD, "gqa attention: head dimension ", D, " is not in [1, ", kMaxD, "]");
  return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8;
}

template <int NPL>
void forward_npl(float* y, float* lse, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                 int D, int64_t qs, int64_t ks, float scale, cudaStream_t s) {
  const size_t bytes = sizeof(float) * (2 * size_t(kTile) * (D + 1) + size_t(kRows) * D);
  dim3 grid((T + kRows - 1) / kRows, H, B);
  launch(gqa_forward_kernel<NPL>, grid, bytes, s, y, lse, q, k, v, T, H, KV, D, qs, ks, scale);
}

template <int NPL>
void backward_npl(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,
                  const float* lse, const float* drow, int B, int T, int H, int KV, int D, int64_t qs, int64_t ks,
                  float scale, cudaStream_t s) {
  const size_t dq_bytes = sizeof(float) * (2 * size_t(kTile) * (D + 1) + 2 * size_t(kRows) * D);
  launch(gqa_dq_kernel<NPL>, dim3((T + kRows - 1) / kRows, H, B), dq_bytes, s, dq, dy, q, k, v, lse, drow, T, H,
         KV, D, qs, ks, scale);
  const size_t kv_bytes = sizeof(float) * (2 * size_t(kTile) * (D + 1) + 2 * size_t(kRows) * D + 2 * size_t(kTile));
  launch(gqa_dkdv_kernel<NPL>, dim3((T + kRows - 1) / kRows, KV, B), kv_bytes, s, dk, dv, dy, q, k, v, lse, drow,
         T, H, KV, D, qs, ks, scale);
}

}  // namespace

void gqa_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v, int B, int T, int H,
                           int KV, int D, int64_t qs, int64_t ks, cudaStream_t s) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  PIPER_CHECK(B <= 65535 && H <= 65535, "gqa attention: batch ", B, " or heads ", H, " exceed the grid");
  const float scale = 1.0f / sqrtf(float(D));
  switch (lanes_per_row(D)) {
    case 1: forward_npl<1>(y, lse, q, k, v, B, T, H, KV, D, qs, ks, scale, s); break;
    case 2: forward_npl<2>(y, lse, q, k, v, B, T, H, KV, D, qs, ks, scale, s); break;
    case 4: forward_npl<4>(y, lse, q, k, v, B, T, H, KV, D, qs, ks, scale, s); break;
    default: forward_npl<8>(y, lse, q, k, v, B, T, H, KV, D, qs, ks, scale, s); break;
  }
}

void gqa_attention_drow(float* drow, const float* dy, ConstAct y, int B, int T, int H, int D, cudaStream_t s) {
  const int64_t rows = int64_t(B) * H * T;  // drow(B,H,T)
  if (rows <= 0) return;
  const unsigned blocks = unsigned((rows + kRows - 1) / kRows);
  if (y.bf16) gqa_drow_kernel<<<blocks, kRows * 32, 0, s>>>(drow, dy, y.bits(), rows, T, H, D);
  else gqa_drow_kernel<<<blocks, kRows * 32, 0, s>>>(drow, dy, y.f32(), rows, T, H, D);
  CUDA_CHECK_LAUNCH();
}

void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k,
                            const float* v, ConstAct y, const float* lse, float* drow, int B, int T, int H,
                            int KV, int D, int64_t qs, int64_t ks, cudaStream_t s) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  PIPER_CHECK(B <= 65535 && H <= 65535, "gqa attention: batch ", B, " or heads ", H, " exceed the grid");
  const float scale = 1.0f / sqrtf(float(D));
  const int npl = lanes_per_row(D);
  gqa_attention_drow(drow, dy, y, B, T, H, D, s);
  switch (npl) {
    case 1: backward_npl<1>(dq, dk, dv, dy, q, k, v, lse, drow, B, T, H, KV, D, qs, ks, scale, s); break;
    case 2: backward_npl<2>(dq, dk, dv, dy, q, k, v, lse, drow, B, T, H, KV, D, qs, ks, scale, s); break;
    case 4: backward_npl<4>(dq, dk, dv, dy, q, k, v, lse, drow, B, T, H, KV, D, qs, ks, scale, s); break;
    default: backward_npl<8>(dq, dk, dv, dy, q, k, v, lse, drow, B, T, H, KV, D, qs, ks, scale, s); break;
  }
}

}  // namespace piper::cuda
