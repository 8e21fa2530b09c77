// Fused small ops of a decoder block, CPU, float32.
//
// Why: a decode step of a 0.5B drafter spends ~11 ms outside its matmuls, and much of that is not
// arithmetic but eager PyTorch dispatch: F.rms_norm decomposes into ~8 ops (~25 us a call on a
// 896-vector in isolation, ~55 us inside a forward whose weights have just flushed the caches) and
// rotate-half RoPE into ~8 (chunk, 4 muls, 2 adds, cat). Each op here is one call with one pass
// over its data (~5 us); results equal the PyTorch formulas up to float rounding
// (tests/test_blockops.py).
//
//   block_rms_norm(x [.., D], w [D], eps)                x * rsqrt(mean(x^2) + eps) * w
//   block_rope(x [n, h, D], cos [n, 1, D/2], sin, neox)  rotated copy, contiguous [n, h, D];
//                                                         neox: pairs (i, i + D/2), else (2i, 2i + 1)
//
//   block_silu_mul(gate_up [.., 2F])                    silu(gate) * up [.., F], gate the first half
//
//   block_attention(q [n, H, D], keys, values [Hkv, S, D], scale)
//        softmax(q k^T * scale) v [n, H, D] where query i sees keys [0, S - n + i] (the queries are
//        the last n key positions: causal attention, or a window when keys start later); query
//        head h reads key head h / (H / Hkv).
//   block_attention_segments(q [N, H, D], keys[s], values[s] [Hkv, S_s, D], lengths[s], scale)
//        the same for several sequences at once (engine.batching): segment s is the next lengths[s]
//        rows of q over its own keys and values, all of them in one parallel region.
//
// x may be a strided view (q and k inside the fused qkv projection) if its last dimension is
// contiguous. Attention: PyTorch's flash kernel spends ~75 us a call on one query over 150 keys
// (12 heads, D 128), nearly all of it setup; block_attention reads each key and value row once for
// all the query heads that share it and takes ~10 us there. Each query row is computed on its own,
// in the same order whatever n is, so a prefix computed in one call or token by token gives the
// same values.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "native.h"
#include "parallel.h"
#include "vec.h"

namespace {

void check_f32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 0 || t.stride(-1) == 1, what, " must be contiguous in its last dimension");
}

// silu(g) * u = g * sigmoid(g) * u, the sigmoid from t = e^-|g| (never overflows): 1 / (1 + t) for
// g >= 0, t / (1 + t) below.
// VF / VI as exp_nonpositive_lanes takes them.
template <typename VF, typename VI>
inline VF silu_mul(VF g, VF u) {
  const VF t = exp_nonpositive_lanes<VF, VI>(g < 0.0f ? g : -g);
  const VF one = g * 0.0f + 1.0f;
  return g * ((g >= 0.0f ? one : t) / (one + t)) * u;
}

// How far ahead the attention loops prefetch a cache's rows: key rows for the scores (each read whole), value
// rows for the mix (each pass reads a quarter or an eighth of every row). A decode step's attention streams its
// cached keys and values from memory, one sequential run per task, and the hardware prefetcher alone held that to
// about 15 GB/s on Zen 5 (2 cores) against the linears' 50-60; with these, 35-40 (docs/bench/attention-prefetch-zen5.md:
// one sequence's step at 8,000 positions 54-62 -> 27-36 ms). A prefetch past a run's end reads a line it does not use
// and never faults.
constexpr int64_t kKeyPrefetchRows = 32;
constexpr int64_t kValuePrefetchRows = 96;

