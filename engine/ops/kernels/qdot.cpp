// Integer dot-product linear layer over GGUF quantization codes (the way llama.cpp's CPU backend
// multiplies quantized weights): weights stay as their unsigned 4-, 5-, 6- or 8-bit codes with one
// scale (and optionally one zero) per group of 16 or 32 along K; each activation row is quantized
// to int8 per 32 values; every group's dot product is an integer sum (AVX512-VNNI vpdpbusd:
// unsigned weight bytes x signed activation bytes), scaled once per group in f32.
//
//   w[n, k] = s[n, g] * u[n, k] + z[n, g]        (zeros given)     g = k / G
//   w[n, k] = s[n, g] * (u[n, k] - offset)       (no zeros)
//   x[m, k] ~ dx[m, k / 32] * q[m, k]            q int8, dx = max|x| / 127 over the 32 values
//   y[m, n] = sum_g s[n,g] * sum_{k in g} dx * u * q  +  sum_g z[n,g] * dx * sum_{k in g} q
//
// Layout: weight rows in blocks of 16, so that each 32-bit lane of a register holds one row and a
// block's 16 outputs come out of the registers with no horizontal sums; the float work (convert,
// scale, zero term) is then once per (row block, group, activation row) instead of once per 64
// codes, which keeps verifying a few speculative tokens nearly as cheap as decoding one.
// (BITS, G) is one of (4, 32), (5, 32), (6, 16), (8, 32). Built by engine/ops/linear.py's pack_codes:
//   codes  uint8 [N/16 (rounded up), K/8, 16 * BITS]: for each 8 values k0..k0+7 of the 16 rows, two
//          64-byte "slots" (values k0..k0+3, then k0+4..k0+7), byte 4 r + j of a slot = row r's
//          value j. 8 bits: the two slots as they are. 4, 5, 6 bits: 64 bytes of nibbles (low nibble
//          = first slot, high = second), then the high bits of each slot: 5 bits, 8 bytes per slot
//          (bit i = bit 4 of slot byte i); 6 bits, 16 bytes per slot (byte i holds bits 4-5 of slot
//          bytes i, 16 + i, 32 + i, 48 + i in bit pairs 0-1 ... 6-7).
//   scales, zeros  float16 [N/16, K/G, 16]: one value per (block, group, row). Padding rows: 0.
//
// Prompts go through the same integer path, four activation rows per pass over a weight block
// (measured 2x faster at 128 rows than dequantizing to f32 for MKL's GEMM, and every width then
// rounds the same way, so a prefix computed in one chunk or token by token gives the same cache).
//
// The op is registered as torch.ops.tandem.qdot_linear and parallelised with at::parallel_for
// (torch's own thread pool, so num_thread settings apply). Without AVX512-VNNI a scalar loop
// computes the same integer sums (correct, slow: engine/ops/kernels/__init__.py's qdot_fast() then
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
constexpr int kMaxRows = 4;        // activation rows sharing one pass over a weight block
constexpr int64_t kBlockRows = 16;  // weight rows per block (one per 32-bit lane)
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead in a block's codes the vector path prefetches

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

// Scale and zero of one (row, group) entry i of a block's scales/zeros: w = scale * code + zero.
struct ScaleZero {
  float scale, zero;
};

inline ScaleZero scale_zero(const uint16_t* s_block, const uint16_t* z_block, int64_t i, int64_t offset) {
  const float sc = half_to_float(s_block[i]);
  return {sc, z_block ? half_to_float(z_block[i]) : -static_cast<float>(offset) * sc};
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

// The high bits (BITS 5: one, BITS 6: two) of a 64-byte slot from its plane, as byte values << 4.
template <int BITS>
inline __m512i high_bits(const uint8_t* plane) {
  if constexpr (BITS == 5) {
    uint64_t bits;
    std::memcpy(&bits, plane, 8);  // bit i = slot byte i
    return _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(0x10));
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
    if constexpr (BITS == 5 || BITS == 6) {
      w0 = _mm512_or_si512(w0, high_bits<BITS>(p + 64));
      w1 = _mm512_or_si512(w1, high_bits<BITS>(p + 64 + 8 * (BITS - 4)));
    }
  }
}

