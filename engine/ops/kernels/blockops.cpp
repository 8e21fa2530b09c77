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
// x may be a strided view (q and k inside the fused qkv projection) if its last dimension is
// contiguous. Attention stays with PyTorch's flash kernel: a key-tiled loop written here beat it
// only on short contexts (27 vs 43 us at 50 keys) and lost on long ones (156 vs 118 us at 400).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

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

}  // namespace QDOT_NAMESPACE::native

using QDOT_NAMESPACE::native::block_rms_norm;
using QDOT_NAMESPACE::native::block_rope;

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("block_rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("block_rope(Tensor x, Tensor cos, Tensor sin, bool neox) -> Tensor");
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("block_rms_norm", &block_rms_norm);
  m.impl("block_rope", &block_rope);
}
