// Integer dot-product linear layer over GGUF quantization codes (the way llama.cpp's CPU backend
// multiplies quantized weights): weights stay as their unsigned 4-, 5-, 6- or 8-bit codes with one
// scale (and optionally one zero) per group of 16 or 32 along K; each activation row is quantized
// to int8, per 32 values against f16-scaled weights (Q8_0's rule) and per 256 against K-quants (Q8_K's);
// every group's dot product is an integer sum (AVX512-VNNI vpdpbusd: unsigned weight bytes x signed
// activation bytes), scaled in f32 once per group (f16 scales) or once per super-block (K-quants, whose
// 8-bit scale and min codes multiply the group sums as integers first).
//
//   w[n, k] = s[n, g] * u[n, k] + z[n, g]        (zeros given)     g = k / G
//   w[n, k] = s[n, g] * (u[n, k] - offset)       (no zeros)
//   x[m, k] ~ dx[m, k / B] * q[m, k]            q int8, dx = max|x| / 127 over the B values (B: 32 or 256)
//   y[m, n] = sum_g s[n,g] * sum_{k in g} dx * u * q  +  sum_g z[n,g] * dx * sum_{k in g} q
//   K-quants (s = d[n, j] sc[n, g], z = -dmin[n, j] m[n, g] in super-block j):
//   y[m, n] = sum_j dx_j (d * sum_{g in j} sc * sum u q  -  dmin * sum_{g in j} m * sum q)
//
// Layout: weight rows in blocks of 16, so that each 32-bit lane of a register holds one row and a
// block's 16 outputs come out of the registers with no horizontal sums; the float work (convert,
// scale, zero term) is then once per (row block, group or super-block, activation row) instead of once
// per 64 codes, which keeps verifying a few speculative tokens nearly as cheap as decoding one.
// (BITS, G) is one of (4, 32), (5, 32), (6, 16), (8, 32). Built by engine/ops/linear.py's pack_codes:
//   codes  uint8 [N/16 (rounded up), K/8, 16 * BITS]: for each 8 values k0..k0+7 of the 16 rows, two
//          64-byte "slots" (values k0..k0+3, then k0+4..k0+7), byte 4 r + j of a slot = row r's
//          value j. 8 bits: the two slots as they are. 4, 5, 6 bits: 64 bytes of nibbles (low nibble
//          = first slot, high = second), then the high bits: 5 bits, 16 bytes for both slots (bit
//          4 s + l of byte b = bit 4 of slot s's byte 16 l + b, l = 0..3: each 16-byte quarter of a
//          slot reads one bit position of the same 16 bytes, so a vector path takes it with one
//          shift and one mask, where a bit per byte in order took five instructions); 6 bits, 16
//          bytes per slot (byte i holds bits 4-5 of slot bytes i, 16 + i, 32 + i, 48 + i in bit
//          pairs 0-1 ... 6-7).
//   scales, zeros  one value per (block, group, row) [N/16, K/G, 16], in one of two kinds:
//          f16 values (the group's scale and zero themselves), or, for K-quants (Q4_K, Q5_K, Q6_K),
//          the GGUF's own small integer codes (int8 scales for Q6_K, uint8 scales and mins for
//          Q4_K/Q5_K) with
//   supers float16 [N/16, K/256, S, 16]: each row's super-block factors (S = 1: d; S = 2: d, -dmin),
//          scale = d * sc, zero = -dmin * m, as ggml computes them. This keeps the bytes read per
//          token at the GGUF's own (Q4_K 4.625 bits a weight against its 4.5, Q6_K 6.5625 as the
//          file) instead of 5 and 7 with f16 per-group values. Padding rows: 0.
//
// Prompts go through the same integer path, four activation rows per pass over a weight block
// (measured 2x faster at 128 rows than dequantizing to f32 for MKL's GEMM, and every width then
// rounds the same way, so a prefix computed in one chunk or token by token gives the same cache).
//
// The op is registered as torch.ops.tandem.qdot_linear and parallelised with at::parallel_for
// (torch's own thread pool, so num_thread settings apply). The vector path is chosen by the build's
// -march: AVX512-VNNI, else AVX2 (vpmaddubsw + vpmaddwd, same sums and the same float steps in the
// same order, so both give the same outputs), else a scalar loop computes the same integer sums
// (correct, slow: engine/ops/kernels/__init__.py's qdot_fast() then says no and the engine's
// default format stays on torch's kernels).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "native.h"
#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// One vector path is compiled in, chosen by the build's -march: AVX512-VNNI, else AVX2 (with FMA and
// F16C: x86-64-v3, e.g. AMD Zen 2/3), else the portable loop.
#if defined(QDOT_EMULATE_AVX512)
// Test builds only (engine/ops/kernels/__init__.py's "avx512-emulated" variant): the AVX-512 path
// compiled for an AVX2 host over SIMDe's portable versions of its intrinsics, so that a host without
// AVX-512 can check that path's sums and float steps against the AVX2 path's, bit for bit.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <immintrin.h>
#include <simde/x86/avx512.h>
// What SIMDe 0.7 lacks, lane by lane (conversions are exact or round as the instructions do); the
// mask conversion is a plain integer there.
#include <cstdint>
namespace qdot_emulated {
template <typename T, typename F>
inline simde__m512i widen_bytes(simde__m128i v, F f) {
  T in[16];
  int32_t out[16];
  simde_mm_storeu_si128(in, v);
  for (int i = 0; i < 16; ++i) out[i] = f(in[i]);
  return simde_mm512_loadu_si512(out);
}
inline simde__m512i cvtepi8_epi32(simde__m128i v) { return widen_bytes<int8_t>(v, [](int8_t b) { return int32_t{b}; }); }
inline simde__m512i cvtepu8_epi32(simde__m128i v) { return widen_bytes<uint8_t>(v, [](uint8_t b) { return int32_t{b}; }); }
inline simde__m512 cvtepi32_ps(simde__m512i v) {
  int32_t in[16];
  float out[16];
  simde_mm512_storeu_si512(in, v);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(in[i]);
  return simde_mm512_loadu_ps(out);
}
inline simde__m512 cvtph_ps(simde__m256i v) {
  uint16_t in[16];
  float out[16];
  simde_mm256_storeu_si256(in, v);
  for (int i = 0; i < 16; ++i) out[i] = _cvtsh_ss(in[i]);
  return simde_mm512_loadu_ps(out);
}
}  // namespace qdot_emulated
#define _mm512_cvtepi8_epi32 qdot_emulated::cvtepi8_epi32
#define _mm512_cvtepu8_epi32 qdot_emulated::cvtepu8_epi32
#define _mm512_cvtepi32_ps qdot_emulated::cvtepi32_ps
#define _mm512_cvtph_ps qdot_emulated::cvtph_ps
#define _cvtu64_mask64(b) static_cast<simde__mmask64>(b)
#define QDOT_AVX512_VNNI 1
#define QDOT_AVX2 0
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define QDOT_AVX512_VNNI 1
#define QDOT_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QDOT_AVX512_VNNI 0
#define QDOT_AVX2 1
#else
#define QDOT_AVX512_VNNI 0
#define QDOT_AVX2 0
#endif