// Prefetch the n floats from p, one 64-byte line at a time.
inline void prefetch_floats(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

// acc[r] = the eight partial sums of q_r . key for R query heads against one key row of D (a multiple of 8)
// floats, lane l adding the products of d = l, l + 8, ... in order. The R dot products run side by side: one
// chain each, so that the FMA latency is hidden (one head at a time waits on its single accumulator after every
// FMA).
template <int R>
inline void head_partials(const float* q0, int64_t q_stride, const float* key, int64_t D, v8f* acc) {
  for (int r = 0; r < R; ++r) acc[r] = v8f{};
  for (int64_t d = 0; d < D; d += 8) {
    const v8f k = *reinterpret_cast<const v8f*>(key + d);
    for (int r = 0; r < R; ++r) acc[r] += *reinterpret_cast<const v8f*>(q0 + r * q_stride + d) * k;
  }
}

// scores[r * S + j] = scale * q_r . key: head_partials, then each head's horizontal sum.
template <int R>
inline void head_dots(const float* q0, int64_t q_stride, const float* key, int64_t D, float scale, float* scores,
                      int64_t S) {
  v8f acc[R];
  head_partials<R>(q0, q_stride, key, D, acc);
  for (int r = 0; r < R; ++r) scores[r * S] = hsum(acc[r]) * scale;
}

// Eight keys' scores from their accumulators x[k] (lanes a0..a7), each key's sum taken in hsum's order but
// across registers (see hsum16): the same scores as eight hsums. The shuffles are the ones 256-bit registers do
// in one instruction (halves swapped, then pairs picked within each half); the last puts the keys in order.
inline v8f hsum8(const v8f* x) {
  v8f b[4];  // keys 2i, 2i + 1 in the low and high half: b_t = a_t + a_(t+4), t = 0..3
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  v8f c[2];  // keys 4i, 4i + 2 | 4i + 1, 4i + 3: (b0 + b1, b2 + b3) each
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 2, 8, 10, 4, 6, 12, 14) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 1, 3, 9, 11, 5, 7, 13, 15);
  const v8f keys_0246_1357 = __builtin_shufflevector(c[0], c[1], 0, 2, 8, 10, 4, 6, 12, 14) +
                             __builtin_shufflevector(c[0], c[1], 1, 3, 9, 11, 5, 7, 13, 15);
  return __builtin_shufflevector(keys_0246_1357, keys_0246_1357, 0, 4, 1, 5, 2, 6, 3, 7);
}

#if defined(__AVX512F__)
// Sixteen keys' scores from their eight pairs' accumulators x[p] (lanes 0-7: key 2p's eight partial sums
// a0..a7, lanes 8-15: key 2p + 1's), each key's sum taken in hsum's order, ((a0 + a4) + (a1 + a5)) + ((a2 +
// a6) + (a3 + a7)), but across registers: three rounds of shuffles and adds for all sixteen instead of a
// horizontal sum each. The same additions of the same values, so the same scores as head_dots'.
inline v16f hsum16(const v16f* x) {
  v16f b[4];  // keys 4i..4i+3, lanes 4k..4k+3 of key k: b_t = a_t + a_(t+4), t = 0..3
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  v16f c[2];  // keys 8i..8i+7, lanes 2k, 2k + 1 of key k: b0 + b1, b2 + b3
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#endif

// scores[r * S + j] for every key j < len: head_dots over the keys. Where the build has 512-bit registers,
// two keys at a time: each half of a register runs one key's 8-lane sums exactly as head_dots does (the
// same products added in the same order), so both builds give the same scores, and a prompt's attention, most
// of it these dot products, takes half the instructions. The horizontal sums are taken sixteen keys (eight on
// 256-bit builds) at a time across registers, not one per key: a 256-row prompt chunk's attention 0.77-0.79x
// the time on Zen 5 (0.80-0.84x on the AVX2 build; docs/bench/attention-reductions-zen5.md).
template <int R>
inline void head_scores(const float* q0, int64_t q_stride, const float* keys, int64_t k_stride, int64_t len,
                        int64_t D, float scale, float* scores, int64_t S, float* q_pairs) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (len >= 2) {
    // q_pairs [R, D/8, 16]: each 8 values of each head twice, one copy per key of a pair
    for (int r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; d += 8) {
        const v8f v = *reinterpret_cast<const v8f*>(q0 + r * q_stride + d);
        *reinterpret_cast<v16f*>(q_pairs + (r * D + d) * 2) = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
      }
    // One pair of keys: each head's two keys' partial sums, lanes 0-7 and 8-15.
    const auto pair_sums = [&](int64_t j0, v16f* acc) {
      const float* k0 = keys + j0 * k_stride;
      const float* k1 = k0 + k_stride;
      prefetch_floats(k0 + kKeyPrefetchRows * k_stride, D);
      prefetch_floats(k1 + kKeyPrefetchRows * k_stride, D);
      for (int r = 0; r < R; ++r) acc[r] = v16f{};
      for (int64_t d = 0; d < D; d += 8) {
        const v8f a = *reinterpret_cast<const v8f*>(k0 + d), b = *reinterpret_cast<const v8f*>(k1 + d);
        const v16f k = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int r = 0; r < R; ++r) acc[r] += *reinterpret_cast<const v16f*>(q_pairs + (r * D + d) * 2) * k;
      }
    };
    for (; j + 16 <= len; j += 16) {
      v16f pairs[R][8];
      for (int p = 0; p < 8; ++p) {
        v16f acc[R];
        pair_sums(j + 2 * p, acc);
        for (int r = 0; r < R; ++r) pairs[r][p] = acc[r];
      }
      for (int r = 0; r < R; ++r) *reinterpret_cast<v16f*>(scores + r * S + j) = hsum16(pairs[r]) * scale;
    }
    for (; j + 2 <= len; j += 2) {
      v16f acc[R];
      pair_sums(j, acc);
      for (int r = 0; r < R; ++r) {
        const v8f lo = __builtin_shufflevector(acc[r], acc[r], 0, 1, 2, 3, 4, 5, 6, 7);
        const v8f hi = __builtin_shufflevector(acc[r], acc[r], 8, 9, 10, 11, 12, 13, 14, 15);
        scores[r * S + j] = hsum(lo) * scale;
        scores[r * S + j + 1] = hsum(hi) * scale;
      }
    }
  }
