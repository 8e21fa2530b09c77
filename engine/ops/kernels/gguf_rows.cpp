// Rows of a GGUF tensor dequantized to f32 straight from the file's bytes (an embedding lookup).
//
// Why: engine.ops.dequant's torch dequantizers take ~100 small tensor ops per call whatever the
// row count, which is a fixed cost of every forward (the new tokens' embeddings). Here one row is a
// loop over its blocks. The float steps are those of the torch code (itself bit-identical to
// gguf-py): one rounding for each product and each add, never fused (fp-contract off), so the
// values are the same bits (tests/engine/ops/test_gguf_rows.py).
//
//   dequantize_gguf_rows(raw [rows, row_bytes] uint8, ggml_type, k, ids [n] int64) -> f32 [n, k]
//   gguf_rows_types() -> the ggml types it takes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//                        Q4_K, Q5_K, Q6_K
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "native.h"

namespace {

enum GgmlType : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                          Q6_K = 14, BF16 = 30 };

struct BlockShape {
  int64_t values, bytes;
};

bool block_shape(int64_t type, BlockShape& s) {
  switch (type) {
    case F32: s = {1, 4}; return true;
    case F16: s = {1, 2}; return true;
    case BF16: s = {1, 2}; return true;
    case Q4_0: s = {32, 18}; return true;
    case Q4_1: s = {32, 20}; return true;
    case Q5_0: s = {32, 22}; return true;
    case Q5_1: s = {32, 24}; return true;
    case Q8_0: s = {32, 34}; return true;
    case Q4_K: s = {256, 144}; return true;
    case Q5_K: s = {256, 176}; return true;
    case Q6_K: s = {256, 210}; return true;
    default: return false;
  }
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes.
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 0x3F;
    mn = s[4 + j] & 0x3F;
  } else {
    sc = (s[8 + j - 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    mn = (s[8 + j - 4] >> 4) | ((s[4 + j - 4] >> 2) & 0x30);
  }
}

// One block at b into out[0 .. values). The order of the float operations is the torch code's.
__attribute__((optimize("fp-contract=off")))
void block_values(int64_t type, const uint8_t* b, float* out) {
  switch (type) {
    case F32: std::memcpy(out, b, 4); return;
    case F16: out[0] = f16_at(b); return;
    case BF16: {
      uint16_t v;
      std::memcpy(&v, b, 2);
      out[0] = static_cast<float>(c10::BFloat16(v, c10::BFloat16::from_bits()));
      return;
    }
    case Q4_0:
    case Q4_1:
    case Q5_0:
    case Q5_1: {
      const bool has_min = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
      const float d = f16_at(b), m = has_min ? f16_at(b + 2) : 0.f;
      const uint8_t* qh = b + (has_min ? 4 : 2);
      const uint8_t* qs = qh + (five ? 4 : 0);
      uint32_t high = 0;
      if (five) std::memcpy(&high, qh, 4);
      for (int j = 0; j < 32; ++j) {
        int q = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
        if (five) q |= ((high >> j) & 1) << 4;
        float w = static_cast<float>(q);
        if (!has_min) w -= five ? 16.f : 8.f;
        w *= d;
        if (has_min) w += m;
        out[j] = w;
      }
      return;
    }
    case Q8_0: {
      const float d = f16_at(b);
      for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return;
    }
    case Q4_K:
    case Q5_K: {
      const float d = f16_at(b), dmin = f16_at(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;                    // Q5_K: bit s of byte l = fifth bit of value 32 s + l
      const uint8_t* qs = b + (type == Q4_K ? 16 : 48);  // pair p: 32 bytes, low nibbles then high
      for (int s = 0; s < 8; ++s) {
        int sc, mn;
        k_scale_min(scales, s, sc, mn);
        const float dsc = d * static_cast<float>(sc), dm = dmin * static_cast<float>(mn);
        const uint8_t* pair = qs + 32 * (s / 2);
        for (int l = 0; l < 32; ++l) {
          int q = (pair[l] >> (4 * (s % 2))) & 0x0F;
          if (type == Q5_K) q |= ((qh[l] >> s) & 1) << 4;
          float w = static_cast<float>(q);
          w *= dsc;
          w -= dm;
          out[32 * s + l] = w;
        }
      }
      return;
    }
    case Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16_at(b + 208);
      for (int v = 0; v < 256; ++v) {
        const int h = v / 128, r = v % 128;
        const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        const float dsc = d * static_cast<float>(sc[v / 16]);
        float w = static_cast<float>(low | (high << 4));
        w -= 32.f;
        w *= dsc;
        out[v] = w;
      }
      return;
    }
    default: TORCH_CHECK(false, "dequantize_gguf_rows: unsupported type ", type);
  }
}

}  // namespace

namespace QDOT_NAMESPACE::native {

at::Tensor dequantize_gguf_rows(const at::Tensor& raw, int64_t type, int64_t k, const at::Tensor& ids_in) {
  BlockShape s;
  TORCH_CHECK(block_shape(type, s), "dequantize_gguf_rows: unsupported ggml type ", type);
  TORCH_CHECK(k > 0 && k % s.values == 0, "dequantize_gguf_rows: a row of ", k, " values is not whole blocks");
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.stride(1) == 1 &&
              raw.size(1) == k / s.values * s.bytes, "dequantize_gguf_rows: raw must be uint8 [rows, row bytes]");
  const at::Tensor ids = ids_in.to(at::kLong).contiguous();
  const int64_t n = ids.numel(), rows = raw.size(0);
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(ip[i] >= 0 && ip[i] < rows, "row index out of range for a tensor with ", rows, " rows");
  at::Tensor out = at::empty({n, k}, raw.options().dtype(at::kFloat));
  const uint8_t* base = raw.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = base + ip[i] * raw.stride(0);
    for (int64_t blk = 0; blk < k / s.values; ++blk) block_values(type, row + blk * s.bytes, op + i * k + blk * s.values);
  }
  return out;
}

}  // namespace QDOT_NAMESPACE::native

using QDOT_NAMESPACE::native::dequantize_gguf_rows;

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("dequantize_gguf_rows(Tensor raw, int ggml_type, int k, Tensor ids) -> Tensor");
  m.def("gguf_rows_types() -> int[]", []() -> std::vector<int64_t> {
    return {F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K};
  });
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("dequantize_gguf_rows", &dequantize_gguf_rows);
}