namespace {

constexpr int64_t kActGroup = 32;  // activation quantization group of the f16-scaled layouts (Q8_0's rule)
constexpr int64_t kSuper = 256;    // values per super-block along K: K-quants' activation block (Q8_K's rule)
constexpr int kMaxRows = 4;        // activation rows sharing one pass over a weight block
// AVX-512 has 32 vector registers: a verification of up to seven drafts (eight rows) shares one pass,
// so the block's codes are unpacked once for all of them, and so does one of eight drafts (nine rows,
// only as a last pass: see rows_in_pass).
constexpr int kMaxWideRows = 8;
constexpr int64_t kBlockRows = 16;  // weight rows per block (one per 32-bit lane)
// How far ahead in a block's codes the vector path prefetches. Measured on Zen 5 (docs/bench/prefetch-distance-zen5.md):
// 8 KiB ahead against 2 KiB made the 1.5B's eight-row forward 1.50x -> 1.23-1.26x one row's on the AVX-512 path
// (its ffn_gate linears 6.7-6.9 -> 5.6-5.7 ms) and about 6 % cheaper on the AVX2 one, one row and prompts as fast;
// 4 KiB was half way, 16 KiB no better. Prefetches past a buffer's end are harmless (they never fault).
constexpr int64_t kPrefetchBytes = 8192;

// One activation block quantized for the kernel.
struct QuantizedActivations {
  int64_t m = 0, k = 0, n_groups = 0;  // n_groups: weight groups along K (K / G)
  int64_t block = kActGroup;           // values per activation scale: 32, or kSuper for K-quants (Q8_K's rule)
  std::vector<int8_t> q;               // [m, k]
  std::vector<float> dx;               // [m, k/block]: the scale of each block of quantized values
  std::vector<float> dx_steps;         // [k/block, m] (K-quants): the same, the rows of each block side by side
  std::vector<float> group_term;       // [m, K/G] (f16 layouts): dx * sum of q over each weight group
  std::vector<int32_t> group_qsum;     // [m, K/G]: the sum of q itself (the AVX2 path's 8-bit codes, K-quants' mins)
  std::vector<float> group_dx_term;    // [K/G, m, 2] (f16 layouts): per group and row, its dx and group_term
  std::vector<int8_t> q_steps;         // [K/8, m, 8]: q with the rows of each 8 values side by side
                                       // (these three: the AVX2 path reads all rows from one pointer)
  std::vector<int32_t> pair_offsets;   // [K/16, m] (Q6_K): two int16, kCentre times the sum
                                       // of q over the group's values k % 4 < 2, then k % 4 >= 2 (the
                                       // AVX2 path's centred 6-bit codes, one int16 lane pair per row)
  std::vector<int32_t> qsum_pairs;     // [K/64, m] (K-quants with groups of 32): two int16, the sums of q
                                       // over groups 2p and 2p + 1 (at most 32 x 127), for vpmaddwd with
                                       // the two groups' min codes
};

float half_to_float(uint16_t h) {
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

// How a block's group scales are stored (the template parameter SC of the kernels).
constexpr int kScaleF16 = 0;    // scales (and zeros) are f16 values
constexpr int kScaleInt8 = 1;   // scales are int8 codes times the super-block's d (Q6_K)
constexpr int kScaleUint8 = 2;  // scales and zeros are uint8 codes times d and -dmin (Q4_K, Q5_K)
// The offset of 6-bit codes with int8 scale codes (Q6_K: w = d * sc * (u - 32)). Their sums are taken
// centred, sum (u - 32) q, which stays within int16 over a group's 16 values (8 per int16 lane, at
// most 8 x 32 x 127) and is then scaled by the integer sc: with the scale and offset of each 16 folded
// into an exact integer, a super-block's sixteen groups add up before its one float step.
constexpr int32_t kCentre = 32;

// One block of 16 weight rows' group scales: pointers into scales, zeros and supers.
struct BlockScales {
  const void* s;          // [K/G, 16] f16 values or 8-bit codes
  const void* z;          // [K/G, 16] like s (uint8 codes for kScaleUint8), or nullptr: offset
  const uint16_t* sup;    // [K/256, S, 16] f16, or nullptr (kScaleF16)
  int64_t sup_stride;     // S * 16
};

// Scale and zero of one (row, group) entry i of a block's scales/zeros: w = scale * code + zero.
struct ScaleZero {
  float scale, zero;
};

template <int SC, int G>
inline ScaleZero scale_zero(const BlockScales& b, int64_t i, int64_t offset) {
  float sc, zero = 0.f;
  if constexpr (SC == kScaleF16) {
    sc = half_to_float(static_cast<const uint16_t*>(b.s)[i]);
    if (b.z) zero = half_to_float(static_cast<const uint16_t*>(b.z)[i]);
  } else {
    const int64_t g = i / 16, r = i % 16;
    const uint16_t* sup = b.sup + (g * G / kSuper) * b.sup_stride;
    const float code = SC == kScaleInt8 ? static_cast<float>(static_cast<const int8_t*>(b.s)[i])
                                        : static_cast<float>(static_cast<const uint8_t*>(b.s)[i]);
    sc = half_to_float(sup[r]) * code;
    if (b.z) zero = half_to_float(sup[16 + r]) * static_cast<float>(static_cast<const uint8_t*>(b.z)[i]);
  }
  if (!b.z) zero = -static_cast<float>(offset) * sc;
  return {sc, zero};
}

#if QDOT_AVX512_VNNI || QDOT_AVX2
// One block of n values (32 or 256), as the scalar loop below quantizes it (the same amax, the same
// products rounded half to even, so the same bytes): 8 values a step instead of one. Returns dx; the
// sums of q over each 16 values go to sums16. Serial before every linear, the scalar loop cost a
// verification forward of the 1.5B about a millisecond (5 x 8960 values per down projection).
inline float quantize_block(const float* xb, int64_t n, int8_t* qb, int32_t* sums16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8)
    mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), abs_mask), mx);  // a NaN is skipped, as std::max(amax, |x|) does
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  for (int64_t b = 0; b < n; b += 32) {
    __m256i r[4];
    for (int i = 0; i < 4; ++i)
      r[i] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + b + 8 * i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    // the packs work per 128-bit lane: put the eight 4-byte pieces back in order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + b),
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int h = 0; h < 2; ++h) {
      const __m256i s8 = _mm256_add_epi32(r[2 * h], r[2 * h + 1]);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      sums16[b / 16 + h] = _mm_cvtsi128_si32(s4);
    }
  }
  return amax / 127.f;
}
#endif

// x [m, k] quantized to int8 per `block` values (32: Q8_0's rule, for f16-scaled weights; kSuper: Q8_K's,
// for K-quants, whose integer sums then run over a whole super-block before one float step), with the sums
// the kernels for weight groups of `group` values read.
QuantizedActivations quantize_activations(const float* x, int64_t m, int64_t k, int64_t group, int64_t block) {
  QuantizedActivations a;
  a.m = m;
  a.k = k;
  a.n_groups = k / group;
  a.block = block;
  const int64_t blocks = k / block;
  a.q.resize(m * k);
  a.dx.resize(m * blocks);
  if (block == kActGroup) a.group_term.resize(m * a.n_groups);  // f16 layouts' zero terms
  a.group_qsum.resize(m * a.n_groups);
  // Rows on their own (the same bytes whichever thread rounds them), in parallel from 32 rows on: a prompt
  // chunk's quantization, serial, was 5 % of its forward.
  at::parallel_for(0, m, 32, [&](int64_t r_begin, int64_t r_end) {
    std::vector<int32_t> sums16(block / 16);  // of q over each 16 values of a block
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* xr = x + r * k;
      int8_t* qr = a.q.data() + r * k;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = xr + b * block;
        int8_t* qb = qr + b * block;
#if QDOT_AVX512_VNNI || QDOT_AVX2
        const float dx = quantize_block(xb, block, qb, sums16.data());
#else
        float amax = 0.f;
        for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float dx = amax / 127.f;
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        for (int64_t i = 0; i < block; ++i) qb[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
        for (int64_t h = 0; h < block / 16; ++h) {
          sums16[h] = 0;
          for (int64_t i = 16 * h; i < 16 * h + 16; ++i) sums16[h] += qb[i];
        }
#endif
        a.dx[r * blocks + b] = dx;
        const int64_t per = block / group;  // weight groups in this block
        for (int64_t j = 0; j < per; ++j) {
          const int32_t sum = group == 16 ? sums16[j] : sums16[2 * j] + sums16[2 * j + 1];
          if (block == kActGroup) a.group_term[r * a.n_groups + b * per + j] = dx * static_cast<float>(sum);
          a.group_qsum[r * a.n_groups + b * per + j] = sum;
        }
      }
    }
  });
  if (block == kSuper) {  // the K-quant kernels' per-super-block dx, rows side by side
    a.dx_steps.resize(m * blocks);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < m; ++r) a.dx_steps[b * m + r] = a.dx[r * blocks + b];
  }
#if QDOT_AVX2  // only the AVX2 path reads the rows interleaved by step
  a.q_steps.resize(m * k);
  for (int64_t s = 0; s < k / 8; ++s) {
    for (int64_t r = 0; r < m; ++r) std::memcpy(a.q_steps.data() + (s * m + r) * 8, a.q.data() + r * k + s * 8, 8);
  }
#endif
  if (QDOT_AVX2 && group == 16 && block == kSuper) {  // Q6_K's centred int16 offsets: the AVX2 path's alone
    a.pair_offsets.resize(a.n_groups * m);
    for (int64_t g = 0; g < a.n_groups; ++g) {
      for (int64_t r = 0; r < m; ++r) {
        const int8_t* qg = a.q.data() + r * k + g * 16;
        int32_t lo = 0, hi = 0;
        for (int j = 0; j < 16; ++j) (j % 4 < 2 ? lo : hi) += qg[j];
        // at most 8 x 127 x 32 = 32512 each: an int16
        const uint32_t packed = static_cast<uint16_t>(static_cast<int16_t>(kCentre * lo)) |
                                static_cast<uint32_t>(static_cast<uint16_t>(static_cast<int16_t>(kCentre * hi))) << 16;
        a.pair_offsets[g * m + r] = static_cast<int32_t>(packed);
      }
    }
  }
  if (group == 32 && block == kSuper) {  // Q4_K, Q5_K: the mins' sums of q, two groups a lane
    a.qsum_pairs.resize(a.n_groups / 2 * m);
    for (int64_t p = 0; p < a.n_groups / 2; ++p) {
      for (int64_t r = 0; r < m; ++r) {
        const int32_t* qs = a.group_qsum.data() + r * a.n_groups + 2 * p;
        a.qsum_pairs[p * m + r] = static_cast<int32_t>(static_cast<uint16_t>(static_cast<int16_t>(qs[0])) |
                                                       static_cast<uint32_t>(static_cast<uint16_t>(static_cast<int16_t>(qs[1]))) << 16);
      }
    }
  }
  if (QDOT_AVX2 && block == kActGroup) {  // the AVX2 f16 kernel's per-group dx and term, rows side by side
    a.group_dx_term.resize(a.n_groups * m * 2);
    for (int64_t g = 0; g < a.n_groups; ++g) {
      for (int64_t r = 0; r < m; ++r) {
        a.group_dx_term[(g * m + r) * 2] = a.dx[r * blocks + g * group / kActGroup];
        a.group_dx_term[(g * m + r) * 2 + 1] = a.group_term[r * a.n_groups + g];
      }
    }
  }
  return a;
}