inline __m512i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// MB activation rows against one block of 16 weight rows: out[i * 16 + r] = y[m0 + i, block row r]
// without bias.
template <int BITS, int G, int MB>
inline void block_dots(const uint8_t* w_block, const uint16_t* s_block, const uint16_t* z_block, int64_t offset,
                       const QuantizedActivations& a, int64_t m0, float* out) {
  constexpr int64_t slot_bytes = 16 * BITS;  // per 8 values of the 16 rows
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
    __m512i sum0[MB], sum1[MB];
    for (int i = 0; i < MB; ++i) {
      sum0[i] = _mm512_setzero_si512();
      sum1[i] = _mm512_setzero_si512();
    }
    for (int64_t k0 = g * G; k0 < (g + 1) * G; k0 += 8) {
      const uint8_t* p = w_block + (k0 / 8) * slot_bytes;
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
      if constexpr (BITS > 4) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64), _MM_HINT_T0);
      __m512i w0, w1;
      load_slots<BITS>(p, w0, w1);
      for (int i = 0; i < MB; ++i) {
        sum0[i] = _mm512_dpbusd_epi32(sum0[i], w0, broadcast4(xq[i] + k0));
        sum1[i] = _mm512_dpbusd_epi32(sum1[i], w1, broadcast4(xq[i] + k0 + 4));
      }
    }
    const __m512 sv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s_block + g * 16)));
    const __m512 zv = z_block ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z_block + g * 16)))
                              : _mm512_mul_ps(sv, neg_offset);
    for (int i = 0; i < MB; ++i) {
      const __m512 scale = _mm512_mul_ps(sv, _mm512_set1_ps(dx[i][g * G / kActGroup]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum0[i], sum1[i])), scale, acc[i]);
      acc[i] = _mm512_fmadd_ps(zv, _mm512_set1_ps(term[i][g]), acc[i]);
    }
  }
  for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * 16, acc[i]);
}

template <int BITS, int G>
inline void dispatch_rows(int mb, const uint8_t* w_block, const uint16_t* s_block, const uint16_t* z_block,
                          int64_t offset, const QuantizedActivations& a, int64_t m0, float* out) {
  switch (mb) {
    case 4: block_dots<BITS, G, 4>(w_block, s_block, z_block, offset, a, m0, out); break;
    case 3: block_dots<BITS, G, 3>(w_block, s_block, z_block, offset, a, m0, out); break;
    case 2: block_dots<BITS, G, 2>(w_block, s_block, z_block, offset, a, m0, out); break;
    default: block_dots<BITS, G, 1>(w_block, s_block, z_block, offset, a, m0, out); break;
  }
}

#endif  // QDOT_AVX512_VNNI

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
      const uint8_t* plane = p + 64 + 8 * slot;
      u |= ((plane[i / 8] >> (i % 8)) & 1) << 4;
    } else if constexpr (BITS == 6) {
      const uint8_t* plane = p + 64 + 16 * slot;
      u |= ((plane[i % 16] >> (2 * (i / 16))) & 3) << 4;
    }
    return u;
  }
}

// Portable reference of the same sums (used where the vector path is not compiled in).
template <int BITS, int G>
void block_dots_scalar(const uint8_t* w_block, const uint16_t* s_block, const uint16_t* z_block, int64_t offset,
                       const QuantizedActivations& a, int64_t m0, int mb, float* out) {
  for (int i = 0; i < mb; ++i) {
    const int8_t* xq = a.q.data() + (m0 + i) * a.k;
    const float* dx = a.dx.data() + (m0 + i) * (a.k / kActGroup);
    for (int64_t r = 0; r < kBlockRows; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < a.n_groups; ++g) {
        int32_t sum = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) sum += code_at<BITS>(w_block, r, k) * xq[k];
        const ScaleZero sz = scale_zero(s_block, z_block, g * 16 + r, offset);
        acc += sz.scale * dx[g * G / kActGroup] * static_cast<float>(sum);
        acc += sz.zero * a.group_term[(m0 + i) * a.n_groups + g];
      }
      out[i * 16 + r] = acc;
    }
  }
}

template <int BITS, int G>
void run(const QuantizedActivations& a, const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros,
         int64_t offset, const float* bias, int64_t n, float* y) {
  const int64_t block_bytes = 2 * a.k * BITS;
  const int64_t block_scales = a.n_groups * kBlockRows;
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  // Enough blocks per task that scheduling costs stay small next to the work (~64k weights).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (a.k * kBlockRows));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    float dots[kMaxRows * kBlockRows];
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* w_block = codes + b * block_bytes;
      const uint16_t* s_block = scales + b * block_scales;
      const uint16_t* z_block = zeros ? zeros + b * block_scales : nullptr;
      const int64_t n0 = b * kBlockRows, rows = std::min(kBlockRows, n - n0);
      for (int64_t m0 = 0; m0 < a.m; m0 += kMaxRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, a.m - m0));
#if QDOT_AVX512_VNNI
        dispatch_rows<BITS, G>(mb, w_block, s_block, z_block, offset, a, m0, dots);
#else
        block_dots_scalar<BITS, G>(w_block, s_block, z_block, offset, a, m0, mb, dots);
#endif
        for (int i = 0; i < mb; ++i) {
          float* yr = y + (m0 + i) * n + n0;
          for (int64_t r = 0; r < rows; ++r) yr[r] = bias ? dots[i * 16 + r] + bias[n0 + r] : dots[i * 16 + r];
        }
      }
    }
  });
}