#else
  (void)q_pairs;
  for (; j + 8 <= len; j += 8) {  // eight keys' horizontal sums together (hsum8)
    v8f sums[R][8];
    for (int i = 0; i < 8; ++i) {
      const float* key = keys + (j + i) * k_stride;
      prefetch_floats(key + kKeyPrefetchRows * k_stride, D);
      v8f acc[R];
      head_partials<R>(q0, q_stride, key, D, acc);
      for (int r = 0; r < R; ++r) sums[r][i] = acc[r];
    }
    for (int r = 0; r < R; ++r) *reinterpret_cast<v8f*>(scores + r * S + j) = hsum8(sums[r]) * scale;
  }
#endif
  for (; j < len; ++j) {
    prefetch_floats(keys + (j + kKeyPrefetchRows) * k_stride, D);
    head_dots<R>(q0, q_stride, keys + j * k_stride, D, scale, scores + j, S);
  }
}

// The largest of x[0..n), n >= 1, eight lanes at a time: a maximum is exact in any order (a NaN among the
// scores makes every output NaN either way), and the one-at-a-time loop was a chain of dependent maxima, one
// per key and head.
inline float row_max(const float* x, int64_t n) {
  float mx = x[0];
  int64_t j = 0;
  if (n >= 8) {
    v8f m = *reinterpret_cast<const v8f*>(x);
    for (j = 8; j + 8 <= n; j += 8) {
      const v8f v = *reinterpret_cast<const v8f*>(x + j);
      m = v > m ? v : m;
    }
    for (int i = 0; i < 8; ++i) mx = std::max(mx, m[i]);
  }
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

#if defined(__AVX512F__)
constexpr bool kWideVectors = true;  // 512-bit registers: v16f is one register
#else
constexpr bool kWideVectors = false;
#endif

// The mix's passes over the values: W vectors of d at a time (R * W sums in registers), so that a pass reads a
// contiguous quarter or half of each value row rather than one 64-byte line of it, 96 rows ahead of it prefetched
// (on Zen 5 one row's attention over 28 layers at 8,000 positions, prefetched, 12.8-13.3 -> 11.6-12.2 ms with four
// 16-value vectors a pass instead of one: docs/bench/attention-prefetch-zen5.md). Each lane is still one d's sum
// over the keys in order.
template <int R>
constexpr int kMixVectors16 = R <= 6 ? 4 : 2;  // 32 registers: 24 sums, 4 values, a probability
template <int R>
constexpr int kMixVectors8 = R <= 6 ? 2 : 1;  // 16 registers (AVX2): 12 sums, 2 values, a probability

// head_mix for D a multiple of 16: 16 values of d at a time. Each lane is one d's sum over the keys in order,
// the same products added in the same order as head_mix's: the same values in half the instructions where
// registers are 512 bits wide (two 256-bit halves elsewhere). Not head_mix with the vector type as a template
// parameter: GCC drops a typedef's attributes there (aligned(4), may_alias), and the loads of unaligned rows then
// assume 64-byte alignment (it crashed the tests).
template <int R>
inline void head_mix16(const float* p, int64_t S, const float* values, int64_t v_stride, int64_t len, int64_t D,
                       float* acc) {
  constexpr int W = kMixVectors16<R>;
  int64_t d = 0;
  for (; d + 16 * W <= D; d += 16 * W) {
    v16f sum[R][W] = {};
    for (int64_t j = 0; j < len; ++j) {
      const float* row = values + j * v_stride + d;
      prefetch_floats(row + kValuePrefetchRows * v_stride, 16 * W);
      v16f v[W];
      for (int w = 0; w < W; ++w) v[w] = *reinterpret_cast<const v16f*>(row + 16 * w);
      for (int r = 0; r < R; ++r) {
        const float pr = p[r * S + j];
        for (int w = 0; w < W; ++w) sum[r][w] += pr * v[w];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < W; ++w) *reinterpret_cast<v16f*>(acc + r * D + d + 16 * w) = sum[r][w];
  }
  for (; d < D; d += 16) {  // what is left of D, one vector a pass
    v16f sum[R] = {};
    for (int64_t j = 0; j < len; ++j) {
      prefetch_floats(values + (j + kValuePrefetchRows) * v_stride + d, 16);
      const v16f v = *reinterpret_cast<const v16f*>(values + j * v_stride + d);
      for (int r = 0; r < R; ++r) sum[r] += p[r * S + j] * v;
    }
    for (int r = 0; r < R; ++r) *reinterpret_cast<v16f*>(acc + r * D + d) = sum[r];
  }
}


// acc[r * D + d] = sum_j p[r * S + j] * values[j * v_stride + d] for R heads, 8 values of d at a time
// with the R heads' sums side by side in registers.
template <int R>
inline void head_mix(const float* p, int64_t S, const float* values, int64_t v_stride, int64_t len, int64_t D,
                     float* acc) {
  constexpr int W = kMixVectors8<R>;
  int64_t d = 0;
  for (; d + 8 * W <= D; d += 8 * W) {
    v8f sum[R][W] = {};
    for (int64_t j = 0; j < len; ++j) {
      const float* row = values + j * v_stride + d;
      prefetch_floats(row + kValuePrefetchRows * v_stride, 8 * W);
      v8f v[W];
      for (int w = 0; w < W; ++w) v[w] = *reinterpret_cast<const v8f*>(row + 8 * w);
      for (int r = 0; r < R; ++r) {
        const float pr = p[r * S + j];
        for (int w = 0; w < W; ++w) sum[r][w] += pr * v[w];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < W; ++w) *reinterpret_cast<v8f*>(acc + r * D + d + 8 * w) = sum[r][w];
  }
  for (; d < D; d += 8) {  // what is left of D, one vector a pass
    v8f sum[R] = {};
    for (int64_t j = 0; j < len; ++j) {
      prefetch_floats(values + (j + kValuePrefetchRows) * v_stride + d, 8);
      const v8f v = *reinterpret_cast<const v8f*>(values + j * v_stride + d);
      for (int r = 0; r < R; ++r) sum[r] += p[r * S + j] * v;
    }
    for (int r = 0; r < R; ++r) *reinterpret_cast<v8f*>(acc + r * D + d) = sum[r];
  }
}


inline void head_mix_any(int64_t R, const float* p, int64_t S, const float* values, int64_t v_stride, int64_t len,
                         int64_t D, float* acc) {
  std::fill(acc, acc + R * D, 0.f);
  for (int64_t j = 0; j < len; ++j) {
    const float* vr = values + j * v_stride;
    prefetch_floats(vr + kKeyPrefetchRows * v_stride, D);  // whole rows, as the scores read keys
    for (int64_t r = 0; r < R; ++r) {
      const float pj = p[r * S + j];
      float* ar = acc + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ar[d] += pj * vr[d];
    }
  }
}

// The same for any R and D: one head at a time.
inline void head_dots_any(int64_t R, const float* q0, int64_t q_stride, const float* key, int64_t D, float scale,
                          float* scores, int64_t S) {
  for (int64_t r = 0; r < R; ++r) {
    const float* qr = q0 + r * q_stride;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qr[d] * key[d];
    scores[r * S] = dot * scale;
  }
}

}  // namespace

namespace QDOT_NAMESPACE::native {

at::Tensor block_rms_norm(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = w_in.contiguous();
  check_f32(x, "x");
  check_f32(w, "w");
  const int64_t D = w.numel();
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == D, "x's last dimension must be ", D);
  at::Tensor out = at::empty_like(x);
  const int64_t rows = D ? x.numel() / D : 0;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * D;
      float* orow = op + r * D;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += xr[d] * xr[d];
      const float inv = 1.f / std::sqrt(acc / static_cast<float>(D) + feps);
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) orow[d] = xr[d] * inv * wp[d];
    }
  });
  return out;
}