#if QDOT_AVX512_VNNI

// The high bits (BITS 5: one, BITS 6: two) of a 64-byte slot from its plane, as byte values << 4
// (BITS 5: slot `slot` of the step's shared plane).
template <int BITS>
inline __m512i high_bits(const uint8_t* plane, int slot) {
  if constexpr (BITS == 5) {
    // quarter l of slot s reads bit 4 s + l of the plane's 16 bytes: copied to all four 128-bit lanes,
    // lane l's bit moved to bit 4 (left by 4 - l for the first slot, right by l for the second; a
    // 32-bit shift of at most 4 brings nothing into bit 4 from a neighbouring byte)
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
    const __m512i moved = slot ? _mm512_srlv_epi32(v, _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0))
                               : _mm512_sllv_epi32(v, _mm512_set_epi32(1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4));
    return _mm512_and_si512(moved, _mm512_set1_epi8(0x10));
  } else {
    // byte i of the 16 holds slot bytes i, 16 + i, 32 + i, 48 + i in bit pairs 0-1 ... 6-7: copy it
    // to all four 128-bit lanes and shift lane l right by 2 l
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
    const __m512i shifts = _mm512_set_epi32(0x60006, 0x60006, 0x60006, 0x60006, 0x40004, 0x40004, 0x40004, 0x40004,
                                            0x20002, 0x20002, 0x20002, 0x20002, 0, 0, 0, 0);  // 16-bit counts
    const __m512i two = _mm512_and_si512(_mm512_srlv_epi16(v, shifts), _mm512_set1_epi8(0x03));
    return _mm512_slli_epi16(two, 4);  // per byte at most 0x30: nothing crosses into the next byte
  }
}

// The two slots (16 rows x values k0..k0+3, then k0+4..k0+7) at p, as unsigned bytes.
template <int BITS>
inline void load_slots(const uint8_t* p, __m512i& w0, __m512i& w1) {
  if constexpr (BITS == 8) {
    w0 = _mm512_loadu_si512(p);
    w1 = _mm512_loadu_si512(p + 64);
  } else {
    const __m512i raw = _mm512_loadu_si512(p);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    w0 = _mm512_and_si512(raw, m4);
    w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if constexpr (BITS == 5) {
      w0 = _mm512_or_si512(w0, high_bits<5>(p + 64, 0));
      w1 = _mm512_or_si512(w1, high_bits<5>(p + 64, 1));
    } else if constexpr (BITS == 6) {
      w0 = _mm512_or_si512(w0, high_bits<6>(p + 64, 0));
      w1 = _mm512_or_si512(w1, high_bits<6>(p + 80, 1));
    }
  }
}

inline __m512i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// The 16 rows' f16 scale and zero of group g: vector form of scale_zero (K-quants' 8-bit codes take
// block_dots_kquant and block_dots_centred instead).
template <int SC, int G>
inline void group_scales(const BlockScales& b, int64_t g, const __m512& neg_offset, __m512& sv, __m512& zv) {
  static_assert(SC == kScaleF16, "8-bit scale codes are summed per super-block");
  sv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(b.s) + g * 16)));
  zv = b.z ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(b.z) + g * 16)))
           : _mm512_mul_ps(sv, neg_offset);
}

// The integer sums of one weight group (the G values from k_begin of the block's 16 rows) against MB
// activation rows: one int32 per row and lane, sum u q over the group. G a template parameter: the group's
// steps unrolled (a loop of two or four steps per group, with its exit, cost more than its work at eight rows).
template <int BITS, int MB, int G>
inline void group_sums(const uint8_t* w_block, const int8_t* const* xq, int64_t k_begin, __m512i* sums) {
  constexpr int64_t slot_bytes = 16 * BITS;  // per 8 values of the 16 rows
  // One row keeps two sums, two independent dot chains in flight. From two rows on the rows give the
  // independent chains, and one sum a row measured faster at two to four rows for 4- and 6-bit codes
  // (docs/measurements.md, "qdot kernel") and leaves the registers for eight rows' sums and float
  // accumulators. Integer sums: the same either way.
  constexpr bool kTwoChains = MB == 1;
  __m512i sum0[MB], sum1[kTwoChains ? MB : 1];
  for (int i = 0; i < MB; ++i) {
    sum0[i] = _mm512_setzero_si512();
    if constexpr (kTwoChains) sum1[i] = _mm512_setzero_si512();
  }
#pragma GCC unroll 4
  for (int step = 0; step < G / 8; ++step) {
    const int64_t k0 = k_begin + 8 * step;
    const uint8_t* p = w_block + (k0 / 8) * slot_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
    if constexpr (BITS > 4) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64), _MM_HINT_T0);
    __m512i w0, w1;
    load_slots<BITS>(p, w0, w1);
    for (int i = 0; i < MB; ++i) {
      sum0[i] = _mm512_dpbusd_epi32(sum0[i], w0, broadcast4(xq[i] + k0));
      if constexpr (kTwoChains) {
        sum1[i] = _mm512_dpbusd_epi32(sum1[i], w1, broadcast4(xq[i] + k0 + 4));
      } else {
        sum0[i] = _mm512_dpbusd_epi32(sum0[i], w1, broadcast4(xq[i] + k0 + 4));
      }
    }
  }
  for (int i = 0; i < MB; ++i) sums[i] = kTwoChains ? _mm512_add_epi32(sum0[i], sum1[i]) : sum0[i];
}

// MB activation rows against one block of 16 weight rows: out[i * 16 + r] = y[m0 + i, block row r]
// without bias.
template <int BITS, int G, int SC, int MB>
inline void block_dots(const uint8_t* w_block, const BlockScales& bs, int64_t offset,
                       const QuantizedActivations& a, int64_t m0, float* out) {
  const int64_t dx_per_row = a.k / kActGroup;
  __m512 acc[MB];
  const int8_t* xq[MB];
  const float* dx[MB];
  const float* term[MB];
  for (int i = 0; i < MB; ++i) {
    acc[i] = _mm512_setzero_ps();
    xq[i] = a.q.data() + (m0 + i) * a.k;
    dx[i] = a.dx.data() + (m0 + i) * dx_per_row;
    term[i] = a.group_term.data() + (m0 + i) * a.n_groups;
  }
  const __m512 neg_offset = _mm512_set1_ps(-static_cast<float>(offset));
  for (int64_t g = 0; g < a.n_groups; ++g) {
    __m512i sums[MB];
    group_sums<BITS, MB, G>(w_block, xq, g * G, sums);
    __m512 sv, zv;
    group_scales<SC, G>(bs, g, neg_offset, sv, zv);
    for (int i = 0; i < MB; ++i) {
      const __m512 scale = _mm512_mul_ps(sv, _mm512_set1_ps(dx[i][g * G / kActGroup]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i]), scale, acc[i]);
      acc[i] = _mm512_fmadd_ps(zv, _mm512_set1_ps(term[i][g]), acc[i]);
    }
  }
  for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * 16, acc[i]);
}