// Weight rows [r0, r1) (r0 a multiple of 16) as f32 [r1 - r0, K]: the tests' check of the layout.
template <int BITS, int G>
void dequantize_rows(const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros, int64_t offset, int64_t k,
                     int64_t r0, int64_t r1, float* out) {
  const int64_t block_bytes = 2 * k * BITS;
  const int64_t n_groups = k / G;
  for (int64_t b = r0 / kBlockRows; b * kBlockRows < r1; ++b) {
    const uint8_t* w_block = codes + b * block_bytes;
    const uint16_t* s_block = scales + b * n_groups * kBlockRows;
    const uint16_t* z_block = zeros ? zeros + b * n_groups * kBlockRows : nullptr;
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
        const ScaleZero sz = scale_zero(s_block, z_block, g * 16 + r, offset);
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
        const ScaleZero sz = scale_zero(s_block, z_block, (kk / G) * 16 + r, offset);
        o[r * k + kk] = static_cast<float>(code_at<BITS>(w_block, r, kk)) * sz.scale + sz.zero;
      }
    }
#endif
  }
}

void dequantize_dispatch(int64_t bits, int64_t group, const uint8_t* c, const uint16_t* s, const uint16_t* z,
                         int64_t offset, int64_t k, int64_t r0, int64_t r1, float* out) {
  if (bits == 4) dequantize_rows<4, 32>(c, s, z, offset, k, r0, r1, out);
  else if (bits == 5) dequantize_rows<5, 32>(c, s, z, offset, k, r0, r1, out);
  else if (bits == 6) dequantize_rows<6, 16>(c, s, z, offset, k, r0, r1, out);
  else dequantize_rows<8, 32>(c, s, z, offset, k, r0, r1, out);
}

// Checks shared by the ops: codes [ceil(n/16), 2 K bits], scales (and zeros) [ceil(n/16), K/G, 16].
void check_weights(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                   int64_t group, int64_t n, int64_t k) {
  TORCH_CHECK((bits == 4 && group == 32) || (bits == 5 && group == 32) || (bits == 6 && group == 16) ||
              (bits == 8 && group == 32), "qdot: (bits, group) must be (4, 32), (5, 32), (6, 16) or (8, 32)");
  TORCH_CHECK(k > 0 && k % kActGroup == 0, "qdot: K must be a multiple of 32, got ", k);
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2 && codes.size(0) == blocks,
              "qdot: codes must be contiguous uint8 [ceil(N/16), 2 K bits]");
  TORCH_CHECK(codes.size(1) == 2 * k * bits, "qdot: codes have ", codes.size(1), " bytes per block of 16 rows for K = ", k);
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3 && scales.size(0) == blocks &&
              scales.size(1) == k / group && scales.size(2) == kBlockRows, "qdot: scales must be contiguous f16 [ceil(N/16), K/G, 16]");
  if (zeros.numel() > 0) {
    TORCH_CHECK(zeros.scalar_type() == at::kHalf && zeros.is_contiguous() && zeros.sizes() == scales.sizes(),
                "qdot: zeros must be contiguous f16 like scales");
  }
}

at::Tensor qdot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t bits, int64_t group, int64_t offset, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "qdot: x must be contiguous f32 [M, K]");
  const int64_t m = x.size(0), k = x.size(1);
  check_weights(codes, scales, zeros, bits, group, n, k);
  const bool has_zeros = zeros.numel() > 0;
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n, "qdot: bias must be f32 [N]");
    bias_ptr = bias->data_ptr<float>();
  }
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* z = has_zeros ? reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>()) : nullptr;
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const QuantizedActivations a = quantize_activations(x.data_ptr<float>(), m, k, group);
  float* out = y.data_ptr<float>();
  if (bits == 4) run<4, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 5) run<5, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 6) run<6, 16>(a, c, s, z, offset, bias_ptr, n, out);
  else run<8, 32>(a, c, s, z, offset, bias_ptr, n, out);
  return y;
}

// The weights as f32 [N, K], straight from the kernel's layout (tests and debugging).
at::Tensor qdot_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                           int64_t group, int64_t offset, int64_t n) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "qdot: bits must be 4, 5, 6 or 8");
  TORCH_CHECK(codes.dim() == 2, "qdot: codes must be 2-D");
  const int64_t k = codes.size(1) / (2 * bits);
  check_weights(codes, scales, zeros, bits, group, n, k);
  at::Tensor out = at::empty({n, k}, codes.options().dtype(at::kFloat));
  if (n == 0) return out;
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
  m.def("qdot_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int bits, int group, int offset, int n, Tensor? bias) -> Tensor");
  m.def("qdot_dequantize(Tensor codes, Tensor scales, Tensor zeros, int bits, int group, int offset, int n) -> Tensor");
  m.def("qdot_isa() -> str", &qdot_isa);
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("qdot_linear", &qdot_linear);
  m.impl("qdot_dequantize", &qdot_dequantize);
}
