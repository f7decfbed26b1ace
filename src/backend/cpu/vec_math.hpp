// Branch-free float math that GCC vectorizes (exp, tanh, GELU-tanh and its derivative; sums and maxima in lanes):
// libm's tanh is slow and scalar. Accuracy ~2 ulp for exp over the clamped range; tanh absolute error < 2e-7.
#pragma once
#include <cstdint>
#include <cstring>

namespace piper::vec {

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

// exp(x) for x in [-87, 88]: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds to nearest
  float n = (x * 1.44269504088896341f + round_magic) - round_magic;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = (int32_t(n) + 127) << 23;
  return p * bits_to_float(e);
}

// tanh(u) = (e - 1) / (e + 1), e = exp(2u); |u| clamped at 9 where tanh is 1 in float.
inline float tanh_approx(float u) {
  u = u < -9.0f ? -9.0f : (u > 9.0f ? 9.0f : u);
  float e = exp_approx(2.0f * u);
  return (e - 1.0f) / (e + 1.0f);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

inline float gelu(float x) {
  float t = tanh_approx(kGeluScale * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

// gelu(x) and gelu'(x) from one tanh; x is read before g is written, so x and g may be the same variable.
inline void gelu_and_grad(float x, float& g, float& d) {
  float x2 = x * x;
  float t = tanh_approx(kGeluScale * (x + kGeluCubic * x2 * x));
  float dt = kGeluScale * (1.0f + 3.0f * kGeluCubic * x2) * (1.0f - t * t);
  d = 0.5f * (1.0f + t) + 0.5f * x * dt;
  g = 0.5f * x * (1.0f + t);
}
// Reductions in kLanes interleaved partials: element i goes to partial i % kLanes, and the partials are added
// pairwise in a fixed order. A plain `s += x[i]` loop is one serial chain of adds (the compiler may not reorder
// float sums), ten times slower at C = 256; this order vectorizes, and it depends only on n, never on threads.
constexpr int kLanes = 16;

template <typename F>
[[gnu::always_inline]] inline float lane_sum(int n, F term) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// max of x[0..n), n ≥ 1, in lanes (max is exact, so only speed differs from a serial loop; NaNs are not seen).
inline float lane_max(const float* x, int n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l] > acc[l + w] ? acc[l] : acc[l + w];
  return acc[0];
}

}  // namespace piper::vec
