// Integer dot-product linear layer over GGUF quantization codes (the way llama.cpp's CPU backend
// multiplies quantized weights): weights stay as their unsigned 4- or 8-bit codes with one scale
// (and optionally one zero) per group of 16 or 32 along K; each activation row is quantized to
// int8 per 32 values; every group's dot product is an integer sum (AVX512-VNNI vpdpbusd: unsigned
// weight bytes x signed activation bytes), scaled once per group in f32.
//
//   w[n, k] = s[n, g] * u[n, k] + z[n, g]        (zeros given)     g = k / G
//   w[n, k] = s[n, g] * (u[n, k] - offset)       (no zeros)
//   x[m, k] ~ dx[m, k / 32] * q[m, k]            q int8, dx = max|x| / 127 over the 32 values
//   y[m, n] = sum_g s[n,g] * sum_{k in g} dx * u * q  +  sum_g z[n,g] * dx * sum_{k in g} q
//
// Layouts (built in engine/qdot.py):
//   bits 8: codes uint8 [N, K], code k at byte k.
//   bits 4: codes uint8 [N, K/2]; each 128 values take 64 bytes, byte j holding value j in its low
//           nibble and value 64 + j in its high one (one 512-bit load unpacks to two 64-value
//           chunks); a last 64 values when K % 128 == 64 take 32 bytes, byte j = values j, 32 + j.
//   scales, zeros: float16 [N, K/G].
//
// Why this and not torch's int4/int8 weight-only kernels: those convert every weight to bf16 and
// multiply in floating point, so on CPUs without AMX they are compute-bound at about a third of
// the memory bandwidth; integer dot products move the same bytes with a quarter of the arithmetic.
//
// The op is registered as torch.ops.tandem.qdot_linear and parallelised with at::parallel_for
// (torch's own thread pool, so num_thread settings apply). Without AVX512-VNNI a scalar loop
// computes the same integer sums (correct, slow: engine/qdot.py only picks this format by default
// where the vector path was compiled in).

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

// One activation block quantized for the kernel.
struct QuantizedActivations {
  int64_t m = 0, k = 0, n_groups = 0;  // n_groups: weight groups along K (K / G)
  std::vector<int8_t> q;               // [m, k]
  std::vector<float> dx_lanes;         // [m, k/64, 16]: dx of the 32 values each 32-bit lane sums
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
  a.dx_lanes.resize(m * (k / kChunk) * 16);
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
      // lanes 0-7 of a 64-value chunk sum values 0-31, lanes 8-15 values 32-63
      float* lanes = a.dx_lanes.data() + r * (k / kChunk) * 16 + (b / 2) * 16 + (b % 2) * 8;
      for (int i = 0; i < 8; ++i) lanes[i] = dx;
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

// The kernel walks K in pairs of 64-value chunks (128 values: one 512-bit load of 4-bit codes),
// then a last single chunk when K is an odd multiple of 64.

// Unsigned weight bytes of 64-value chunks c and c + 1.
template <int BITS>
inline void load_code_pair(const uint8_t* row, int64_t c, __m512i& w0, __m512i& w1) {
  if constexpr (BITS == 8) {
    w0 = _mm512_loadu_si512(row + c * 64);
    w1 = _mm512_loadu_si512(row + c * 64 + 64);
  } else {
    const __m512i raw = _mm512_loadu_si512(row + c * 32);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    w0 = _mm512_and_si512(raw, m4);
    w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
  }
}

// Unsigned weight bytes of the single chunk c (the last one of a row).
template <int BITS>
inline __m512i load_code_single(const uint8_t* row, int64_t c) {
  if constexpr (BITS == 8) {
    return _mm512_loadu_si512(row + c * 64);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * 32));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(raw, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

// Lane index vectors: which of the chunk's scales each int32 lane (4 values) uses.
template <int G>
inline __m512i scale_index(int first) {
  if constexpr (G == 32) {
    return _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
  } else {
    return _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
  }
}

// The weight scales of chunks c and c + 1 (2 x 64 / G f16 values), spread over lanes.
// 2 x 64 / G consecutive f16 values from p, widened into the low lanes of a zeroed register.
template <int G>
inline __m512 load_pair_halves(const uint16_t* p) {
  if constexpr (G == 32) {
    uint64_t bits;
    std::memcpy(&bits, p, 8);
    return _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(bits))));
  } else {
    return _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
}

// 2 x 64 / G consecutive f32 values from p in the low lanes of a zeroed register.
template <int G>
inline __m512 load_pair_floats(const float* p) {
  if constexpr (G == 32) {
    return _mm512_zextps128_ps512(_mm_loadu_ps(p));
  } else {
    return _mm512_zextps256_ps512(_mm256_loadu_ps(p));
  }
}

