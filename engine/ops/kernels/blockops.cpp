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
//   block_attention(q [n, H, D], keys, values [Hkv, S, D], scale)
//        softmax(q k^T * scale) v [n, H, D] where query i sees keys [0, S - n + i] (the queries are
//        the last n key positions: causal attention, or a window when keys start later); query
//        head h reads key head h / (H / Hkv).
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
#include <vector>

#include "native.h"

namespace {

void check_f32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 0 || t.stride(-1) == 1, what, " must be contiguous in its last dimension");
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

at::Tensor block_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, double scale) {
  check_f32(q, "q");
  check_f32(keys, "keys");
  check_f32(values, "values");
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.sizes() == keys.sizes(), "q must be [n, H, D], keys and values [Hkv, S, D]");
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), Hkv = keys.size(0), S = keys.size(1);
  TORCH_CHECK(keys.size(2) == D && Hkv > 0 && H % Hkv == 0, "heads: ", H, " query heads over ", Hkv, " key heads");
  TORCH_CHECK(S >= n, "attention: ", n, " queries over ", S, " keys");
  const int64_t rep = H / Hkv;
  at::Tensor out = at::empty({n, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = keys.stride(0), ks1 = keys.stride(1);
  const int64_t vs0 = values.stride(0), vs1 = values.stride(1);
  const float fscale = static_cast<float>(scale);
  // one task per (query, key head): the key head's rows are read once for its rep query heads
  at::parallel_for(0, n * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rep * S);
    std::vector<float> acc(rep * D);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / Hkv, g = t % Hkv, len = S - n + i + 1;
      const float* kg = kp + g * ks0;
      const float* vg = vp + g * vs0;
      for (int64_t j = 0; j < len; ++j) {
        const float* kr = kg + j * ks1;
        for (int64_t r = 0; r < rep; ++r) {
          const float* qr = qp + i * qs0 + (g * rep + r) * qs1;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
          scores[r * S + j] = dot * fscale;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::vector<float> sums(rep, 0.f);
      for (int64_t r = 0; r < rep; ++r) {
        float* sr = scores.data() + r * S;
        float mx = sr[0];
        for (int64_t j = 1; j < len; ++j) mx = std::max(mx, sr[j]);
        float sum = 0.f;
        for (int64_t j = 0; j < len; ++j) {
          sr[j] = std::exp(sr[j] - mx);
          sum += sr[j];
        }
        sums[r] = sum;
      }
      for (int64_t j = 0; j < len; ++j) {
        const float* vr = vg + j * vs1;
        for (int64_t r = 0; r < rep; ++r) {
          const float p = scores[r * S + j];
          float* ar = acc.data() + r * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ar[d] += p * vr[d];
        }
      }
      for (int64_t r = 0; r < rep; ++r) {
        const float inv = 1.f / sums[r];
        float* orow = op + (i * H + g * rep + r) * D;
        const float* ar = acc.data() + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) orow[d] = ar[d] * inv;
      }
    }
  });
  return out;
}

}  // namespace QDOT_NAMESPACE::native

using QDOT_NAMESPACE::native::block_attention;
using QDOT_NAMESPACE::native::block_rms_norm;
using QDOT_NAMESPACE::native::block_rope;

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("block_rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("block_rope(Tensor x, Tensor cos, Tensor sin, bool neox) -> Tensor");
  m.def("block_attention(Tensor q, Tensor keys, Tensor values, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("block_rms_norm", &block_rms_norm);
  m.impl("block_rope", &block_rope);
  m.impl("block_attention", &block_attention);
}
