// Integer dot-product linear layer over GGUF quantization codes (the way llama.cpp's CPU backend
// multiplies quantized weights): weights stay as their unsigned 4- or 8-bit codes with one scale
// (and optionally one zero) per group of 16 or 32 along K; each activation row is quantized to
// int8 per 32 values; every group's dot product is an integer sum (AVX512-VNNI vpdpbusd: unsigned
// weight bytes x signed activation bytes), scaled once per group in f32. Codes of 5 and 6 bits
// are stored in 5 and 6 bits (a nibble plane plus a 1- or 2-bit plane) and widened in registers.
//
//   w[n, k] = s[n, g] * u[n, k] + z[n, g]        (zeros given)     g = k / G
//   w[n, k] = s[n, g] * (u[n, k] - offset)       (no zeros)
//   x[m, k] ~ dx[m, k / 32] * q[m, k]            q int8, dx = max|x| / 127 over the 32 values
//   y[m, n] = sum_g s[n,g] * sum_{k in g} dx * u * q  +  sum_g z[n,g] * dx * sum_{k in g} q
//
// Layouts (built by engine/linear.py's pack_codes from engine/dequant.py's integer_codes), codes
// uint8 [N, K * BITS / 8], (BITS, G) one of (4, 32), (5, 32), (6, 16), (8, 32):
//   8: code k at byte k.
//   4, 5, 6: each 128 values take 16 * BITS bytes. First 64 bytes of nibbles: byte j holds the low
//           4 bits of value j (low nibble) and of value 64 + j (high nibble), so one 512-bit load
//           unpacks to two 64-value chunks. Then for 5 bits a 16-byte plane with bit i (byte i / 8,
//           bit i % 8) = bit 4 of value i; for 6 bits two 16-byte planes (values 0-63, 64-127)
//           where byte j holds bits 4-5 of values j, 16 + j, 32 + j, 48 + j in bit pairs 0-1 ...
//           6-7. A last 64 values (K % 128 == 64) take 8 * BITS bytes: 32 bytes of nibbles (byte j
//           = values j and 32 + j), then the plane for those 64 values.
//   scales, zeros: float16 [N, K/G].
//
// Why this and not torch's int4/int8 weight-only kernels: those take bf16 activations and
// convert every weight to floating point; on this project's 2-core AVX-512 VM (no AMX) the 1.5B's
// linear layers ran at 8.7 GB/s with them and at 12-14 GB/s here (README "Performance"), and the
// model no longer converts activations to bf16 around every layer. Q5_0/Q8_0/Q6_K tensors also keep
// their own codes instead of an int8 requantization.
//
// From `gemm_min_rows` activation rows on (prompts), weight tiles are dequantized to f32 and
// multiplied with MKL instead: the integer path's cost grows with every row.
//
// The op is registered as torch.ops.tandem.qdot_linear and parallelised with at::parallel_for
// (torch's own thread pool, so num_thread settings apply). Without AVX512-VNNI a scalar loop
// computes the same integer sums (correct, slow: engine/kernels/__init__.py's qdot_fast() then
// says no and the engine's default format stays on torch's kernels).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define QDOT_AVX512_VNNI 1
#else
#define QDOT_AVX512_VNNI 0
#endif