// The weight scales of chunks c and c + 1 spread over the lanes of each chunk.
template <int G>
inline void scale_pair(__m512 s, __m512& s0, __m512& s1) {
  s0 = _mm512_permutexvar_ps(scale_index<G>(0), s);
  s1 = _mm512_permutexvar_ps(scale_index<G>(64 / G), s);
}

template <int G>
inline __m512 scale_single(const uint16_t* s_row, int64_t c) {
  __m128 s;
  if constexpr (G == 32) {
    uint32_t bits;
    std::memcpy(&bits, s_row + 2 * c, 4);
    s = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
  } else {
    uint64_t bits;
    std::memcpy(&bits, s_row + 4 * c, 8);
    s = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(bits)));
  }
  return _mm512_permutexvar_ps(scale_index<G>(0), _mm512_castps128_ps512(s));
}

// acc += f32(sum of 4 products per lane) * weight scale * activation scale
inline __m512 dot_step(__m512 acc, __m512i w, const int8_t* xq, __m512 sv, const float* dxl) {
  const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(xq));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv, _mm512_loadu_ps(dxl)), acc);
}

// MB activation rows against one weight row: y[m, n] without bias. The zero term
// (sum_g zero_g * dx * sum q, or -offset * sum_g scale_g * dx * sum q) is accumulated in the same
// pass, so each row ends with a single horizontal sum.
template <int BITS, int G, int MB>
inline void row_dots(const uint8_t* w_row, const uint16_t* s_row, const uint16_t* z_row, int64_t offset,
                     const QuantizedActivations& a, int64_t m0, float* out) {
  const int64_t chunks = a.k / kChunk;
  constexpr int groups_per_chunk = 64 / G;
  __m512 acc0[MB], acc1[MB], accz[MB];
  const int8_t* xq[MB];
  const float* dxl[MB];
  const float* term[MB];
  for (int i = 0; i < MB; ++i) {
    acc0[i] = _mm512_setzero_ps();
    acc1[i] = _mm512_setzero_ps();
    accz[i] = _mm512_setzero_ps();
    xq[i] = a.q.data() + (m0 + i) * a.k;
    dxl[i] = a.dx_lanes.data() + (m0 + i) * chunks * 16;
    term[i] = a.group_term.data() + (m0 + i) * a.n_groups;
  }
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    __m512i w0, w1;
    __m512 s0, s1;
    load_code_pair<BITS>(w_row, c, w0, w1);
    const __m512 s = load_pair_halves<G>(s_row + c * groups_per_chunk);
    const __m512 z = z_row ? load_pair_halves<G>(z_row + c * groups_per_chunk) : s;
    scale_pair<G>(s, s0, s1);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = dot_step(acc0[i], w0, xq[i] + c * kChunk, s0, dxl[i] + c * 16);
      acc1[i] = dot_step(acc1[i], w1, xq[i] + (c + 1) * kChunk, s1, dxl[i] + (c + 1) * 16);
      accz[i] = _mm512_fmadd_ps(z, load_pair_floats<G>(term[i] + c * groups_per_chunk), accz[i]);
    }
  }
  float tail_z[MB] = {};
  if (c < chunks) {
    const __m512i w0 = load_code_single<BITS>(w_row, c);
    const __m512 s0 = scale_single<G>(s_row, c);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = dot_step(acc0[i], w0, xq[i] + c * kChunk, s0, dxl[i] + c * 16);
      for (int g = 0; g < groups_per_chunk; ++g) {
        const int64_t gi = c * groups_per_chunk + g;
        tail_z[i] += half_to_float(z_row ? z_row[gi] : s_row[gi]) * term[i][gi];
      }
    }
  }
  const __m512 zcoef = _mm512_set1_ps(z_row ? 1.f : -static_cast<float>(offset));
  for (int i = 0; i < MB; ++i) {
    const __m512 total = _mm512_fmadd_ps(accz[i], zcoef, _mm512_add_ps(acc0[i], acc1[i]));
    out[i] = _mm512_reduce_add_ps(total) + (z_row ? tail_z[i] : -static_cast<float>(offset) * tail_z[i]);
  }
}

#endif  // QDOT_AVX512_VNNI

