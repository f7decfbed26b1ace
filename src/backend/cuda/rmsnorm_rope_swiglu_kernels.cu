// CUDA kernels of the Llama-style (Qwen3) transformer besides attention and embeddings: RMSNorm (one block per
// row, weight gradient as deterministic column sums), rotary position embedding and SwiGLU (elementwise).
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_common.hpp"
#include "backend/cuda/cuda_launch.hpp"
#include "backend/cuda/device_utils.cuh"

namespace piper::cuda {

namespace {

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;

// One block per row: y(N,C) = x * rstd * w at y's width, x read at its; rstd(N) = 1 / sqrt(mean x² + eps).
template <typename Out, typename In>
__global__ void rmsnorm_forward_kernel(Out* y, float* rstd, const In* x, const float* w, int C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const In* xr = x + row * C;  // (C)
  Out* yr = y + row * C;       // (C)
  float ss = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) ss += load_value(xr, i) * load_value(xr, i);
  const float rs = 1.0f / sqrtf(block_sum(ss, shared) / C + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) store_value(yr, i, load_value(xr, i) * rs * w[i]);
  if (threadIdx.x == 0) rstd[row] = rs;
}

// One block per row: dx(N,C) (+)= rstd (dy·w − x rstd² Σ_c dy·w·x / C)
template <typename Out, typename In>
__global__ void rmsnorm_backward_input_kernel(Out* dx, const float* dy, const In* x, const float* rstd,
                                              const float* w, int C, bool accumulate) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const In* xr = x + row * C;      // (C)
  const float* gr = dy + row * C;  // (C)
  Out* dr = dx + row * C;          // (C)
  const float rs = rstd[row];
  float dot = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dot += gr[i] * w[i] * load_value(xr, i);
  const float k = rs * rs * block_sum(dot, shared) / C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = rs * (gr[i] * w[i] - load_value(xr, i) * k);
    if constexpr (std::is_same_v<Out, float>)
      dr[i] = accumulate ? dr[i] + d : d;
    else
      store_value(dr, i, d);  // a bf16 dx is written, never added to
  }
}

// part(chunk,C) = Σ_rows dy·x·rstd over the chunk's rows, in a fixed order. Block (32, 8).
template <typename In>
__global__ void rmsnorm_weight_partial_kernel(float* part, const float* dy, const In* x, const float* rstd, int N,
                                              int C, int rows_per_chunk) {
  __shared__ float lanes[kRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float acc = 0.f;
  if (c < C)
    for (int r = r0 + int(threadIdx.y); r < r1; r += kRowLanes) {
      const int64_t i = int64_t(r) * C + c;
      acc += dy[i] * load_value(x, i) * rstd[r];
    }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
    for (int k = 0; k < kRowLanes; ++k) s += lanes[k][threadIdx.x];
    part[int64_t(blockIdx.y) * C + c] = s;
  }
}

// cos_t(T,D/2), sin_t(T,D/2) of the rotation, one thread per (t, i), computed as the CPU backend does:
// inv_freq_i = 1 / theta^(2i/D) with the exponent float(2i) / D, the power taken in double and it and its
// reciprocal each rounded to float (as torch does); angle = float(t) · inv_freq_i in float; the cosine and sine
// of that float angle taken in double and rounded once; the sine negated for the inverse.
__global__ void rope_table_kernel(float* cos_t, float* sin_t, int T, int D, float theta, bool inverse) {
  const int half = D / 2;
  const size_t n = size_t(T) * size_t(half);
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x) {
    const int i = int(e % size_t(half));
    const int t = int(e / size_t(half));
    const float inv_freq = 1.0f / float(pow(double(theta), double(float(2 * i) / float(D))));
    const float a = __fmul_rn(float(t), inv_freq);
    double sd, cd;
    sincos(double(a), &sd, &cd);
    cos_t[e] = float(cd);
    sin_t[e] = float(inverse ? -sd : sd);
  }
}

// One thread per rotated pair (x_i, x_{i+D/2}) of x(B,T,H,D), reading the (T,D/2) tables of rope_table_kernel.
__global__ void rope_kernel(float* x, const float* cos_t, const float* sin_t, size_t pairs, int T, int H, int D) {
  const int half = D / 2;
  for (size_t p = size_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += size_t(gridDim.x) * blockDim.x) {
    const int i = int(p % size_t(half));
    const size_t row = p / size_t(half);  // (b·T + t)·H + h
    const size_t t = (row / size_t(H)) % size_t(T);
    const float c = cos_t[t * half + i], s = sin_t[t * half + i];
    float* lo = x + row * size_t(D) + i;
    float* hi = lo + half;
    const float x1 = *lo, x2 = *hi;
    *lo = x1 * c - x2 * s;
    *hi = x2 * c + x1 * s;
  }
}