namespace {

constexpr int64_t kActGroup = 32;  // activation quantization group
constexpr int64_t kChunk = 64;     // values per inner step (one 512-bit register of bytes)
constexpr int kMaxRows = 4;        // activation rows sharing one pass over a weight row
constexpr int64_t kPrefetchRows = 2;  // weight rows ahead that the vector path prefetches

// One activation block quantized for the kernel.
struct QuantizedActivations {
  int64_t m = 0, k = 0, n_groups = 0;  // n_groups: weight groups along K (K / G)
  std::vector<int8_t> q;               // [m, k]
  std::vector<float> dx;               // [m, k/32]: the scale of each 32 quantized values
  std::vector<float> group_term;       // [m, K/G]: dx * sum of q over each weight group
};

float half_to_float(uint16_t h) {
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

QuantizedActivations quantize_activations(const float* x, int64_t m, int64_t k, int64_t group) {
  QuantizedActivations a;
  a.m = m;
  a.k = k;
  a.n_groups = k / group;
  a.q.resize(m * k);
  a.dx.resize(m * (k / kActGroup));
  a.group_term.resize(m * a.n_groups);
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * k;
    int8_t* qr = a.q.data() + r * k;
    for (int64_t b = 0; b < k / kActGroup; ++b) {
      const float* xb = xr + b * kActGroup;
      float amax = 0.f;
      for (int i = 0; i < kActGroup; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float dx = amax / 127.f;
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int8_t* qb = qr + b * kActGroup;
      for (int i = 0; i < kActGroup; ++i) qb[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
      a.dx[r * (k / kActGroup) + b] = dx;
      for (int64_t g0 = b * kActGroup; g0 < (b + 1) * kActGroup; g0 += group) {
        int32_t sum = 0;
        for (int64_t i = g0; i < g0 + group; ++i) sum += qr[i];
        a.group_term[r * a.n_groups + g0 / group] = dx * static_cast<float>(sum);
      }
    }
  }
  return a;
}

#if QDOT_AVX512_VNNI

// The kernel walks K in pairs of 64-value chunks (128 values, 16 * BITS bytes of codes), then a
// last single chunk (8 * BITS bytes) when K is an odd multiple of 64. See the layout comment at
// the top: low nibbles, then the 1-bit (5-bit codes) or 2-bit (6-bit codes) high planes.

// The high bits (BITS 5: one, BITS 6: two) of 64 values from their plane, as byte values << 4.
template <int BITS>
inline __m512i high_bits(const uint8_t* plane) {
  if constexpr (BITS == 5) {
    uint64_t bits;
    std::memcpy(&bits, plane, 8);  // bit j = value j
    return _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(0x10));
  } else {
    // byte j of the 16 holds values j, 16 + j, 32 + j, 48 + j in bit pairs 0-1, 2-3, 4-5, 6-7: copy
    // it to all four 128-bit lanes and shift lane l right by 2 l
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
    const __m512i shifts = _mm512_set_epi32(0x60006, 0x60006, 0x60006, 0x60006, 0x40004, 0x40004, 0x40004, 0x40004,
                                            0x20002, 0x20002, 0x20002, 0x20002, 0, 0, 0, 0);  // 16-bit counts
    const __m512i two = _mm512_and_si512(_mm512_srlv_epi16(v, shifts), _mm512_set1_epi8(0x03));
    return _mm512_slli_epi16(two, 4);  // per byte at most 0x30: nothing crosses into the next byte
  }
}

// Unsigned weight bytes of 64-value chunks c and c + 1 (c even).
template <int BITS>
inline void load_code_pair(const uint8_t* row, int64_t c, __m512i& w0, __m512i& w1) {
  const uint8_t* p = row + (c / 2) * 16 * BITS;
  if constexpr (BITS == 8) {
    w0 = _mm512_loadu_si512(p);
    w1 = _mm512_loadu_si512(p + 64);
  } else {
    const __m512i raw = _mm512_loadu_si512(p);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    w0 = _mm512_and_si512(raw, m4);
    w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if constexpr (BITS == 5 || BITS == 6) {
      w0 = _mm512_or_si512(w0, high_bits<BITS>(p + 64));
      w1 = _mm512_or_si512(w1, high_bits<BITS>(p + 64 + 8 * (BITS - 4)));
    }
  }
}

// Unsigned weight bytes of the single chunk c (the last one of a row).
template <int BITS>
inline __m512i load_code_single(const uint8_t* row, int64_t c) {
  const uint8_t* p = row + (c / 2) * 16 * BITS;
  if constexpr (BITS == 8) {
    return _mm512_loadu_si512(p);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(raw, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    if constexpr (BITS == 5 || BITS == 6) return _mm512_or_si512(w, high_bits<BITS>(p + 32));
    return w;
  }
}

// Lane index vectors: which of a chunk's scales each int32 lane (4 values) uses, the chunk's
// scales starting at register lane `first`.
template <int G>
inline __m512i scale_index(int first) {
  if constexpr (G == 32) {
    return _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
  } else {
    return _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
  }
}

// n f16 values (n = 2, 4 or 8) from p, widened into the low lanes of a zeroed register.
template <int n>
inline __m512 load_halves(const uint16_t* p) {
  if constexpr (n == 2) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits))));
  } else if constexpr (n == 4) {
    uint64_t bits;
    std::memcpy(&bits, p, 8);
    return _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(bits))));
  } else {
    return _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
}

