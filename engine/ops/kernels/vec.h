// Eight-float vector helpers the library's small float kernels share (blockops.cpp, logits.cpp).
#pragma once

#include <cstdint>
#include <cstring>

namespace {

// Eight floats as one value (GCC vector extension: 256-bit registers where the build has them, two
// 128-bit ones otherwise); aligned(4) makes a dereference an unaligned load, may_alias lets it read
// and write float arrays (as the intrinsics' __m256 does).
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));

typedef int32_t v8i __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4), may_alias));

// Sixteen floats (one 512-bit register where the build has them, else two 256-bit halves).
typedef float v16f __attribute__((vector_size(64), aligned(4), may_alias));

inline float hsum(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// The first n < 8 floats at p in a vector (the other lanes 0), and back.
inline v8f load_first(const float* p, int64_t n) {
  v8f v = {};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}

inline void store_first(float* p, v8f v, int64_t n) {
  std::memcpy(p, &v, n * sizeof(float));
}

// e^x for x <= 0 (a softmax's exponent once its maximum is taken away; SiLU's of -|x|), within 2 ulp
// of expf: x = n ln2 + f with |f| <= ln2 / 2, e^f by Cephes' degree-6 polynomial, 2^n put into the
// exponent bits. In vector form because a scalar loop of it (or of libm's expf) does not vectorize
// under strict float semantics; below -87 it gives ~1.6e-38 instead of 0, which no sum notices.
// VF / VI: v8f / v8i, or v16f / v16i where registers are 512 bits wide (lane by lane the same operations,
// so the same values). A template over values only: GCC keeps a vector typedef's attributes there.
template <typename VF, typename VI>
inline VF exp_nonpositive_lanes(VF x) {
  const VF lo = x * 0.0f - 87.0f;
  x = x < lo ? lo : x;
  const VI n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, VI);  // nearest, as x <= 0
  const VF i = __builtin_convertvector(n, VF);
  const VF f = (x - i * 0.693359375f) + i * 2.12194440e-4f;
  VF p = f * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  const VF e = p * f * f + f + 1.0f;
  return e * reinterpret_cast<VF>((n + 127) << 23);
}

inline v8f exp_nonpositive(v8f x) { return exp_nonpositive_lanes<v8f, v8i>(x); }

}  // namespace
