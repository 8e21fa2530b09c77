// The library's functions that its other files call directly (one C++ call, no dispatcher): the
// decoder stack (decoder.cpp) runs a block with exactly the kernels the Python path calls as ops.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

// The op namespace: "tandem" normally; the portable test build (no AVX-512) gets its own so that
// both can be loaded into one process and compared. It also names the C++ namespace below, so that
// the two builds' functions never resolve to each other.
#ifndef QDOT_NAMESPACE
#define QDOT_NAMESPACE tandem
#endif

namespace QDOT_NAMESPACE::native {

// qdot.cpp: y [M, N] = x [M, K] times the packed weight (+ bias); see its header for the layout.
// One part of a linear whose outputs are concatenated (q, k, v stored in different types).
struct QDotPart {
  at::Tensor codes, scales, zeros, supers;
  std::optional<at::Tensor> bias;
  int64_t bits = 0, group = 0, offset = 0, n = 0;
};
// y [M, sum of the parts' N] (+ residual [M, that N], added last) in one parallel pass over the parts.
at::Tensor qdot_linear_parts(const at::Tensor& x, const std::vector<QDotPart>& parts,
                             const std::optional<at::Tensor>& residual);
at::Tensor qdot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& zeros, const at::Tensor& supers, int64_t bits, int64_t group, int64_t offset,
                       int64_t n, const std::optional<at::Tensor>& bias);
at::Tensor qdot_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                           const at::Tensor& supers, int64_t bits, int64_t group, int64_t offset, int64_t n);

// blockops.cpp
at::Tensor block_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor block_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool neox);
at::Tensor block_silu_mul(const at::Tensor& gate_up);
at::Tensor block_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, double scale);
at::Tensor block_attention_segments(const at::Tensor& q, const std::vector<at::Tensor>& keys,
                                    const std::vector<at::Tensor>& values, const std::vector<int64_t>& lengths,
                                    double scale);

// gguf_rows.cpp
at::Tensor dequantize_gguf_rows(const at::Tensor& raw, int64_t type, int64_t k, const at::Tensor& ids);

}  // namespace QDOT_NAMESPACE::native