at::Tensor block_rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in, bool neox) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 3, "x must be [n, heads, D]");
  const at::Tensor cs = cos_in.contiguous();
  const at::Tensor sn = sin_in.contiguous();
  check_f32(cs, "cos");
  check_f32(sn, "sin");
  const int64_t n = x.size(0), heads = x.size(1), D = x.size(2), half = D / 2;
  TORCH_CHECK(D % 2 == 0 && cs.numel() == n * half && sn.numel() == n * half,
              "cos/sin must hold n * D/2 = ", n * half, " values");
  at::Tensor out = at::empty({n, heads, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cs.data_ptr<float>();
  const float* sp = sn.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  at::parallel_for(0, n * heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / heads, h = t % heads;
      const float* xr = xp + i * s0 + h * s1;
      const float* c = cp + i * half;
      const float* s = sp + i * half;
      float* orow = op + t * D;
      if (neox) {
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const float a = xr[j], b = xr[j + half];
          orow[j] = a * c[j] - b * s[j];
          orow[j + half] = b * c[j] + a * s[j];
        }
      } else {
        for (int64_t j = 0; j < half; ++j) {
          const float a = xr[2 * j], b = xr[2 * j + 1];
          orow[2 * j] = a * c[j] - b * s[j];
          orow[2 * j + 1] = a * s[j] + b * c[j];
        }
      }
    }
  });
  return out;
}