// n f32 values (n = 2, 4 or 8) from p in the low lanes of a zeroed register.
template <int n>
inline __m512 load_floats(const float* p) {
  if constexpr (n == 2) {
    return _mm512_zextps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))));
  } else if constexpr (n == 4) {
    return _mm512_zextps128_ps512(_mm_loadu_ps(p));
  } else {
    return _mm512_zextps256_ps512(_mm256_loadu_ps(p));
  }
}

// Weight scales (one per group, in the low lanes) times the activation scales of the same
// values (one per 32): for groups of 16, each activation scale covers two weight groups.
template <int G, int n_dx>
inline __m512 times_dx(__m512 s, const float* dx) {
  const __m512 d = load_floats<n_dx>(dx);
  if constexpr (G == 32) {
    return _mm512_mul_ps(s, d);
  } else {
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_mul_ps(s, _mm512_permutexvar_ps(dup, d));
  }
}

// acc += f32(sum of 4 products per lane) * combined scale of the lane
inline __m512 dot_step(__m512 acc, __m512i w, const int8_t* xq, __m512 scale) {
  const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(xq));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
}

// MB activation rows against one weight row: y[m, n] without bias. K is walked in pairs of
// 64-value chunks (128 values: one 512-bit load of 4-bit codes), then a last single chunk when K
// is an odd multiple of 64. The zero term (sum_g zero_g * dx * sum q, or -offset * sum_g
// scale_g * dx * sum q) is accumulated in the same pass, so each row ends with one horizontal sum.
template <int BITS, int G, int MB>
inline void row_dots(const uint8_t* w_row, const uint16_t* s_row, const uint16_t* z_row, int64_t offset,
                     const QuantizedActivations& a, int64_t m0, float* out, int64_t prefetch_distance) {
  const int64_t chunks = a.k / kChunk;
  constexpr int groups_per_chunk = 64 / G;
  const int64_t dx_per_row = a.k / kActGroup;
  __m512 acc0[MB], acc1[MB], accz[MB];
  const int8_t* xq[MB];
  const float* dx[MB];
  const float* term[MB];
  for (int i = 0; i < MB; ++i) {
    acc0[i] = _mm512_setzero_ps();
    acc1[i] = _mm512_setzero_ps();
    accz[i] = _mm512_setzero_ps();
    xq[i] = a.q.data() + (m0 + i) * a.k;
    dx[i] = a.dx.data() + (m0 + i) * dx_per_row;
    term[i] = a.group_term.data() + (m0 + i) * a.n_groups;
  }
  const __m512i first = scale_index<G>(0), second = scale_index<G>(groups_per_chunk);
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    // Software prefetch of the same place a few rows ahead: one core's hardware prefetchers
    // alone keep too few lines in flight (measured +15-20 % GB/s with 2 threads).
    const uint8_t* ahead = w_row + prefetch_distance + (c / 2) * 16 * BITS;
    _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
    if constexpr (BITS > 4) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T0);
    __m512i w0, w1;
    load_code_pair<BITS>(w_row, c, w0, w1);
    const __m512 s = load_halves<2 * groups_per_chunk>(s_row + c * groups_per_chunk);
    const __m512 z = z_row ? load_halves<2 * groups_per_chunk>(z_row + c * groups_per_chunk) : s;
    for (int i = 0; i < MB; ++i) {
      // scales times activation scales first, then spread over lanes: the activation scales stay
      // one float per 32 values (four rows of lane-expanded ones measured no faster, and at
      // K = 8960 they no longer fit in L1 next to the codes)
      const __m512 sd = times_dx<G, 4>(s, dx[i] + c * 2);
      acc0[i] = dot_step(acc0[i], w0, xq[i] + c * kChunk, _mm512_permutexvar_ps(first, sd));
      acc1[i] = dot_step(acc1[i], w1, xq[i] + (c + 1) * kChunk, _mm512_permutexvar_ps(second, sd));
      accz[i] = _mm512_fmadd_ps(z, load_floats<2 * groups_per_chunk>(term[i] + c * groups_per_chunk), accz[i]);
    }
  }
  if (c < chunks) {
    const __m512i w0 = load_code_single<BITS>(w_row, c);
    const __m512 s = load_halves<groups_per_chunk>(s_row + c * groups_per_chunk);
    const __m512 z = z_row ? load_halves<groups_per_chunk>(z_row + c * groups_per_chunk) : s;
    for (int i = 0; i < MB; ++i) {
      const __m512 sd = _mm512_permutexvar_ps(first, times_dx<G, 2>(s, dx[i] + c * 2));
      acc0[i] = dot_step(acc0[i], w0, xq[i] + c * kChunk, sd);
      accz[i] = _mm512_fmadd_ps(z, load_floats<groups_per_chunk>(term[i] + c * groups_per_chunk), accz[i]);
    }
  }
  const __m512 zcoef = _mm512_set1_ps(z_row ? 1.f : -static_cast<float>(offset));
  for (int i = 0; i < MB; ++i) {
    out[i] = _mm512_reduce_add_ps(_mm512_fmadd_ps(accz[i], zcoef, _mm512_add_ps(acc0[i], acc1[i])));
  }
}

