// CPU kernels that move token rows to and from mixture-of-experts experts: gather (scaled) rows to the experts,
// combine expert rows back per token in k order, and the per-assignment dot products of token and expert rows;
// expert rows at either width (fp32, or bf16 written rounded and read widened).
#include <algorithm>
#include <cmath>

#include "backend/cpu/act_store.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/cpu_parallel.hpp"

namespace piper {

using cpu::for_range;
using cpu::value;

namespace {

constexpr int kCombineTile = 512;  // columns of one token row summed on the stack by combine_rows
constexpr int kDotLanes = 8;       // double partial sums of one rows_dot product

// Σ_c x[c]·y[c] over C values (y fp32 or bf16 bits), in double: each product of two floats is exact in double;
// lane j sums the columns c ≡ j (mod 8) in column order, then the lanes are added pairwise in a fixed tree. Rounded
// to float once.
template <typename Y>
inline float dot_rows(const float* __restrict x, const Y* __restrict y, int C) {
  double lane[kDotLanes] = {};
  int c = 0;
  for (; c + kDotLanes <= C; c += kDotLanes)
    for (int j = 0; j < kDotLanes; ++j) lane[j] += double(x[c + j]) * double(value(y, size_t(c + j)));
  for (int j = 0; c + j < C; ++j) lane[j] += double(x[c + j]) * double(value(y, size_t(c + j)));
  return float(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
}

}  // namespace

void CpuKernels::gather_rows(Act dst, const float* src, const int32_t* rows, const float* scale, int m, int C) {
  if (m <= 0 || C <= 0) return;
  const size_t width = size_t(C);
  for_range(size_t(m) * width, threads_, [&](size_t e0, size_t e1) {
    for (size_t i = e0 / width; i < e1 / width; ++i) {  // output row i (C) at dst's width
      if (rows[i] < 0) {                                // past a routing's kept rows
        cpu::store(dst, i * width, width, [](size_t) { return 0.f; });
        continue;
      }
      const float* __restrict s = src + int64_t(rows[i]) * C;  // (C): source row rows[i]
      if (!scale) {
        cpu::store(dst, i * width, width, [&](size_t c) { return s[c]; });
        continue;
      }
      const float a = scale[i];
      cpu::store(dst, i * width, width, [&](size_t c) { return a * s[c]; });
    }
  });
}

void CpuKernels::combine_rows(float* dst, ConstAct src, const int32_t* pos, const float* w, int n, int K, int C,
                              bool accumulate) {
  if (n <= 0 || C <= 0) return;
  const int KK = K > 0 ? K : 0;
  // Each token row is one thread's: its K contributions are summed in k order into a stack tile of columns,
  // each term one fused multiply-add (w null: 1, so fma is a plain add), then written (or added) once, so
  // accumulate gives exactly previous + the overwrite result. The CUDA combine does the same operations.
  const size_t row_work = size_t(KK > 0 ? KK : 1) * size_t(C);
  cpu::with_storage(src, [&](const auto* rows) {
    for_range(size_t(n) * row_work, threads_, [&](size_t e0, size_t e1) {
      for (size_t t = e0 / row_work; t < e1 / row_work; ++t) {
        const int32_t* p = pos + t * size_t(KK);             // (K)
        const float* wt = w ? w + t * size_t(KK) : nullptr;  // (K)
        float* __restrict d = dst + t * size_t(C);           // (C): output row t
        bool any = false;
        for (int k = 0; k < KK; ++k) any = any || p[k] >= 0;
        if (!any) {
          if (!accumulate) std::fill(d, d + C, 0.f);
          continue;
        }
        for (int c0 = 0; c0 < C; c0 += kCombineTile) {
          const int nc = std::min(kCombineTile, C - c0);
          float acc[kCombineTile];  // (nc): columns [c0, c0 + nc) of the row's sum
          for (int c = 0; c < nc; ++c) acc[c] = 0.f;
          for (int k = 0; k < KK; ++k) {
            if (p[k] < 0) continue;
            const float wk = wt ? wt[k] : 1.f;
            const auto* __restrict s = rows + int64_t(p[k]) * C + c0;  // (nc): expert row pos[t,k]
            for (int c = 0; c < nc; ++c) acc[c] = std::fma(wk, value(s, size_t(c)), acc[c]);
          }
          float* __restrict out = d + c0;
          if (accumulate)
            for (int c = 0; c < nc; ++c) out[c] += acc[c];
          else
            for (int c = 0; c < nc; ++c) out[c] = acc[c];
        }
      }
    });
  });
}

void CpuKernels::rows_dot(float* out, const float* a, ConstAct b, const int32_t* pos, int n, int K, int C) {
  if (n <= 0 || K <= 0) return;
  const int CC = C > 0 ? C : 0;
  const size_t row_work = size_t(K) * size_t(CC > 0 ? CC : 1);
  cpu::with_storage(b, [&](const auto* rows) {
    for_range(size_t(n) * row_work, threads_, [&](size_t e0, size_t e1) {
      for (size_t t = e0 / row_work; t < e1 / row_work; ++t) {
        const float* at = a + t * size_t(CC);    // (C): token row t
        const int32_t* p = pos + t * size_t(K);  // (K)
        float* o = out + t * size_t(K);          // (K)
        for (int k = 0; k < K; ++k) o[k] = p[k] < 0 ? 0.f : dot_rows(at, rows + int64_t(p[k]) * CC, CC);
      }
    });
  });
}

}  // namespace piper