// Values of a row per block_silu_mul task below 32 rows (a multiple of 16).
constexpr int64_t kSiluSpan = 2048;

// o[j] = silu(g[j]) * u[j] for j in [j0, j1).
inline void silu_mul_span(const float* g, const float* u, float* o, int64_t j0, int64_t j1) {
  int64_t j = j0;
  if constexpr (kWideVectors) {  // sixteen lanes a step (the same values: each lane on its own)
    for (; j + 16 <= j1; j += 16)
      *reinterpret_cast<v16f*>(o + j) = silu_mul<v16f, v16i>(*reinterpret_cast<const v16f*>(g + j),
                                                             *reinterpret_cast<const v16f*>(u + j));
  }
  for (; j + 8 <= j1; j += 8)
    *reinterpret_cast<v8f*>(o + j) = silu_mul<v8f, v8i>(*reinterpret_cast<const v8f*>(g + j),
                                                       *reinterpret_cast<const v8f*>(u + j));
  if (j < j1) store_first(o + j, silu_mul<v8f, v8i>(load_first(g + j, j1 - j), load_first(u + j, j1 - j)), j1 - j);
}

at::Tensor block_silu_mul(const at::Tensor& gate_up_in) {
  const at::Tensor gate_up = gate_up_in.contiguous();
  check_f32(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "gate_up's last dimension must be even");
  const int64_t F = gate_up.size(-1) / 2, rows = F ? gate_up.numel() / (2 * F) : 0;
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = F;
  at::Tensor out = at::empty(shape, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Below 32 rows, tasks of kSiluSpan values of a row, not whole rows: a decode step's eight rows were one task
  // (the other thread waited through it: 0.50 -> 0.29 ms a step of the 1.5B's 28 layers at 8 sequences). Each
  // value on its own, so any split gives the same values.
  if (rows < 32) {
    const int64_t spans = (F + kSiluSpan - 1) / kSiluSpan;
    at::parallel_for(0, rows * spans, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t r = t / spans, j0 = (t % spans) * kSiluSpan;
        silu_mul_span(gp + r * 2 * F, gp + r * 2 * F + F, op + r * F, j0, std::min(F, j0 + kSiluSpan));
      }
    });
  } else {
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) silu_mul_span(gp + r * 2 * F, gp + r * 2 * F + F, op + r * F, 0, F);
    });
  }
  return out;
}