template <int BITS, int G>
inline void dispatch_rows(int mb, const uint8_t* w_row, const uint16_t* s_row, const uint16_t* z_row, int64_t offset,
                          const QuantizedActivations& a, int64_t m0, float* out, int64_t prefetch_distance) {
  switch (mb) {
    case 4: row_dots<BITS, G, 4>(w_row, s_row, z_row, offset, a, m0, out, prefetch_distance); break;
    case 3: row_dots<BITS, G, 3>(w_row, s_row, z_row, offset, a, m0, out, prefetch_distance); break;
    case 2: row_dots<BITS, G, 2>(w_row, s_row, z_row, offset, a, m0, out, prefetch_distance); break;
    default: row_dots<BITS, G, 1>(w_row, s_row, z_row, offset, a, m0, out, prefetch_distance); break;
  }
}

#endif  // QDOT_AVX512_VNNI

// Code k of a row in the layout of BITS (the portable path and dequantization).
template <int BITS>
inline int32_t code_at(const uint8_t* row, int64_t k, int64_t row_len) {
  if constexpr (BITS == 8) {
    return row[k];
  } else {
    const int64_t pair = k / 128;
    const uint8_t* p = row + pair * 16 * BITS;
    const bool full = (pair + 1) * 128 <= row_len;
    const int64_t j = k % 128, half = full ? 64 : 32;  // nibble pairs: (j, j + half)
    const uint8_t byte = p[j % half];
    int32_t u = j < half ? (byte & 0x0F) : (byte >> 4);
    const uint8_t* plane = p + (full ? 64 : 32);
    if constexpr (BITS == 5) {
      u |= ((plane[j / 8] >> (j % 8)) & 1) << 4;
    } else if constexpr (BITS == 6) {
      const int64_t jj = j % 64;  // 16 plane bytes per 64 values
      u |= ((plane[(j / 64) * 16 + jj % 16] >> (2 * (jj / 16))) & 3) << 4;
    }
    return u;
  }
}

// Portable reference of the same sums (used where the vector path is not compiled in).
template <int BITS, int G>
void row_dots_scalar(const uint8_t* w_row, const uint16_t* s_row, const uint16_t* z_row, int64_t offset,
                     const QuantizedActivations& a, int64_t m0, int mb, float* out) {
  for (int i = 0; i < mb; ++i) {
    const int8_t* xq = a.q.data() + (m0 + i) * a.k;
    const float* dx = a.dx.data() + (m0 + i) * (a.k / kActGroup);
    float acc = 0.f;
    for (int64_t g = 0; g < a.k / G; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * G; k < (g + 1) * G; ++k) {
        sum += code_at<BITS>(w_row, k, a.k) * xq[k];
      }
      acc += half_to_float(s_row[g]) * dx[g * G / kActGroup] * static_cast<float>(sum);
      const float term = a.group_term[(m0 + i) * a.n_groups + g];
      acc += (z_row ? half_to_float(z_row[g]) : -static_cast<float>(offset) * half_to_float(s_row[g])) * term;
    }
    out[i] = acc;
  }
}

template <int BITS, int G>
void run(const QuantizedActivations& a, const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros,
         int64_t offset, const float* bias, int64_t n, float* y) {
  const int64_t row_bytes = a.k * BITS / 8;
  const int64_t n_groups = a.k / G;
  // Enough rows per task that scheduling costs stay small next to the work (~64k weights).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / a.k);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    float dots[kMaxRows];
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* w_row = codes + r * row_bytes;
      const uint16_t* s_row = scales + r * n_groups;
      const uint16_t* z_row = zeros ? zeros + r * n_groups : nullptr;
      // prefetching past the last row is harmless (prefetches never fault) but pointless
      const int64_t ahead = r + kPrefetchRows < end ? kPrefetchRows : 0;
#if QDOT_AVX512_VNNI
      for (int64_t b = 0; b < n_groups * 2; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(s_row + ahead * n_groups) + b, _MM_HINT_T0);
        if (z_row) _mm_prefetch(reinterpret_cast<const char*>(z_row + ahead * n_groups) + b, _MM_HINT_T0);
      }