// K-quants' activation scales: one dx per super-block of 256 values (Q8_K's rule), so that a row's
// integer sums run over the whole super-block and the float steps come once per 256 values instead of
// once per group (docs/bench/kernel-paths-zen5.md: those steps were most of the cost of a wide forward).
//
// Q4_K, Q5_K (uint8 scale and min codes sc, m; w = d sc u - dmin m): per super-block and row,
//   isum = sum_g sc_g sum_{k in g} u q,   msum = sum_g m_g sum_{k in g} q   (exact int32)
//   y += isum * (d dx) + msum * (-dmin dx)
template <int BITS, int MB>
inline void block_dots_kquant(const uint8_t* w_block, const BlockScales& bs, const QuantizedActivations& a,
                              int64_t m0, float* out) {
  constexpr int64_t kGroups = kSuper / 32;  // groups of 32 per super-block
  const int64_t supers = a.k / kSuper;
  __m512 acc[MB];
  const int8_t* xq[MB];
  for (int i = 0; i < MB; ++i) {
    acc[i] = _mm512_setzero_ps();
    xq[i] = a.q.data() + (m0 + i) * a.k;
  }
  const uint8_t* sc_codes = static_cast<const uint8_t*>(bs.s);
  const uint8_t* m_codes = static_cast<const uint8_t*>(bs.z);
  for (int64_t sb = 0; sb < supers; ++sb) {
    __m512i isum[MB];
    for (int i = 0; i < MB; ++i) isum[i] = _mm512_setzero_si512();
    for (int64_t j = 0; j < kGroups; ++j) {
      const int64_t g = sb * kGroups + j;
      __m512i sums[MB];
      group_sums<BITS, MB, 32>(w_block, xq, g * 32, sums);
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc_codes + g * 16)));
      for (int i = 0; i < MB; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(sums[i], sc));
    }
    const uint16_t* sup = bs.sup + sb * bs.sup_stride;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
    const __m512 zd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 16)));
    __m512i mins[kGroups / 2];  // the min codes of groups 2p, 2p + 1 as the two int16 of each lane
    for (int64_t p = 0; p < kGroups / 2; ++p) {
      const int64_t g = sb * kGroups + 2 * p;
      const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m_codes + g * 16)));
      const __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m_codes + g * 16 + 16)));
      mins[p] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
    const int32_t* qpairs = a.qsum_pairs.data() + sb * (kGroups / 2) * a.m + m0;
    const float* dxs = a.dx_steps.data() + sb * a.m + m0;
    for (int i = 0; i < MB; ++i) {
      __m512i msum = _mm512_setzero_si512();
      for (int64_t p = 0; p < kGroups / 2; ++p)
        msum = _mm512_dpwssd_epi32(msum, mins[p], _mm512_set1_epi32(qpairs[p * a.m + i]));
      const __m512 dxv = _mm512_set1_ps(dxs[i]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_mul_ps(d, dxv), acc[i]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(zd, dxv), acc[i]);
    }
  }
  for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * 16, acc[i]);
}

// 6-bit codes with int8 scale codes (Q6_K; see kCentre): each group's centred integer sum
// sc * (sum u q - 32 sum q), a super-block's sixteen groups added exactly, then one float step per
// 256 values: y += (sum as f32) * (d * dx).
template <int MB>
inline void block_dots_centred(const uint8_t* w_block, const BlockScales& bs, const QuantizedActivations& a,
                               int64_t m0, float* out) {
  constexpr int64_t kGroups = kSuper / 16;
  __m512 acc[MB];
  const int8_t* xq[MB];
  const int32_t* qsum[MB];
  for (int i = 0; i < MB; ++i) {
    acc[i] = _mm512_setzero_ps();
    xq[i] = a.q.data() + (m0 + i) * a.k;
    qsum[i] = a.group_qsum.data() + (m0 + i) * a.n_groups;
  }
  for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
    __m512i isum[MB];
    for (int i = 0; i < MB; ++i) isum[i] = _mm512_setzero_si512();
    for (int64_t j = 0; j < kGroups; ++j) {
      const int64_t g = sb * kGroups + j;
      __m512i sums[MB];
      group_sums<6, MB, 16>(w_block, xq, g * 16, sums);
      const __m512i sc = _mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(bs.s) + g * 16)));
      for (int i = 0; i < MB; ++i) {
        const __m512i centred = _mm512_sub_epi32(sums[i], _mm512_set1_epi32(kCentre * qsum[i][g]));
        isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(centred, sc));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs.sup + sb * bs.sup_stride)));
    const float* dxs = a.dx_steps.data() + sb * a.m + m0;
    for (int i = 0; i < MB; ++i)
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_mul_ps(d, _mm512_set1_ps(dxs[i])), acc[i]);
  }
  for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * 16, acc[i]);
}

#endif  // QDOT_AVX512_VNNI

#if QDOT_AVX2

// AVX2 has no byte dot product into 32 bits: vpmaddubsw multiplies unsigned weight bytes by signed
// activation bytes and adds pairs into saturating int16, vpmaddwd with ones adds those pairs into
// int32. A 256-bit register holds half a block (8 rows, one per 32-bit lane: bytes 0-31 or 32-63 of
// a 64-byte slot). Codes of at most 6 bits never saturate
// (2 x 63 x 127 per pair), and int16 sums are carried over kI16Steps 8-value steps before they are
// widened, as long as they stay below 32767. 8-bit codes would saturate: they are recentred to
// signed (u - 128) and multiplied as |w| times x with w's sign (at most 2 x 128 x 127), and the
// 128 taken away is given back in the integer sum (+ 128 x the group's sum of q), so the float
// steps see the AVX-512 path's integers.

// The high bits (BITS 5: one, BITS 6: two) of half h of a 64-byte slot from its plane, as byte
// values << 4 (BITS 5: slot `slot` of the step's shared plane).
template <int BITS>
inline __m256i high_bits_half(const uint8_t* plane, int slot, int h) {
  if constexpr (BITS == 5) {
    // quarters 2 h and 2 h + 1 of slot s read bits 4 s + 2 h and 4 s + 2 h + 1 of the plane's 16 bytes
    // (see the AVX-512 high_bits): each moved to bit 4 of its byte by one shift per 128-bit lane
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
    const int j = 4 * slot + 2 * h;  // the first lane's bit; the second lane's is j + 1
    const __m256i moved = j < 4 ? _mm256_sllv_epi32(v, _mm256_set_epi32(3 - j, 3 - j, 3 - j, 3 - j, 4 - j, 4 - j, 4 - j, 4 - j))
                                : _mm256_srlv_epi32(v, _mm256_set_epi32(j - 3, j - 3, j - 3, j - 3, j - 4, j - 4, j - 4, j - 4));
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
  } else {
    // byte i of the 16 holds slot bytes i, 16 + i, 32 + i, 48 + i in bit pairs 0-1 ... 6-7: half h
    // is slot bytes 32 h .. 32 h + 31, pairs 2 h and 2 h + 1, each moved to bits 4-5 of its byte
    // (left by 4 and 2, right by 0 and 2); what the 32-bit shift brings in from a neighbouring byte
    // lands outside 0x30
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
    const __m256i moved = h ? _mm256_srlv_epi32(v, _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0))
                            : _mm256_sllv_epi32(v, _mm256_set_epi32(2, 2, 2, 2, 4, 4, 4, 4));
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x30));
  }
}

// Half h of the two slots (8 rows x values k0..k0+3, then k0+4..k0+7) at p, as unsigned bytes.
template <int BITS>
inline void load_half_slots(const uint8_t* p, int h, __m256i& w0, __m256i& w1) {
  if constexpr (BITS == 8) {
    w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
    w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 + 32 * h));
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    w0 = _mm256_and_si256(raw, m4);
    w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if constexpr (BITS == 5) {
      w0 = _mm256_or_si256(w0, high_bits_half<5>(p + 64, 0, h));
      w1 = _mm256_or_si256(w1, high_bits_half<5>(p + 64, 1, h));
    } else if constexpr (BITS == 6) {
      w0 = _mm256_or_si256(w0, high_bits_half<6>(p + 64, 0, h));
      w1 = _mm256_or_si256(w1, high_bits_half<6>(p + 80, 1, h));
    }
  }
}

inline __m256i broadcast4_avx2(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

// Pairwise int16 products of weight bytes w (8 rows x 4 values) and activations x.
template <int BITS>
inline __m256i pair_products(const __m256i& w, const __m256i& x) {
  if constexpr (BITS == 8) {
    const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));  // u - 128
    return _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(x, ws));
  } else {
    return _mm256_maddubs_epi16(w, x);
  }
}

// The 8 rows' f16 scale and zero of group g in half h: vector form of scale_zero (K-quants' 8-bit codes take
// block_dots_kquant and block_dots_centred instead).
template <int BITS, int SC, int G>
inline void half_group_scales(const BlockScales& b, int64_t g, int h, const __m256& neg_offset, __m256& sv,
                              __m256& zv) {
  static_assert(SC == kScaleF16, "8-bit scale codes are summed per super-block");
  const int64_t i = g * 16 + 8 * h;
  sv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(b.s) + i)));
  zv = b.z ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(b.z) + i)))
           : _mm256_mul_ps(sv, neg_offset);
}