at::Tensor block_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, double scale) {
  return block_attention_segments(q, {keys}, {values}, {q.size(0)}, scale);
}

at::Tensor block_attention_segments(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                                    const std::vector<at::Tensor>& values, const std::vector<int64_t>& lengths,
                                    double scale) {
  check_f32(q, "q");
  const size_t segs = keys.size();
  TORCH_CHECK(segs > 0 && values.size() == segs && lengths.size() == segs, "one keys, values and length per segment");
  TORCH_CHECK(q.dim() == 3, "q must be [n, H, D]");
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = keys[0].dim() == 3 ? keys[0].size(0) : 0;
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "heads: ", H, " query heads over ", Hkv, " key heads");
  // the segment and the row within it of every query row; the longest key range sizes the score buffers
  std::vector<int64_t> seg_of(N), row_in(N);
  int64_t row = 0, S_max = 0;
  for (size_t s = 0; s < segs; ++s) {
    check_f32(keys[s], "keys");
    check_f32(values[s], "values");
    TORCH_CHECK(keys[s].dim() == 3 && values[s].sizes() == keys[s].sizes() && keys[s].size(0) == Hkv &&
                keys[s].size(2) == D, "keys and values must be [Hkv, S, D]");
    const int64_t n = lengths[s], S = keys[s].size(1);
    TORCH_CHECK(n > 0 && S >= n, "attention: ", n, " queries over ", S, " keys");
    for (int64_t i = 0; i < n; ++i, ++row) {
      TORCH_CHECK(row < N, "the segments' lengths must add up to q's rows");
      seg_of[row] = static_cast<int64_t>(s);
      row_in[row] = i;
    }
    S_max = std::max(S_max, S);
  }
  TORCH_CHECK(row == N, "the segments' lengths must add up to q's rows");
  const int64_t rep = H / Hkv;
  at::Tensor out = at::empty({N, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  const float fscale = static_cast<float>(scale);
  // One task per (query row, key head), over every segment at once: a batch of decoding sequences is one
  // parallel region per layer, not one per sequence (a region's start and end cost more than a decode row's
  // attention). Each task is computed as block_attention computes it alone, so the values are the same.
  // Tasks go out one at a time (parallel.h): a prompt chunk's later rows see more keys than its first ones.
  parallel_chunks(N * Hkv, 1, [&] {
    return [&, scores = std::vector<float>(rep * S_max), acc = std::vector<float>(rep * D),
            q_pairs = std::vector<float>(2 * rep * D),
            sums = std::vector<float>(rep)](int64_t begin, int64_t end) mutable {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t r = t / Hkv, g = t % Hkv, s = seg_of[r], i = row_in[r];
        const at::Tensor& ks = keys[s];
        const at::Tensor& vs = values[s];
        const int64_t S = ks.size(1), len = S - lengths[s] + i + 1;
        const float* kg = ks.data_ptr<float>() + g * ks.stride(0);
        const float* vg = vs.data_ptr<float>() + g * vs.stride(0);
        const int64_t ks1 = ks.stride(1), vs1 = vs.stride(1);
        const float* q0 = qp + r * qs0 + g * rep * qs1;
        switch (D % 8 ? 0 : rep) {
          case 1: head_scores<1>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 2: head_scores<2>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 3: head_scores<3>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 4: head_scores<4>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 5: head_scores<5>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 6: head_scores<6>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 7: head_scores<7>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          case 8: head_scores<8>(q0, qs1, kg, ks1, len, D, fscale, scores.data(), S_max, q_pairs.data()); break;
          default:
            for (int64_t j = 0; j < len; ++j) {
              prefetch_floats(kg + (j + kKeyPrefetchRows) * ks1, D);
              head_dots_any(rep, q0, qs1, kg + j * ks1, D, fscale, scores.data() + j, S_max);
            }
            break;
        }
        for (int64_t h = 0; h < rep; ++h) {
          float* sr = scores.data() + h * S_max;
          const float mx = row_max(sr, len);
          v8f vsum = {};
          int64_t j = 0;
          if constexpr (kWideVectors) {  // exponents sixteen lanes a step, added eight at a time as below
            for (; j + 16 <= len; j += 16) {
              const v16f e = exp_nonpositive_lanes<v16f, v16i>(*reinterpret_cast<const v16f*>(sr + j) - mx);
              *reinterpret_cast<v16f*>(sr + j) = e;
              vsum += __builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7);
              vsum += __builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15);
            }
          }
          for (; j + 8 <= len; j += 8) {
            const v8f e = exp_nonpositive(*reinterpret_cast<const v8f*>(sr + j) - mx);
            *reinterpret_cast<v8f*>(sr + j) = e;
            vsum += e;
          }
          float sum = hsum(vsum);
          if (j < len) {
            store_first(sr + j, exp_nonpositive(load_first(sr + j, len - j) - mx), len - j);
            for (; j < len; ++j) sum += sr[j];
          }
          sums[h] = sum;
        }
        // 1-8: head_mix<R>, 9-16: head_mix16<R - 8> (D a multiple of 16, 512-bit builds: on 256-bit ones its
        // pairs of halves spill and ran 2.7x slower), 0: the general loop
        switch (D % 8 || rep > 8 ? 0 : D % 16 || !kWideVectors ? rep : 8 + rep) {
          case 1: head_mix<1>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 2: head_mix<2>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 3: head_mix<3>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 4: head_mix<4>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 5: head_mix<5>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 6: head_mix<6>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 7: head_mix<7>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 8: head_mix<8>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 9: head_mix16<1>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 10: head_mix16<2>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 11: head_mix16<3>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 12: head_mix16<4>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 13: head_mix16<5>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 14: head_mix16<6>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 15: head_mix16<7>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          case 16: head_mix16<8>(scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
          default: head_mix_any(rep, scores.data(), S_max, vg, vs1, len, D, acc.data()); break;
        }
        for (int64_t h = 0; h < rep; ++h) {
          const float inv = 1.f / sums[h];
          float* orow = op + (r * H + g * rep + h) * D;
          const float* ar = acc.data() + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) orow[d] = ar[d] * inv;
        }
      }
    };
  });
  return out;
}

}  // namespace QDOT_NAMESPACE::native

using QDOT_NAMESPACE::native::block_attention;
using QDOT_NAMESPACE::native::block_rms_norm;
using QDOT_NAMESPACE::native::block_rope;
using QDOT_NAMESPACE::native::block_silu_mul;

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("block_rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("block_rope(Tensor x, Tensor cos, Tensor sin, bool neox) -> Tensor");
  m.def("block_attention(Tensor q, Tensor keys, Tensor values, float scale) -> Tensor");
  m.def("block_silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("block_rms_norm", &block_rms_norm);
  m.impl("block_rope", &block_rope);
  m.impl("block_attention", &block_attention);
  m.impl("block_silu_mul", &block_silu_mul);
}
