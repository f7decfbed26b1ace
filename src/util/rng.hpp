// Counter-based random numbers (Philox-4x32-10): the value at (key, counter) is a pure function,
// so any rank can produce any element of any tensor without generating the ones before it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace piper {

struct Philox {
  // Four 32-bit random words for the 128-bit counter (c0..c3) under the 64-bit key.
  static inline void round4(uint32_t ctr[4], uint64_t key) {
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int r = 0; r < 10; ++r) {
      uint64_t p0 = uint64_t(0xD2511F53u) * ctr[0];
      uint64_t p1 = uint64_t(0xCD9E8D57u) * ctr[2];
      uint32_t n0 = uint32_t(p1 >> 32) ^ ctr[1] ^ k0;
      uint32_t n1 = uint32_t(p1);
      uint32_t n2 = uint32_t(p0 >> 32) ^ ctr[3] ^ k1;
      uint32_t n3 = uint32_t(p0);
      ctr[0] = n0; ctr[1] = n1; ctr[2] = n2; ctr[3] = n3;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }
};

// 64-bit FNV-1a mixed with a seed: turns (seed, name) into a Philox key.
inline uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (unsigned char c : name) { h ^= c; h *= 1099511628211ull; }
  h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
  return h;
}

// Uniform in [0, 2^64) at (key, index, lane).
inline uint64_t random_u64(uint64_t key, uint64_t index, uint32_t lane = 0) {
  uint32_t c[4] = {uint32_t(index), uint32_t(index >> 32), lane, 0x5049u};
  Philox::round4(c, key);
  return (uint64_t(c[0]) << 32) | c[1];
}

// Standard normal at (key, index): Box-Muller on two 32-bit uniforms from one Philox call.
inline float random_normal(uint64_t key, uint64_t index) {
  uint32_t c[4] = {uint32_t(index), uint32_t(index >> 32), 0x4E4Fu, 0x5049u};
  Philox::round4(c, key);
  double u1 = (double(c[0]) + 1.0) * (1.0 / 4294967297.0);  // (0, 1]
  double u2 = double(c[1]) * (1.0 / 4294967296.0);          // [0, 1)
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace piper