// One run of a weight group's sums (the block's 16 rows, as two halves of 8) over kI16Steps 8-value steps from
// k_begin, against MB activation rows (q_steps at xq): int16 lane pairs (int32 for 8-bit codes, whose runs are
// one step). Each 8-value step unpacks both halves of the block once and every row takes its two activation
// broadcasts against all four (each broadcast serves 16 rows, and the block is read as one stream). The steps
// are unrolled, with an empty asm between them (below): without it GCC formed all of a run's products first and
// spilled most of them, and how many depended on the caller it was inlined into (the same source ran 0.81 or
// 1.3 TSC cycles per 32 weights and row).
template <int BITS, int MB, int kI16Steps>
inline void run_sums16(const uint8_t* w_block, const int8_t* xq, int64_t m, int64_t k_begin, __m256i (&s16)[MB][2]) {
  constexpr int64_t slot_bytes = 16 * BITS;
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i) s16[i][0] = s16[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int step = 0; step < kI16Steps; ++step) {
    const int64_t k = k_begin + 8 * step;
    const uint8_t* p = w_block + (k / 8) * slot_bytes;
    const int8_t* xs = xq + (k / 8) * 8 * m;
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
    if constexpr (BITS > 4) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64), _MM_HINT_T0);
    __m256i w00, w10, w01, w11;  // w{slot}{half}
    load_half_slots<BITS>(p, 0, w00, w10);
    load_half_slots<BITS>(p, 1, w01, w11);
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m256i x0 = broadcast4_avx2(xs + 8 * i);
      const __m256i x1 = broadcast4_avx2(xs + 8 * i + 4);
      if constexpr (BITS == 8) {
        const auto widened = [&](const __m256i& wa, const __m256i& wb) {
          return _mm256_add_epi32(_mm256_madd_epi16(pair_products<8>(wa, x0), ones),
                                  _mm256_madd_epi16(pair_products<8>(wb, x1), ones));
        };
        s16[i][0] = _mm256_add_epi32(s16[i][0], widened(w00, w10));  // int32 already
        s16[i][1] = _mm256_add_epi32(s16[i][1], widened(w01, w11));
      } else if constexpr (MB >= 4) {
        // each product into its sum as it is formed: one register less per row than adding the two
        // products first, which at four and five rows spilled sums (the same integers: int16 sums
        // that never overflow add in any order)
        s16[i][0] = _mm256_add_epi16(s16[i][0], pair_products<BITS>(w00, x0));
        s16[i][1] = _mm256_add_epi16(s16[i][1], pair_products<BITS>(w01, x0));
        s16[i][0] = _mm256_add_epi16(s16[i][0], pair_products<BITS>(w10, x1));
        s16[i][1] = _mm256_add_epi16(s16[i][1], pair_products<BITS>(w11, x1));
      } else {
        s16[i][0] = _mm256_add_epi16(s16[i][0], _mm256_add_epi16(pair_products<BITS>(w00, x0),
                                                                 pair_products<BITS>(w10, x1)));
        s16[i][1] = _mm256_add_epi16(s16[i][1], _mm256_add_epi16(pair_products<BITS>(w01, x0),
                                                                 pair_products<BITS>(w11, x1)));
      }
    }
    // An empty asm that takes and gives back every sum: a step's products are then added before the
    // next step's are formed, instead of a run's products being formed first and spilled
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) __asm__("" : "+x"(s16[i][0]), "+x"(s16[i][1]));
  }
}

// MB activation rows against one block of 16 weight rows (f16 group scales): out[i * 16 + r] = y[m0 + i,
// block row r] without bias, a group's runs from run_sums16. Not inlined, so that its code does not depend
// on where it is called from. The activations come interleaved by step (q_steps) and a group's dx and term
// of every row side by side (group_dx_term): all rows are reached from one pointer each. The float steps per
// group are those of the AVX-512 path, in its order.
template <int BITS, int G, int SC, int MB>
[[gnu::noinline]] void block_dots(const uint8_t* w_block, const BlockScales& bs, int64_t offset,
                                  const QuantizedActivations& a, int64_t m0, float* out) {
  constexpr int kI16Steps = BITS == 4 ? 4 : BITS == 5 ? 2 : 1;  // 8-value steps summed in int16
  constexpr int kRuns = G / (8 * kI16Steps);                     // int16 runs per group
  static_assert(G % (8 * kI16Steps) == 0, "a group holds whole int16 runs");
  const int8_t* xq = a.q_steps.data() + m0 * 8;  // step s, row i: [s * 8 m + 8 i]
  const float* dx_term = a.group_dx_term.data() + m0 * 2;  // group g, row i: [g * 2 m + 2 i], then its term
  const __m256 neg_offset = _mm256_set1_ps(-static_cast<float>(offset));
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[MB][2][8] = {};  // [activation row][half]: touched once per group, so kept in memory
  for (int64_t g = 0; g < a.n_groups; ++g) {
    __m256i sum[MB][2];
#pragma GCC unroll 4
    for (int run = 0; run < kRuns; ++run) {
      __m256i s16[MB][2];
      run_sums16<BITS, MB, kI16Steps>(w_block, xq, a.m, g * G + 8 * run * kI16Steps, s16);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        for (int h = 0; h < 2; ++h) {
          const __m256i s = BITS == 8 ? s16[i][h] : _mm256_madd_epi16(s16[i][h], ones);
          sum[i][h] = run == 0 ? s : _mm256_add_epi32(sum[i][h], s);
        }
      }
    }
    __m256 sv[2], zv[2];
    half_group_scales<BITS, SC, G>(bs, g, 0, neg_offset, sv[0], zv[0]);
    half_group_scales<BITS, SC, G>(bs, g, 1, neg_offset, sv[1], zv[1]);
    const float* gd = dx_term + g * a.m * 2;
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m256 dxv = _mm256_broadcast_ss(gd + 2 * i);
      const __m256 term = _mm256_broadcast_ss(gd + 2 * i + 1);
      for (int h = 0; h < 2; ++h) {
        __m256i s = sum[i][h];
        if constexpr (BITS == 8) {  // sum (u - 128) q + 128 sum q = sum u q, exactly
          s = _mm256_add_epi32(s, _mm256_set1_epi32(128 * a.group_qsum[(m0 + i) * a.n_groups + g]));
        }
        const __m256 scale = _mm256_mul_ps(sv[h], dxv);
        __m256 acc_v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, _mm256_load_ps(acc[i][h]));
        acc_v = _mm256_fmadd_ps(zv[h], term, acc_v);
        _mm256_store_ps(acc[i][h], acc_v);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * 16 + 8 * h, _mm256_load_ps(acc[i][h]));
}

// Eight 8-bit scale codes (one half of a group's 16 rows) in both int16 of each row's lane, for
// vpmaddwd: the sum of a lane's two int16 sums times its row's code, in int32.
template <typename T>
inline __m256i codes_in_pairs(const T* codes) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  const __m256i v = std::is_signed_v<T> ? _mm256_cvtepi8_epi32(raw) : _mm256_cvtepu8_epi32(raw);
  return _mm256_or_si256(_mm256_slli_epi32(v, 16), _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)));
}

// Q4_K and Q5_K (see the AVX-512 block_dots_kquant): the same integers, in int16 runs of 32 (4-bit) or
// 16 (5-bit) values times the rows' scale codes by vpmaddwd, and the same float steps, once per 256 values.
// The integer and float accumulators are touched once per run and super-block: kept in memory.
template <int BITS, int MB>
[[gnu::noinline]] void block_dots_kquant(const uint8_t* w_block, const BlockScales& bs, const QuantizedActivations& a,
                                         int64_t m0, float* out) {
  constexpr int kI16Steps = BITS == 4 ? 4 : 2;  // 8-value steps summed in int16 (at most 2 x 31 x 127 a pair)
  constexpr int kRuns = 32 / (8 * kI16Steps);
  constexpr int64_t kGroups = kSuper / 32;
  const int8_t* xq = a.q_steps.data() + m0 * 8;
  const uint8_t* sc_codes = static_cast<const uint8_t*>(bs.s);
  const uint8_t* m_codes = static_cast<const uint8_t*>(bs.z);
  alignas(32) float acc[MB][2][8] = {};
  for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
    alignas(32) int32_t isum[MB][2][8] = {};
    for (int64_t j = 0; j < kGroups; ++j) {
      const int64_t g = sb * kGroups + j;
      const __m256i sc16[2] = {codes_in_pairs(sc_codes + g * 16), codes_in_pairs(sc_codes + g * 16 + 8)};
#pragma GCC unroll 2
      for (int run = 0; run < kRuns; ++run) {
        __m256i s16[MB][2];
        run_sums16<BITS, MB, kI16Steps>(w_block, xq, a.m, g * 32 + run * 8 * kI16Steps, s16);
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i) {
          for (int h = 0; h < 2; ++h) {
            __m256i* t = reinterpret_cast<__m256i*>(isum[i][h]);
            _mm256_store_si256(t, _mm256_add_epi32(_mm256_load_si256(t), _mm256_madd_epi16(s16[i][h], sc16[h])));
          }
        }
      }
    }
    const uint16_t* sup = bs.sup + sb * bs.sup_stride;
    const int32_t* qpairs = a.qsum_pairs.data() + sb * (kGroups / 2) * a.m + m0;
    const float* dxs = a.dx_steps.data() + sb * a.m + m0;
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 8 * h)));
      const __m256 zd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 16 + 8 * h)));
      __m256i mins[kGroups / 2];  // the min codes of groups 2p, 2p + 1 as the two int16 of each lane
      for (int64_t p = 0; p < kGroups / 2; ++p) {
        const uint8_t* mc = m_codes + (sb * kGroups + 2 * p) * 16 + 8 * h;
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mc)));
        const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mc + 16)));
        mins[p] = _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16));
      }
      for (int i = 0; i < MB; ++i) {
        __m256i msum = _mm256_setzero_si256();
        for (int64_t p = 0; p < kGroups / 2; ++p)
          msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(qpairs[p * a.m + i])));
        const __m256 dxv = _mm256_broadcast_ss(dxs + i);
        __m256 acc_v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(isum[i][h]))),
                                       _mm256_mul_ps(d, dxv), _mm256_load_ps(acc[i][h]));
        acc_v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(zd, dxv), acc_v);
        _mm256_store_ps(acc[i][h], acc_v);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * 16 + 8 * h, _mm256_load_ps(acc[i][h]));
}