// a(n) = silu(g) · u at a's width, g and u read at theirs.
template <typename Out, typename In>
__global__ void swiglu_forward_kernel(Out* a, const In* g, const In* u, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float x = load_value(g, int64_t(i));
    const float sig = 1.0f / (1.0f + expf(-x));
    store_value(a, int64_t(i), x * sig * load_value(u, int64_t(i)));
  }
}

// silu'(g) = σ(g) (1 + g (1 − σ(g)))
template <typename Out, typename In>
__global__ void swiglu_backward_kernel(Out* dg, Out* du, const float* da, const In* g, const In* u, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float x = load_value(g, int64_t(i)), grad = da[i];
    const float sig = 1.0f / (1.0f + expf(-x));
    store_value(dg, int64_t(i), grad * load_value(u, int64_t(i)) * sig * (1.0f + x * (1.0f - sig)));
    store_value(du, int64_t(i), grad * x * sig);
  }
}

// f(out's storage, in's storage): each at its width, bf16 bits or fp32.
template <typename F>
void with_widths(Act out, ConstAct in, F f) {
  if (out.bf16) {
    if (in.bf16) f(out.bits(), in.bits());
    else f(out.bits(), in.f32());
  } else {
    if (in.bf16) f(out.f32(), in.bits());
    else f(out.f32(), in.f32());
  }
}

}  // namespace

void rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps, cudaStream_t s) {
  if (N <= 0) return;
  with_widths(y, x, [&](auto* out, const auto* in) {
    rmsnorm_forward_kernel<<<N, row_threads(C), 0, s>>>(out, rstd, in, w, C, eps);
  });
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w, int N, int C,
                            bool accumulate, cudaStream_t s) {
  if (N <= 0) return;
  with_widths(dx, x, [&](auto* out, const auto* in) {
    rmsnorm_backward_input_kernel<<<N, row_threads(C), 0, s>>>(out, dy, in, rstd, w, C, dx.bf16 ? false : accumulate);
  });
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                             bool accumulate, float* partial, cudaStream_t s) {
  if (C <= 0) return;
  const int chunks = column_chunks(N);
  const int rows_per_chunk = (N + chunks - 1) / chunks;
  dim3 grid((C + kColumnTile - 1) / kColumnTile, chunks);  // partial(chunks, C)
  if (x.bf16)
    rmsnorm_weight_partial_kernel<<<grid, dim3(kColumnTile, kRowLanes), 0, s>>>(partial, dy, x.bits(), rstd, N, C,
                                                                                 rows_per_chunk);
  else
    rmsnorm_weight_partial_kernel<<<grid, dim3(kColumnTile, kRowLanes), 0, s>>>(partial, dy, x.f32(), rstd, N, C,
                                                                                 rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  column_finish(dw, partial, chunks, C, accumulate, s);
}

void rope(float* x, int B, int T, int H, int D, float theta, bool inverse, float* table, cudaStream_t s) {
  const size_t pairs = size_t(B > 0 ? B : 0) * size_t(T > 0 ? T : 0) * size_t(H > 0 ? H : 0) * size_t(D / 2);
  if (pairs == 0) return;
  const size_t entries = size_t(T) * size_t(D / 2);
  float* cos_t = table;           // (T,D/2)
  float* sin_t = table + entries;  // (T,D/2)
  rope_table_kernel<<<grid_for(entries, 256), 256, 0, s>>>(cos_t, sin_t, T, D, theta, inverse);
  CUDA_CHECK_LAUNCH();
  rope_kernel<<<grid_for(pairs, 256), 256, 0, s>>>(x, cos_t, sin_t, pairs, T, H, D);
  CUDA_CHECK_LAUNCH();
}

// f(g's storage, u's storage), one width for both: bf16 bits or fp32.
template <typename F>
void with_inputs(ConstAct g, ConstAct u, F f) {
  PIPER_CHECK(g.bf16 == u.bf16, "swiglu: g and u of different widths");
  if (g.bf16) f(g.bits(), u.bits());
  else f(g.f32(), u.f32());
}

void swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n, cudaStream_t s) {
  if (n == 0) return;
  with_inputs(g, u, [&](const auto* gs, const auto* us) {
    if (a.bf16)
      swiglu_forward_kernel<<<grid_for(n, 256), 256, 0, s>>>(a.bits(), gs, us, n);
    else
      swiglu_forward_kernel<<<grid_for(n, 256), 256, 0, s>>>(a.f32(), gs, us, n);
  });
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n, cudaStream_t s) {
  if (n == 0) return;
  with_inputs(g, u, [&](const auto* gs, const auto* us) {
    if (dg.bf16 && du.bf16)
      swiglu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(dg.bits(), du.bits(), da, gs, us, n);
    else
      swiglu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(dg.f32(), du.f32(), da, gs, us, n);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace piper::cuda