#endif
      for (int64_t m0 = 0; m0 < a.m; m0 += kMaxRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, a.m - m0));
#if QDOT_AVX512_VNNI
        dispatch_rows<BITS, G>(mb, w_row, s_row, z_row, offset, a, m0, dots, ahead * row_bytes);
#else
        row_dots_scalar<BITS, G>(w_row, s_row, z_row, offset, a, m0, mb, dots);
#endif
        for (int i = 0; i < mb; ++i) y[(m0 + i) * n + r] = bias ? dots[i] + bias[r] : dots[i];
      }
    }
  });
}

// Weight rows [r0, r1) as f32 [r1 - r0, K] (the GEMM path and the tests' check of the layout).
template <int BITS, int G>
void dequantize_rows(const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros, int64_t offset, int64_t k,
                     int64_t r0, int64_t r1, float* out) {
  const int64_t row_bytes = k * BITS / 8;
  const int64_t n_groups = k / G;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = codes + r * row_bytes;
    float* o = out + (r - r0) * k;
    const uint16_t* s_row = scales + r * n_groups;
    const uint16_t* z_row = zeros ? zeros + r * n_groups : nullptr;
    int64_t done = 0;
#if QDOT_AVX512_VNNI
    // the kernel's own unpacking, then 16 values at a time: bytes -> f32 -> * scale + zero
    auto store_chunk = [&](__m512i codes64, int64_t k0) {
      for (int q = 0; q < 4; ++q) {
        const int64_t g = (k0 + 16 * q) / G;
        const float sc = half_to_float(s_row[g]);
        const float zr = z_row ? half_to_float(z_row[g]) : -static_cast<float>(offset) * sc;
        const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes64, q)));
        _mm512_storeu_ps(o + k0 + 16 * q, _mm512_fmadd_ps(v, _mm512_set1_ps(sc), _mm512_set1_ps(zr)));
      }
    };
    const int64_t chunks = k / kChunk;
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      __m512i w0, w1;
      load_code_pair<BITS>(w, c, w0, w1);
      store_chunk(w0, c * kChunk);
      store_chunk(w1, (c + 1) * kChunk);
    }
    if (c < chunks) store_chunk(load_code_single<BITS>(w, c), c * kChunk);
    done = k;
#endif
    for (int64_t g = done / G; g < n_groups; ++g) {
      const float sc = half_to_float(s_row[g]);
      const float zr = z_row ? half_to_float(z_row[g]) : -static_cast<float>(offset) * sc;
      for (int64_t i = g * G; i < (g + 1) * G; ++i) o[i] = static_cast<float>(code_at<BITS>(w, i, k)) * sc + zr;
    }
  }
}

void dequantize_dispatch(int64_t bits, int64_t group, const uint8_t* c, const uint16_t* s, const uint16_t* z,
                         int64_t offset, int64_t k, int64_t r0, int64_t r1, float* out) {
  if (bits == 4) dequantize_rows<4, 32>(c, s, z, offset, k, r0, r1, out);
  else if (bits == 5) dequantize_rows<5, 32>(c, s, z, offset, k, r0, r1, out);
  else if (bits == 6) dequantize_rows<6, 16>(c, s, z, offset, k, r0, r1, out);
  else dequantize_rows<8, 32>(c, s, z, offset, k, r0, r1, out);
}

