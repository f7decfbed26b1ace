// CPU kernels of the Llama-style (Qwen3) transformer besides attention: RMSNorm, rotary position embedding,
// SwiGLU and the token embedding (of the whole vocabulary, or of one rank's shard of it). Row work is split in
// fixed chunks, so results do not depend on threads.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/cpu_parallel.hpp"
#include "backend/cpu/vec_math.hpp"
#include "util/error.hpp"
#include "util/precision.hpp"

namespace piper {

using cpu::for_chunks;
using cpu::for_range;

void CpuKernels::rmsnorm_forward(Act y, float* rstd, ConstAct x, const float* w, int N, int C, float eps) {
  cpu::with_storage(x, [&](const auto* xs) {
    for_range(size_t(N) * C, threads_, [&](size_t e0, size_t e1) {
      for (size_t r = e0 / C; r < e1 / C; ++r) {
        const auto* __restrict xr = xs + r * C;  // (C)
        const float ss = vec::lane_sum(C, [&](int i) { return cpu::value(xr, i) * cpu::value(xr, i); });
        const float rs = 1.0f / std::sqrt(ss / C + eps);
        cpu::store(y, r * C, size_t(C), [&](size_t i) { return cpu::value(xr, i) * rs * w[i]; });  // (C)
        rstd[r] = rs;
      }
    });
  });
}

void CpuKernels::rmsnorm_backward_input(Act dx, const float* dy, ConstAct x, const float* rstd, const float* w,
                                        int N, int C, bool accumulate) {
  // y_i = x_i rs w_i, rs = (Σ x² / C + eps)^-1/2: dx_i = rs (dy_i w_i − x_i rs² Σ_j dy_j w_j x_j / C)
  PIPER_CHECK(!(dx.bf16 && accumulate), "rmsnorm_backward_input: a bf16 dx added to");
  cpu::with_storage(x, [&](const auto* xs) {
    for_range(size_t(N) * C, threads_, [&](size_t e0, size_t e1) {
      for (size_t r = e0 / C; r < e1 / C; ++r) {
        const auto* __restrict xr = xs + r * C;   // (C)
        const float* __restrict gr = dy + r * C;  // (C)
        const float rs = rstd[r];
        const float dot = vec::lane_sum(C, [&](int i) { return gr[i] * w[i] * cpu::value(xr, i); });
        const float k = rs * rs * dot / C;
        if (accumulate) {
          float* __restrict dr = dx.f32() + r * C;  // (C)
          for (int i = 0; i < C; ++i) dr[i] += rs * (gr[i] * w[i] - cpu::value(xr, i) * k);
        } else {
          cpu::store(dx, r * C, size_t(C), [&](size_t i) { return rs * (gr[i] * w[i] - cpu::value(xr, i) * k); });
        }
      }
    });
  });
}

void CpuKernels::rmsnorm_backward_weight(float* dw, const float* dy, ConstAct x, const float* rstd, int N, int C,
                                         bool accumulate) {
  // Columns are split across threads; each column sums its rows in row order.
  cpu::with_storage(x, [&](const auto* xs) {
    for_chunks(size_t(C), size_t(threads_), threads_, [&](size_t, size_t c0, size_t c1) {
      float* __restrict gw = dw;  // (C)
      if (!accumulate)
        for (size_t c = c0; c < c1; ++c) gw[c] = 0.f;
      for (int r = 0; r < N; ++r) {
        const auto* __restrict xr = xs + int64_t(r) * C;   // (C)
        const float* __restrict gr = dy + int64_t(r) * C;  // (C)
        const float rs = rstd[r];
        for (size_t c = c0; c < c1; ++c) gw[c] += gr[c] * cpu::value(xr, c) * rs;
      }
    });
  });
}

void CpuKernels::rope(float* x, int B, int T, int H, int D, float theta, bool inverse) {
  const int half = D / 2;
  if (B <= 0 || T <= 0 || H <= 0 || half <= 0) return;
  // inv_freq(D/2) as torch computes it in float: the exponent float(2i) / D, the power and its reciprocal each
  // rounded to float (the power taken in double and rounded once, as the CUDA backend does); then
  // angle = float(t) · inv_freq in float.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0f / float(std::pow(double(theta), double(float(2 * i) / float(D))));
  // cos_t(T, D/2), sin_t(T, D/2): the float angle's cosine and sine, rounded once; sine negated for inverse.
  std::vector<float> table(2 * size_t(T) * half);
  float* cos_t = table.data();
  float* sin_t = table.data() + size_t(T) * half;
  const double sign = inverse ? -1.0 : 1.0;
  for_range(size_t(T) * half, threads_, [&](size_t e0, size_t e1) {
    for (size_t e = e0; e < e1; ++e) {
      const float a = float(e / size_t(half)) * inv_freq[e % size_t(half)];
      cos_t[e] = float(std::cos(double(a)));
      sin_t[e] = float(sign * std::sin(double(a)));
    }
  });
  // x(B,T,H,D): row r = (b·T + t)·H + h; rows split across threads.
  for_range(size_t(B) * T * H * D, threads_, [&](size_t e0, size_t e1) {
    for (size_t r = e0 / D; r < e1 / D; ++r) {
      const size_t t = (r / size_t(H)) % size_t(T);
      const float* __restrict c = cos_t + t * half;  // (D/2)
      const float* __restrict s = sin_t + t * half;  // (D/2)
      float* __restrict lo = x + r * D;              // x_i, i < D/2
      float* __restrict hi = lo + half;              // x_{i+D/2}
      for (int i = 0; i < half; ++i) {
        const float x1 = lo[i], x2 = hi[i];
        lo[i] = x1 * c[i] - x2 * s[i];
        hi[i] = x2 * c[i] + x1 * s[i];
      }
    }
  });
}

void CpuKernels::swiglu_forward(Act a, ConstAct g, ConstAct u, size_t n) {
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    cpu::with_storage("swiglu_forward", g, u, [&](const auto* gs, const auto* us) {
      const auto* __restrict gate = gs + e0;
      const auto* __restrict up = us + e0;
      cpu::store(a, e0, e1 - e0, [&](size_t i) {
        const float x = cpu::value(gate, i);
        const float sig = 1.0f / (1.0f + vec::exp_approx(-x));
        return x * sig * cpu::value(up, i);
      });
    });
  });
}