// 6-bit codes with int8 scale codes (Q6_K; see kCentre), the AVX-512 path's integers and float steps:
// a group's two steps are added in int16 (wrapping: only the centred total must fit, and it does), the
// centring taken away per int16 lane (pair_offsets), then vpmaddwd by the rows' scale codes gives
// sc * sum (u - 32) q in int32, added over the super-block's sixteen groups before its one float step.
template <int MB>
[[gnu::noinline]] void block_dots_centred(const uint8_t* w_block, const BlockScales& bs, const QuantizedActivations& a,
                                          int64_t m0, float* out) {
  constexpr int64_t kGroups = kSuper / 16;
  const int8_t* xq = a.q_steps.data() + m0 * 8;             // step s, row i: [s * 8 m + 8 i]
  const int32_t* offsets = a.pair_offsets.data() + m0;      // group g, row i: [g * m + i]
  const int8_t* sc_codes = static_cast<const int8_t*>(bs.s);
  alignas(32) float acc[MB][2][8] = {};
  for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
    alignas(32) int32_t isum[MB][2][8] = {};
    for (int64_t j = 0; j < kGroups; ++j) {
      const int64_t g = sb * kGroups + j;
      __m256i s16[MB][2];
      run_sums16<6, MB, 2>(w_block, xq, a.m, g * 16, s16);
      const __m256i sc16[2] = {codes_in_pairs(sc_codes + g * 16), codes_in_pairs(sc_codes + g * 16 + 8)};
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        const __m256i centre = _mm256_set1_epi32(offsets[g * a.m + i]);
        for (int h = 0; h < 2; ++h) {
          __m256i* t = reinterpret_cast<__m256i*>(isum[i][h]);
          const __m256i v = _mm256_madd_epi16(_mm256_sub_epi16(s16[i][h], centre), sc16[h]);
          _mm256_store_si256(t, _mm256_add_epi32(_mm256_load_si256(t), v));
        }
      }
    }
    const uint16_t* sup = bs.sup + sb * bs.sup_stride;
    const __m256 d[2] = {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup))),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 8)))};
    const float* dxs = a.dx_steps.data() + sb * a.m + m0;
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const __m256 dxv = _mm256_broadcast_ss(dxs + i);
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(isum[i][h]));
        _mm256_store_ps(acc[i][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(d[h], dxv),
                                                   _mm256_load_ps(acc[i][h])));
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * 16 + 8 * h, _mm256_load_ps(acc[i][h]));
}

#endif  // QDOT_AVX2

#if QDOT_AVX512_VNNI || QDOT_AVX2

// The kernel of a layout for mb activation rows (templates by row count: each keeps its rows' sums in
// registers).
template <template <int> class K, typename... Args>
inline void by_rows(int mb, Args&&... args) {
  switch (mb) {
#if QDOT_AVX512_VNNI
    case 9: K<9>::call(args...); return;
    case 8: K<8>::call(args...); return;
    case 7: K<7>::call(args...); return;
    case 6: K<6>::call(args...); return;
#endif
    case 5: K<5>::call(args...); return;
    case 4: K<4>::call(args...); return;
    case 3: K<3>::call(args...); return;
    case 2: K<2>::call(args...); return;
    default: K<1>::call(args...); return;
  }
}

template <int BITS, int G, int SC>
struct Kernels {
  template <int MB>
  struct F16 {  // f16 group scales: activation scales per 32
    static void call(const uint8_t* w, const BlockScales& bs, int64_t offset, const QuantizedActivations& a, int64_t m0,
                     float* out) {
      block_dots<BITS, G, SC, MB>(w, bs, offset, a, m0, out);
    }
  };
  template <int MB>
  struct KQuant {  // K-quants: activation scales per 256
    static void call(const uint8_t* w, const BlockScales& bs, int64_t, const QuantizedActivations& a, int64_t m0,
                     float* out) {
      if constexpr (SC == kScaleInt8) block_dots_centred<MB>(w, bs, a, m0, out);
      else if constexpr (SC == kScaleUint8 && (BITS == 4 || BITS == 5)) block_dots_kquant<BITS, MB>(w, bs, a, m0, out);
    }
  };
};

template <int BITS, int G, int SC>
inline void dispatch_rows(int mb, const uint8_t* w_block, const BlockScales& bs, int64_t offset,
                          const QuantizedActivations& a, int64_t m0, float* out) {
  if constexpr (SC == kScaleF16) {
    by_rows<Kernels<BITS, G, SC>::template F16>(mb, w_block, bs, offset, a, m0, out);
  } else {
    by_rows<Kernels<BITS, G, SC>::template KQuant>(mb, w_block, bs, offset, a, m0, out);
  }
}

#endif

// Code of block row r, value k, in the layout of BITS (the portable path and dequantization).
template <int BITS>
inline int32_t code_at(const uint8_t* w_block, int64_t r, int64_t k) {
  const uint8_t* p = w_block + (k / 8) * 16 * BITS;
  const int64_t slot = (k % 8) / 4, i = r * 4 + k % 4;  // byte i of the slot
  if constexpr (BITS == 8) {
    return p[slot * 64 + i];
  } else {
    int32_t u = (p[i] >> (4 * slot)) & 0x0F;
    if constexpr (BITS == 5) {
      const uint8_t* plane = p + 64;  // both slots': bit 4 slot + i / 16 of byte i % 16
      u |= ((plane[i % 16] >> (4 * slot + i / 16)) & 1) << 4;
    } else if constexpr (BITS == 6) {
      const uint8_t* plane = p + 64 + 16 * slot;
      u |= ((plane[i % 16] >> (2 * (i / 16))) & 3) << 4;
    }
    return u;
  }
}

// Portable reference of the same sums (used where the vector path is not compiled in).
template <int BITS, int G, int SC>
void block_dots_scalar(const uint8_t* w_block, const BlockScales& bs, int64_t offset,
                       const QuantizedActivations& a, int64_t m0, int mb, float* out) {
  for (int i = 0; i < mb; ++i) {
    const int8_t* xq = a.q.data() + (m0 + i) * a.k;
    const float* dx = a.dx.data() + (m0 + i) * (a.k / a.block);
    const int32_t* qsum = a.group_qsum.data() + (m0 + i) * a.n_groups;
    for (int64_t r = 0; r < kBlockRows; ++r) {
      const auto group_sum = [&](int64_t g) {
        int32_t sum = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) sum += code_at<BITS>(w_block, r, k) * xq[k];
        return sum;
      };
      float acc = 0.f;
      if constexpr (SC == kScaleF16) {
        for (int64_t g = 0; g < a.n_groups; ++g) {
          const ScaleZero sz = scale_zero<SC, G>(bs, g * 16 + r, offset);
          acc += sz.scale * dx[g * G / kActGroup] * static_cast<float>(group_sum(g));
          acc += sz.zero * a.group_term[(m0 + i) * a.n_groups + g];
        }
      } else {  // K-quants: exact integer sums over each super-block, then its float steps (see block_dots_kquant)
        for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
          int32_t isum = 0, msum = 0;
          for (int64_t g = sb * kSuper / G; g < (sb + 1) * kSuper / G; ++g) {
            if constexpr (SC == kScaleInt8) {  // centred (see kCentre)
              isum += static_cast<const int8_t*>(bs.s)[g * 16 + r] * (group_sum(g) - kCentre * qsum[g]);
            } else {
              isum += static_cast<const uint8_t*>(bs.s)[g * 16 + r] * group_sum(g);
              msum += static_cast<const uint8_t*>(bs.z)[g * 16 + r] * qsum[g];
            }
          }
          const uint16_t* sup = bs.sup + sb * bs.sup_stride;
          acc = std::fma(static_cast<float>(isum), half_to_float(sup[r]) * dx[sb], acc);
          if constexpr (SC == kScaleUint8) acc = std::fma(static_cast<float>(msum), half_to_float(sup[16 + r]) * dx[sb], acc);
        }
      }
      out[i * 16 + r] = acc;
    }
  }
}