// Many activation rows (a prompt): the integer path's cost grows with every row, so instead
// tiles of weight rows are dequantized to f32 and multiplied with MKL's GEMM, whose cost per row
// is a small fraction of a weight pass. y^T[tile] = W[tile] @ x^T, tile by tile.
at::Tensor gemm_path(const at::Tensor& x, const uint8_t* c, const uint16_t* s, const uint16_t* z, int64_t bits,
                     int64_t group, int64_t offset, int64_t n) {
  const int64_t k = x.size(1);
  const int64_t tile = std::max<int64_t>(64, (int64_t{1} << 20) / k);  // about 4 MB of f32 weights
  at::Tensor yt = at::empty({n, x.size(0)}, x.options());
  at::Tensor w = at::empty({std::min(tile, n), k}, x.options());
  const at::Tensor xt = x.t();
  for (int64_t r0 = 0; r0 < n; r0 += tile) {
    const int64_t r1 = std::min(n, r0 + tile);
    float* wp = w.data_ptr<float>();
    at::parallel_for(r0, r1, 8, [&](int64_t b, int64_t e) {
      dequantize_dispatch(bits, group, c, s, z, offset, k, b, e, wp + (b - r0) * k);
    });
    at::Tensor yt_tile = yt.narrow(0, r0, r1 - r0);
    at::mm_out(yt_tile, w.narrow(0, 0, r1 - r0), xt);
  }
  return yt.t().contiguous();
}

at::Tensor qdot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t bits, int64_t group, int64_t offset,
                       const std::optional<at::Tensor>& bias, int64_t gemm_min_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "qdot: x must be contiguous f32 [M, K]");
  TORCH_CHECK((bits == 4 && group == 32) || (bits == 5 && group == 32) || (bits == 6 && group == 16) ||
              (bits == 8 && group == 32), "qdot: (bits, group) must be (4, 32), (5, 32), (6, 16) or (8, 32)");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % kChunk == 0, "qdot: K must be a multiple of 64, got ", k);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2, "qdot: codes must be contiguous uint8 [N, *]");
  const int64_t n = codes.size(0);
  TORCH_CHECK(codes.size(1) == k * bits / 8, "qdot: codes have ", codes.size(1), " bytes per row for K = ", k);
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == n && scales.size(1) == k / group,
              "qdot: scales must be contiguous f16 [N, K/G]");
  const bool has_zeros = zeros.numel() > 0;
  if (has_zeros) {
    TORCH_CHECK(zeros.scalar_type() == at::kHalf && zeros.is_contiguous() && zeros.sizes() == scales.sizes(),
                "qdot: zeros must be contiguous f16 like scales");
  }
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n, "qdot: bias must be f32 [N]");
    bias_ptr = bias->data_ptr<float>();
  }
  if (m >= gemm_min_rows && m > 0 && n > 0) {
    at::Tensor y = gemm_path(x, codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>()),
                             has_zeros ? reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>()) : nullptr,
                             bits, group, offset, n);
    if (bias_ptr) y.add_(*bias);
    return y;
  }
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const QuantizedActivations a = quantize_activations(x.data_ptr<float>(), m, k, group);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* z = has_zeros ? reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>()) : nullptr;
  float* out = y.data_ptr<float>();
  if (bits == 4) run<4, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 5) run<5, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 6) run<6, 16>(a, c, s, z, offset, bias_ptr, n, out);
  else run<8, 32>(a, c, s, z, offset, bias_ptr, n, out);
  return y;
}

// The weights as f32 [N, K], straight from the kernel's layout (tests and debugging).
at::Tensor qdot_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                           int64_t group, int64_t offset) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2, "qdot: codes must be contiguous uint8 [N, *]");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous(), "qdot: scales must be contiguous f16");
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "qdot: bits must be 4, 5, 6 or 8");
  const int64_t n = codes.size(0), k = codes.size(1) * 8 / bits;
  at::Tensor out = at::empty({n, k}, codes.options().dtype(at::kFloat));
  dequantize_dispatch(bits, group, codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>()),
                      zeros.numel() ? reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>()) : nullptr, offset, k,
                      0, n, out.data_ptr<float>());
  return out;
}

// Which code path this build runs: the loader reports it and picks defaults from it.
std::string qdot_isa() {
  return QDOT_AVX512_VNNI ? "avx512vnni" : "scalar";
}

}  // namespace

// The op namespace: "tandem" normally; the portable test build (no AVX-512) gets its own so that
// both can be loaded into one process and compared.
#ifndef QDOT_NAMESPACE
#define QDOT_NAMESPACE tandem
#endif

TORCH_LIBRARY(QDOT_NAMESPACE, m) {
  m.def("qdot_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int bits, int group, int offset, Tensor? bias, int gemm_min_rows) -> Tensor");
  m.def("qdot_dequantize(Tensor codes, Tensor scales, Tensor zeros, int bits, int group, int offset) -> Tensor");
  m.def("qdot_isa() -> str", &qdot_isa);
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("qdot_linear", &qdot_linear);
  m.impl("qdot_dequantize", &qdot_dequantize);
}