// Code k of a 4-bit row: in each full 128-value pair of chunks, byte j holds values j (low nibble)
// and 64 + j (high); a last lone 64-value chunk holds values j and 32 + j in its byte j.
inline int32_t nibble_code(const uint8_t* row, int64_t k, int64_t row_len) {
  const int64_t pair = k / 128, j = k % 128;
  if ((pair + 1) * 128 <= row_len) {
    const uint8_t byte = row[pair * 64 + (j % 64)];
    return j < 64 ? (byte & 0x0F) : (byte >> 4);
  }
  const uint8_t byte = row[pair * 64 + (j % 32)];
  return j < 32 ? (byte & 0x0F) : (byte >> 4);
}

// Portable reference of the same sums (used where the vector path is not compiled in).
template <int BITS, int G>
void row_dots_scalar(const uint8_t* w_row, const uint16_t* s_row, const uint16_t* z_row, int64_t offset,
                     const QuantizedActivations& a, int64_t m0, int mb, float* out) {
  for (int i = 0; i < mb; ++i) {
    const int8_t* xq = a.q.data() + (m0 + i) * a.k;
    const float* dxl = a.dx_lanes.data() + (m0 + i) * (a.k / kChunk) * 16;
    float acc = 0.f;
    for (int64_t g = 0; g < a.k / G; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * G; k < (g + 1) * G; ++k) {
        int32_t u;
        if constexpr (BITS == 8) {
          u = w_row[k];
        } else {
          u = nibble_code(w_row, k, a.k);
        }
        sum += u * xq[k];
      }
      const int64_t k0 = g * G;
      const float dx = dxl[(k0 / kChunk) * 16 + ((k0 % kChunk) / 32) * 8];
      acc += half_to_float(s_row[g]) * dx * static_cast<float>(sum);
      const float term = a.group_term[(m0 + i) * a.n_groups + g];
      acc += (z_row ? half_to_float(z_row[g]) : -static_cast<float>(offset) * half_to_float(s_row[g])) * term;
    }
    out[i] = acc;
  }
}

template <int BITS, int G>
void run(const QuantizedActivations& a, const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros,
         int64_t offset, const float* bias, int64_t n, float* y) {
  const int64_t row_bytes = BITS == 8 ? a.k : a.k / 2;
  const int64_t n_groups = a.k / G;
  // Enough rows per task that scheduling costs stay small next to the work (~64k weights).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / a.k);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    float dots[kMaxRows];
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* w_row = codes + r * row_bytes;
      const uint16_t* s_row = scales + r * n_groups;
      const uint16_t* z_row = zeros ? zeros + r * n_groups : nullptr;
      for (int64_t m0 = 0; m0 < a.m; m0 += kMaxRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, a.m - m0));
#if QDOT_AVX512_VNNI
        switch (mb) {
          case 4: row_dots<BITS, G, 4>(w_row, s_row, z_row, offset, a, m0, dots); break;
          case 3: row_dots<BITS, G, 3>(w_row, s_row, z_row, offset, a, m0, dots); break;
          case 2: row_dots<BITS, G, 2>(w_row, s_row, z_row, offset, a, m0, dots); break;
          default: row_dots<BITS, G, 1>(w_row, s_row, z_row, offset, a, m0, dots); break;
        }
#else
        row_dots_scalar<BITS, G>(w_row, s_row, z_row, offset, a, m0, mb, dots);
#endif
        for (int i = 0; i < mb; ++i) y[(m0 + i) * n + r] = bias ? dots[i] + bias[r] : dots[i];
      }
    }
  });
}

at::Tensor qdot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t bits, int64_t group, int64_t offset,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "qdot: x must be contiguous f32 [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "qdot: bits must be 4 or 8");
  TORCH_CHECK(group == 16 || group == 32, "qdot: group must be 16 or 32");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % kChunk == 0, "qdot: K must be a multiple of 64, got ", k);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2, "qdot: codes must be contiguous uint8 [N, *]");
  const int64_t n = codes.size(0);
  TORCH_CHECK(codes.size(1) == (bits == 8 ? k : k / 2), "qdot: codes have ", codes.size(1), " bytes per row for K = ", k);
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
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const QuantizedActivations a = quantize_activations(x.data_ptr<float>(), m, k, group);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* z = has_zeros ? reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::Half>()) : nullptr;
  float* out = y.data_ptr<float>();
  if (bits == 4 && group == 32) run<4, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 8 && group == 32) run<8, 32>(a, c, s, z, offset, bias_ptr, n, out);
  else if (bits == 8 && group == 16) run<8, 16>(a, c, s, z, offset, bias_ptr, n, out);
  else TORCH_CHECK(false, "qdot: 4-bit codes need groups of 32");
  return y;
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
  m.def("qdot_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int bits, int group, int offset, Tensor? bias) -> Tensor");
  m.def("qdot_isa() -> str", &qdot_isa);
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("qdot_linear", &qdot_linear);
}