// A packed weight's storage (see the header): raw pointers, checked by check_weights.
struct PackedWeights {
  const uint8_t* codes;
  const void* scales;
  const void* zeros;       // nullptr: offset
  const uint16_t* supers;  // nullptr: f16 scales
  int64_t scale_bytes;     // 2 (f16) or 1 (codes)
  int64_t sup_stride;      // S * 16

  BlockScales block(int64_t b, int64_t k, int64_t group) const {
    const int64_t per_block = (k / group) * kBlockRows * scale_bytes;
    return {static_cast<const uint8_t*>(scales) + b * per_block,
            zeros ? static_cast<const uint8_t*>(zeros) + b * per_block : nullptr,
            supers ? supers + b * (k / kSuper) * sup_stride : nullptr, sup_stride};
  }
};

// Activation rows in one pass over a weight block. AVX-512: up to kMaxWideRows (a verification of up to
// seven drafts unpacks each block once; docs/bench/qdot-avx512-widths.md), and a last nine in one pass
// (a verification of eight drafts, the deepest a cap of 8 asks; nine a pass throughout made a 64-row
// prompt chunk's 6-bit linears slower: docs/measurements.md, "qdot kernel"). AVX2 (16 registers): up to
// kMaxRows, except a last five in one pass (a verification of four drafts; measured 4 % faster for 4-bit
// codes and 14 % for 6-bit than four rows and then one; six and eight in one pass were no faster, or
// slower).
inline int64_t rows_in_pass(int64_t left) {
#if QDOT_AVX512_VNNI
  if (left == kMaxWideRows + 1) return left;
  return std::min<int64_t>(kMaxWideRows, left);
#else
  if (left == kMaxRows + 1) return left;
  return std::min<int64_t>(kMaxRows, left);
#endif
}

// Where one linear's outputs go: y[i * ldy + j] for output j of activation row i, plus residual[i * ldr + j]
// when given, added last (y = (x W^T + bias) + residual, as the Python block adds it: the same bits).
struct OutputRows {
  float* y;
  int64_t ldy;
  const float* residual;  // nullptr: none
  int64_t ldr;
};

// Weight blocks [begin, end) of one linear against every activation row, on the calling thread.
template <int BITS, int G, int SC>
void run_blocks(const QuantizedActivations& a, const PackedWeights& w, int64_t offset, const float* bias, int64_t n,
                const OutputRows& out, int64_t begin, int64_t end) {
  const int64_t block_bytes = 2 * a.k * BITS;
  float dots[(kMaxWideRows + 1) * kBlockRows];
  for (int64_t b = begin; b < end; ++b) {
    const uint8_t* w_block = w.codes + b * block_bytes;
    const BlockScales bs = w.block(b, a.k, G);
    const int64_t n0 = b * kBlockRows, rows = std::min(kBlockRows, n - n0);
    for (int64_t m0 = 0; m0 < a.m;) {
      const int mb = static_cast<int>(rows_in_pass(a.m - m0));
#if QDOT_AVX512_VNNI || QDOT_AVX2
      dispatch_rows<BITS, G, SC>(mb, w_block, bs, offset, a, m0, dots);
#else
      block_dots_scalar<BITS, G, SC>(w_block, bs, offset, a, m0, mb, dots);
#endif
      for (int i = 0; i < mb; ++i) {
        float* yr = out.y + (m0 + i) * out.ldy + n0;
        const float* d = dots + i * 16;
        for (int64_t r = 0; r < rows; ++r) yr[r] = bias ? d[r] + bias[n0 + r] : d[r];
        if (out.residual) {
          const float* rr = out.residual + (m0 + i) * out.ldr + n0;
          for (int64_t r = 0; r < rows; ++r) yr[r] += rr[r];
        }
      }
      m0 += mb;
    }
  }
}

// Weight blocks per task: enough that scheduling costs stay small next to the work (~64k weights).
inline int64_t block_grain(int64_t k) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / (k * kBlockRows));
}

// Weight rows [r0, r1) (r0 a multiple of 16) as f32 [r1 - r0, K]: the tests' check of the layout.
template <int BITS, int G, int SC>
void dequantize_rows(const PackedWeights& w, int64_t offset, int64_t k, int64_t r0, int64_t r1, float* out) {
  const int64_t block_bytes = 2 * k * BITS;
  for (int64_t b = r0 / kBlockRows; b * kBlockRows < r1; ++b) {
    const uint8_t* w_block = w.codes + b * block_bytes;
    const BlockScales bs = w.block(b, k, G);
    const int64_t rows = std::min(kBlockRows, r1 - b * kBlockRows);
    float* o = out + (b * kBlockRows - r0) * k;
#if QDOT_AVX512_VNNI
    alignas(64) uint8_t slots[128];
    for (int64_t k0 = 0; k0 < k; k0 += 8) {
      __m512i w0, w1;
      load_slots<BITS>(w_block + (k0 / 8) * 16 * BITS, w0, w1);
      _mm512_store_si512(slots, w0);
      _mm512_store_si512(slots + 64, w1);
      const int64_t g = k0 / G;
      for (int64_t r = 0; r < rows; ++r) {
        const ScaleZero sz = scale_zero<SC, G>(bs, g * 16 + r, offset);
        for (int half = 0; half < 2; ++half) {
          int32_t four;
          std::memcpy(&four, slots + half * 64 + r * 4, 4);
          const __m128 v = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(four)));
          _mm_storeu_ps(o + r * k + k0 + 4 * half, _mm_fmadd_ps(v, _mm_set1_ps(sz.scale), _mm_set1_ps(sz.zero)));
        }
      }
    }
#else
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const ScaleZero sz = scale_zero<SC, G>(bs, (kk / G) * 16 + r, offset);
        o[r * k + kk] = static_cast<float>(code_at<BITS>(w_block, r, kk)) * sz.scale + sz.zero;
      }
    }
#endif
  }
}

// The scale kind of a packed weight, from its tensors' dtypes (check_weights has checked them).
int scale_kind(const at::Tensor& scales) {
  if (scales.scalar_type() == at::kHalf) return kScaleF16;
  return scales.scalar_type() == at::kChar ? kScaleInt8 : kScaleUint8;
}

// Checks shared by the ops: codes [ceil(n/16), 2 K bits], scales (and zeros) [ceil(n/16), K/G, 16],
// supers [ceil(n/16), K/256, S, 16] (S = 1 + zeros given) with 8-bit scale codes, empty with f16 scales.
PackedWeights check_weights(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                            const at::Tensor& supers, int64_t bits, int64_t group, int64_t n, int64_t k) {
  TORCH_CHECK((bits == 4 && group == 32) || (bits == 5 && group == 32) || (bits == 6 && group == 16) ||
              (bits == 8 && group == 32), "qdot: (bits, group) must be (4, 32), (5, 32), (6, 16) or (8, 32)");
  TORCH_CHECK(k > 0 && k % kActGroup == 0, "qdot: K must be a multiple of 32, got ", k);
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2 && codes.size(0) == blocks,
              "qdot: codes must be contiguous uint8 [ceil(N/16), 2 K bits]");
  TORCH_CHECK(codes.size(1) == 2 * k * bits, "qdot: codes have ", codes.size(1), " bytes per block of 16 rows for K = ", k);
  const auto st = scales.scalar_type();
  TORCH_CHECK((st == at::kHalf || st == at::kChar || st == at::kByte) && scales.is_contiguous() && scales.dim() == 3 &&
              scales.size(0) == blocks && scales.size(1) == k / group && scales.size(2) == kBlockRows,
              "qdot: scales must be contiguous f16, int8 or uint8 [ceil(N/16), K/G, 16]");
  const bool has_zeros = zeros.numel() > 0;
  if (has_zeros) {
    TORCH_CHECK(zeros.scalar_type() == (st == at::kHalf ? at::kHalf : at::kByte) && zeros.is_contiguous() &&
                zeros.sizes() == scales.sizes(), "qdot: zeros must be contiguous like scales (uint8 with 8-bit scales)");
  }
  PackedWeights w{codes.data_ptr<uint8_t>(), scales.data_ptr(), has_zeros ? zeros.data_ptr() : nullptr, nullptr,
                  st == at::kHalf ? 2 : 1, 0};
  if (st == at::kHalf) {
    TORCH_CHECK(supers.numel() == 0, "qdot: f16 scales take no super-block factors");
  } else {
    TORCH_CHECK(k % kSuper == 0, "qdot: 8-bit scale codes need K a multiple of 256, got ", k);
    TORCH_CHECK(st == at::kByte || !has_zeros, "qdot: int8 scale codes take no zeros");
    const int64_t s_count = has_zeros ? 2 : 1;
    TORCH_CHECK(supers.scalar_type() == at::kHalf && supers.is_contiguous() && supers.dim() == 4 &&
                supers.size(0) == blocks && supers.size(1) == k / kSuper && supers.size(2) == s_count &&
                supers.size(3) == kBlockRows, "qdot: supers must be contiguous f16 [ceil(N/16), K/256, ", s_count, ", 16]");
    w.supers = reinterpret_cast<const uint16_t*>(supers.data_ptr<at::Half>());
    w.sup_stride = s_count * kBlockRows;
  }
  return w;
}