void CpuKernels::swiglu_backward(Act dg, Act du, const float* da, ConstAct g, ConstAct u, size_t n) {
  // silu'(g) = σ(g) (1 + g (1 − σ(g)))
  PIPER_CHECK(dg.bf16 == du.bf16, "swiglu_backward: dg and du of different widths");
  for_range(n, threads_, [&](size_t e0, size_t e1) {
    const float* __restrict grad = da;
    cpu::with_storage("swiglu_backward", g, u, [&](const auto* gate, const auto* up) {
      auto each = [&](auto* __restrict dgate, auto* __restrict dup, auto put) {
        for (size_t i = e0; i < e1; ++i) {
          const float x = cpu::value(gate, i);
          const float sig = 1.0f / (1.0f + vec::exp_approx(-x));
          dgate[i] = put(grad[i] * cpu::value(up, i) * sig * (1.0f + x * (1.0f - sig)));
          dup[i] = put(grad[i] * x * sig);
        }
      };
      if (dg.bf16)
        each(dg.bits(), du.bits(), [](float v) { return bf16_bits(v); });
      else
        each(dg.f32(), du.f32(), [](float v) { return v; });
    });
  });
}

void CpuKernels::token_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C) {
  // the one shard of the whole vocabulary: every token is in [0, INT_MAX) (V is not an argument)
  vocab_embedding_forward(x, tok, w, N, C, 0, std::numeric_limits<int>::max());
}

void CpuKernels::token_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int V,
                                          bool accumulate) {
  vocab_embedding_backward(dw, dx, tok, N, C, 0, V, accumulate);  // the one shard of the whole vocabulary
}

void CpuKernels::vocab_embedding_forward(float* x, const int32_t* tok, const float* w, int N, int C, int v0,
                                         int Vl) {
  for_range(size_t(N) * C, threads_, [&](size_t e0, size_t e1) {
    for (size_t r = e0 / C; r < e1 / C; ++r) {  // x row r(C) = w row tok[r] − v0(C), or 0 outside the shard
      const int64_t t = int64_t(tok[r]) - v0;
      if (t >= 0 && t < Vl)
        std::memcpy(x + r * C, w + t * C, sizeof(float) * size_t(C));
      else
        std::memset(x + r * C, 0, sizeof(float) * size_t(C));
    }
  });
}

void CpuKernels::vocab_embedding_backward(float* dw, const float* dx, const int32_t* tok, int N, int C, int v0,
                                          int Vl, bool accumulate) {
  if (!accumulate) fill(dw, 0.f, size_t(Vl > 0 ? Vl : 0) * C);  // dw(Vl,C)
  // Columns are split across threads, so repeated tokens never race; rows are added in order. Tokens outside
  // the shard are another rank's.
  for_chunks(size_t(C), size_t(threads_), threads_, [&](size_t, size_t c0, size_t c1) {
    for (int64_t r = 0; r < N; ++r) {
      const int64_t t = int64_t(tok[r]) - v0;
      if (t < 0 || t >= Vl) continue;
      const float* __restrict g = dx + r * C;  // (C)
      float* __restrict out = dw + t * C;      // (C)
      for (size_t c = c0; c < c1; ++c) out[c] += g[c];
    }
  });
}

}  // namespace piper