// Calls F<BITS, G, SC>::call(args...) for a checked layout.
template <template <int, int, int> class F, typename... Args>
void dispatch_layout(int64_t bits, int sc, Args&&... args) {
  if (bits == 4) {
    if (sc == kScaleUint8) F<4, 32, kScaleUint8>::call(args...);
    else F<4, 32, kScaleF16>::call(args...);
  } else if (bits == 5) {
    if (sc == kScaleUint8) F<5, 32, kScaleUint8>::call(args...);
    else F<5, 32, kScaleF16>::call(args...);
  } else if (bits == 6) {
    if (sc == kScaleInt8) F<6, 16, kScaleInt8>::call(args...);
    else F<6, 16, kScaleF16>::call(args...);
  } else {
    F<8, 32, kScaleF16>::call(args...);
  }
}

// A layout's block runner, as a plain function pointer (a part's, chosen once per call).
using BlockRunner = void (*)(const QuantizedActivations&, const PackedWeights&, int64_t, const float*, int64_t,
                             const OutputRows&, int64_t, int64_t);

template <int BITS, int G, int SC>
struct RunnerOf {
  static void call(BlockRunner& f) { f = &run_blocks<BITS, G, SC>; }
};

template <int BITS, int G, int SC>
struct DequantizeLayout {
  static void call(const PackedWeights& w, int64_t offset, int64_t k, int64_t r0, int64_t r1, float* out) {
    dequantize_rows<BITS, G, SC>(w, offset, k, r0, r1, out);
  }
};

void check_scale_kind(int64_t bits, int sc) {
  TORCH_CHECK(sc == kScaleF16 || (sc == kScaleUint8 && (bits == 4 || bits == 5)) || (sc == kScaleInt8 && bits == 6),
              "qdot: 8-bit scale codes are uint8 for 4- and 5-bit codes (Q4_K, Q5_K) and int8 for 6-bit ones (Q6_K)");
}

}  // namespace

namespace QDOT_NAMESPACE::native {

at::Tensor qdot_linear_parts(const at::Tensor& x, const std::vector<QDotPart>& parts,
                             const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "qdot: x must be contiguous f32 [M, K]");
  TORCH_CHECK(!parts.empty(), "qdot: a linear needs at least one part");
  const int64_t m = x.size(0), k = x.size(1);
  // Each part checked and resolved once: its weight, its block runner, where its columns and blocks
  // start, and which quantization of x it reads (group term sums follow the part's group size).
  struct Prepared {
    PackedWeights w;
    BlockRunner run = nullptr;
    const float* bias = nullptr;
    int64_t offset = 0, n = 0, col0 = 0, block0 = 0, blocks = 0, group = 0;
    bool k_quant = false;  // 8-bit scale codes: activations per 256
  };
  std::vector<Prepared> prep;
  prep.reserve(parts.size());
  int64_t total_n = 0, total_blocks = 0;
  for (const QDotPart& p : parts) {
    Prepared q;
    q.w = check_weights(p.codes, p.scales, p.zeros, p.supers, p.bits, p.group, p.n, k);
    const int sc = scale_kind(p.scales);
    check_scale_kind(p.bits, sc);
    TORCH_CHECK(sc != kScaleInt8 || p.offset == kCentre, "qdot: 6-bit codes with int8 scale codes (Q6_K) have offset ",
                kCentre, ", got ", p.offset);
    if (p.bias.has_value() && p.bias->defined()) {
      TORCH_CHECK(p.bias->scalar_type() == at::kFloat && p.bias->is_contiguous() && p.bias->numel() == p.n,
                  "qdot: bias must be f32 [N]");
      q.bias = p.bias->data_ptr<float>();
    }
    dispatch_layout<RunnerOf>(p.bits, sc, q.run);
    q.k_quant = sc != kScaleF16;
    q.offset = p.offset;
    q.n = p.n;
    q.group = p.group;
    q.col0 = total_n;
    q.block0 = total_blocks;
    q.blocks = (p.n + kBlockRows - 1) / kBlockRows;
    total_n += p.n;
    total_blocks += q.blocks;
    prep.push_back(q);
  }
  const float* res = nullptr;
  int64_t ldr = 0;
  if (residual.has_value() && residual->defined()) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->dim() == 2 && residual->size(0) == m &&
                residual->size(1) == total_n && residual->stride(1) == 1,
                "qdot: residual must be f32 [M, N], contiguous in its last dimension");
    res = residual->data_ptr<float>();
    ldr = residual->stride(0);
  }
  at::Tensor y = at::empty({m, total_n}, x.options());
  if (m == 0 || total_n == 0) return y;
  // x quantized once per (group size, activation block) the parts use: groups of 16 (Q6_K) or 32, per 32
  // values (f16-scaled layouts) or per 256 (K-quants)
  QuantizedActivations acts[2][2];  // [group == 16][block == kSuper]
  for (const Prepared& q : prep) {
    QuantizedActivations& a = acts[q.group == 16][q.k_quant];
    if (a.m == 0) a = quantize_activations(x.data_ptr<float>(), m, k, q.group, q.k_quant ? kSuper : kActGroup);
  }
  float* yp = y.data_ptr<float>();
  // One pass over every part's blocks: the parts of a split projection (q/k/v of different
  // quantization types) share one parallel region instead of one each plus a concatenation.
  parallel_shares(total_blocks, block_grain(k), [&](int64_t begin, int64_t end) {
    for (const Prepared& q : prep) {
      const int64_t b0 = std::max(begin, q.block0), b1 = std::min(end, q.block0 + q.blocks);
      if (b0 >= b1) continue;
      const OutputRows out{yp + q.col0, total_n, res ? res + q.col0 : nullptr, ldr};
      q.run(acts[q.group == 16][q.k_quant], q.w, q.offset, q.bias, q.n, out, b0 - q.block0, b1 - q.block0);
    }
  });
  return y;
}

at::Tensor qdot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& zeros, const at::Tensor& supers, int64_t bits, int64_t group, int64_t offset,
                       int64_t n, const std::optional<at::Tensor>& bias) {
  return qdot_linear_parts(x, {QDotPart{codes, scales, zeros, supers, bias, bits, group, offset, n}}, std::nullopt);
}

// The weights as f32 [N, K], straight from the kernel's layout (tests and debugging).
at::Tensor qdot_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                           const at::Tensor& supers, int64_t bits, int64_t group, int64_t offset, int64_t n) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "qdot: bits must be 4, 5, 6 or 8");
  TORCH_CHECK(codes.dim() == 2, "qdot: codes must be 2-D");
  const int64_t k = codes.size(1) / (2 * bits);
  const PackedWeights w = check_weights(codes, scales, zeros, supers, bits, group, n, k);
  const int sc = scale_kind(scales);
  check_scale_kind(bits, sc);
  at::Tensor out = at::empty({n, k}, codes.options().dtype(at::kFloat));
  if (n == 0) return out;
  dispatch_layout<DequantizeLayout>(bits, sc, w, offset, k, int64_t{0}, n, out.data_ptr<float>());
  return out;
}

}  // namespace QDOT_NAMESPACE::native

namespace {

// Which code path this build runs: the loader reports it and picks defaults from it.
std::string qdot_isa() {
  return QDOT_AVX512_VNNI ? "avx512vnni" : QDOT_AVX2 ? "avx2" : "scalar";
}

}  // namespace

using QDOT_NAMESPACE::native::qdot_dequantize;
using QDOT_NAMESPACE::native::qdot_linear;

TORCH_LIBRARY(QDOT_NAMESPACE, m) {
  m.def("qdot_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros, Tensor supers, int bits, int group, int offset, int n, Tensor? bias) -> Tensor");
  m.def("qdot_dequantize(Tensor codes, Tensor scales, Tensor zeros, Tensor supers, int bits, int group, int offset, int n) -> Tensor");
  m.def("qdot_isa() -> str", &qdot_isa);
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("qdot_linear", &qdot_linear);
  m.impl("qdot_dequantize", &qdot_dequantize);
}
