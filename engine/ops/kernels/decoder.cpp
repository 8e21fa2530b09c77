// A stack of pre-norm decoder blocks (the llama / qwen2 / qwen3 shape) run by one native call per forward.
//
// Why: between its matmuls a Python block makes ~25 small calls (norms, views, RoPE, the cache write,
// attention, SiLU, adds), each paying interpreter and dispatcher time, and the memory bus that the
// matmuls keep busy idles meanwhile: a decode step of Qwen2.5-Coder-1.5B spent about a fifth of its
// time there (docs/bench). Here the same kernels run in the same order (qdot_linear, block_rms_norm,
// block_rope, block_attention, block_silu_mul) from one call, so the results are bit-identical
// to engine.models.layers.Block's with the fused block ops (tests/engine/models/test_fused_stack.py).
// What is left between the matmuls is trimmed further: a split projection's parts run in one
// parallel pass into one output (no concatenation), the residual adds happen in the o and down
// projections' own stores (the same float additions), and the cache rows are plain copies.
//
//   DecoderStack(n_head, n_head_kv, head_dim, eps, neox, scale)    scale: the query scale
//   .add_layer(attn_norm, ffn_norm, q_norm?, k_norm?)               one per block, in order
//   .add_part(layer, which, codes, scales, zeros, supers, bias?, bits, group, offset, n)
//        which: "qkv" | "o" | "gate_up" | "down"; a linear of several parts concatenates their outputs
//   .forward(x [n, D], k_cache, v_cache [L, Hkv, capacity, head_dim], start, cos, sin [n, 1, hd/2])
//        -> x after every block; position start + i attends to positions [0, start + i] (causal)
//   .forward_batch(x [N, D], k_caches, v_caches, starts, lengths, cos, sin [N, 1, hd/2])
//        several sequences' rows in one pass (engine.batching): segment s is lengths[s] rows of x, at
//        positions starts[s] .. of its own caches; the linears, norms and RoPE run over all N rows at
//        once, the cache writes and the attention per segment, over that sequence's cache alone
//
// Layer l reads and writes cache layer l at positions [0, start + n): the caller checks room first.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "native.h"

namespace {

namespace native = QDOT_NAMESPACE::native;

// One engine.ops.linear.QDotLinear, or a SplitLinear of them (outputs concatenated, as it does), run
// as one parallel pass over all its parts; with a residual, y = linear(x) + residual in the same pass.
struct Linear {
  std::vector<native::QDotPart> parts;

  at::Tensor operator()(const at::Tensor& x, const std::optional<at::Tensor>& residual = std::nullopt) const {
    return native::qdot_linear_parts(x.contiguous(), parts,
                                     residual.has_value() ? std::optional<at::Tensor>(residual->contiguous()) : std::nullopt);
  }
};

struct Layer {
  at::Tensor attn_norm, ffn_norm;
  std::optional<at::Tensor> q_norm, k_norm;
  Linear qkv, o, gate_up, down;
};

class DecoderStack : public torch::CustomClassHolder {
 public:
  DecoderStack(int64_t n_head, int64_t n_head_kv, int64_t head_dim, double eps, bool neox, double scale)
      : n_head_(n_head), n_head_kv_(n_head_kv), head_dim_(head_dim), eps_(eps), neox_(neox), scale_(scale) {
    TORCH_CHECK(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0 && head_dim > 0 && head_dim % 2 == 0,
                "DecoderStack: bad head geometry");
  }

  int64_t add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, std::optional<at::Tensor> q_norm,
                    std::optional<at::Tensor> k_norm) {
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "DecoderStack: q and k norms come together");
    layers_.push_back(Layer{std::move(attn_norm), std::move(ffn_norm), std::move(q_norm), std::move(k_norm), {}, {}, {}, {}});
    return static_cast<int64_t>(layers_.size()) - 1;
  }

  void add_part(int64_t layer, const std::string& which, at::Tensor codes, at::Tensor scales, at::Tensor zeros,
                at::Tensor supers, std::optional<at::Tensor> bias, int64_t bits, int64_t group, int64_t offset,
                int64_t n) {
    TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()), "DecoderStack: no layer ", layer);
    Layer& l = layers_[layer];
    Linear* target = which == "qkv" ? &l.qkv : which == "o" ? &l.o : which == "gate_up" ? &l.gate_up
                     : which == "down" ? &l.down : nullptr;
    TORCH_CHECK(target != nullptr, "DecoderStack: unknown linear ", which);
    target->parts.push_back(native::QDotPart{std::move(codes), std::move(scales), std::move(zeros), std::move(supers),
                                             std::move(bias), bits, group, offset, n});
  }

  at::Tensor forward(at::Tensor x, at::Tensor k_cache, at::Tensor v_cache, int64_t start, at::Tensor cos,
                     at::Tensor sin) const {
    at::NoGradGuard no_grad;
    const int64_t L = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) >= L && v_cache.sizes() == k_cache.sizes() &&
                k_cache.size(1) == n_head_kv_ && k_cache.size(3) == head_dim_,
                "DecoderStack: caches must be [layers, n_head_kv, capacity, head_dim]");
    TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat &&
                k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "DecoderStack: caches must be float32 rows");
    const int64_t n = x.size(0);
    TORCH_CHECK(start >= 0 && start + n <= k_cache.size(2), "DecoderStack: positions beyond the cache");
    for (int64_t i = 0; i < L; ++i) x = block(layers_[i], x, k_cache[i], v_cache[i], start, cos, sin);
    return x;
  }

  at::Tensor forward_batch(at::Tensor x, std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches,
                           std::vector<int64_t> starts, std::vector<int64_t> lengths, at::Tensor cos,
                           at::Tensor sin) const {
    at::NoGradGuard no_grad;
    const int64_t L = static_cast<int64_t>(layers_.size());
    const size_t S = starts.size();
    TORCH_CHECK(k_caches.size() == S && v_caches.size() == S && lengths.size() == S && S > 0,
                "DecoderStack: one cache pair, start and length per segment");
    int64_t total = 0;
    for (size_t s = 0; s < S; ++s) {
      const at::Tensor& kc = k_caches[s];
      TORCH_CHECK(kc.dim() == 4 && kc.size(0) >= L && v_caches[s].sizes() == kc.sizes() && kc.size(1) == n_head_kv_ &&
                  kc.size(3) == head_dim_ && kc.scalar_type() == at::kFloat && v_caches[s].scalar_type() == at::kFloat &&
                  kc.stride(3) == 1 && v_caches[s].stride(3) == 1,
                  "DecoderStack: caches must be float32 [layers, n_head_kv, capacity, head_dim]");
      TORCH_CHECK(lengths[s] > 0 && starts[s] >= 0 && starts[s] + lengths[s] <= kc.size(2),
                  "DecoderStack: positions beyond a cache");
      total += lengths[s];
    }
    TORCH_CHECK(x.size(0) == total, "DecoderStack: the segments' lengths must add up to x's rows");
    std::vector<at::Tensor> kl(S), vl(S);
    for (int64_t i = 0; i < L; ++i) {
      for (size_t s = 0; s < S; ++s) {
        kl[s] = k_caches[s][i];
        vl[s] = v_caches[s][i];
      }
      x = block_segments(layers_[i], x, kl, vl, starts, lengths, cos, sin);
    }
    return x;
  }

 private:
  // engine.models.layers.Block.forward with Attention.forward and FeedForward.forward, op for op: one segment.
  at::Tensor block(const Layer& l, const at::Tensor& x, const at::Tensor& kc, const at::Tensor& vc, int64_t start,
                   const at::Tensor& cos, const at::Tensor& sin) const {
    return block_segments(l, x, {kc}, {vc}, {start}, {x.size(0)}, cos, sin);
  }

  // A block over several sequences' rows: everything row-wise over all rows, the cache writes and the
  // attention per segment (the same kernels, so each segment's rows get what they get alone).
  at::Tensor block_segments(const Layer& l, const at::Tensor& x, const std::vector<at::Tensor>& kcs,
                            const std::vector<at::Tensor>& vcs, const std::vector<int64_t>& starts,
                            const std::vector<int64_t>& lengths, const at::Tensor& cos, const at::Tensor& sin) const {
    const int64_t N = x.size(0), H = n_head_, Hkv = n_head_kv_, D = head_dim_;
    const at::Tensor qkv = l.qkv(native::block_rms_norm(x, l.attn_norm, eps_));
    const at::Tensor v = qkv.slice(1, (H + Hkv) * D).view({N, Hkv, D});
    at::Tensor qk;
    if (l.q_norm.has_value()) {
      qk = at::cat({native::block_rms_norm(qkv.slice(1, 0, H * D).view({N, H, D}), *l.q_norm, eps_),
                    native::block_rms_norm(qkv.slice(1, H * D, (H + Hkv) * D).view({N, Hkv, D}), *l.k_norm, eps_)},
                   1);
    } else {
      qk = qkv.slice(1, 0, (H + Hkv) * D).view({N, H + Hkv, D});
    }
    const at::Tensor rotated = native::block_rope(qk, cos, sin, neox_);  // contiguous [N, H + Hkv, D]
    std::vector<at::Tensor> keys, values;
    keys.reserve(starts.size());
    values.reserve(starts.size());
    int64_t row = 0;
    for (size_t s = 0; s < starts.size(); ++s) {
      const int64_t n = lengths[s], start = starts[s];
      write_cache(kcs[s], rotated.data_ptr<float>() + row * (H + Hkv) * D + H * D, (H + Hkv) * D, start, n);
      write_cache(vcs[s], v.data_ptr<float>() + row * qkv.stride(0), qkv.stride(0), start, n);
      keys.push_back(kcs[s].slice(1, 0, start + n));
      values.push_back(vcs[s].slice(1, 0, start + n));
      row += n;
    }
    // every segment's attention in one parallel region (one per segment cost a batch of eight decoding
    // sequences about a third of its step: docs/bench/serving-anchor-zen5.md)
    const at::Tensor o = native::block_attention_segments(rotated.slice(1, 0, H), keys, values, lengths, scale_);
    const at::Tensor h = l.o(o.view({N, H * D}), x);  // x + o(...)
    const at::Tensor gate_up = l.gate_up(native::block_rms_norm(h, l.ffn_norm, eps_));
    return l.down(native::block_silu_mul(gate_up), h);  // h + down(...)
  }

  // Cache rows [start, start + n) of one layer ([Hkv, capacity, D]) from n rows of Hkv heads x D
  // floats at src, row i at src + i * row_stride (a plain copy, without a tensor op's setup).
  void write_cache(const at::Tensor& cache, const float* src, int64_t row_stride, int64_t start, int64_t n) const {
    float* dst = cache.data_ptr<float>();
    const int64_t s0 = cache.stride(0), s1 = cache.stride(1), D = head_dim_;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < n_head_kv_; ++g)
        std::memcpy(dst + g * s0 + (start + i) * s1, src + i * row_stride + g * D, D * sizeof(float));
  }

  int64_t n_head_, n_head_kv_, head_dim_;
  double eps_;
  bool neox_;
  double scale_;
  std::vector<Layer> layers_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.class_<DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, double, bool, double>())
      .def("add_layer", &DecoderStack::add_layer)
      .def("add_part", &DecoderStack::add_part)
      .def("forward", &DecoderStack::forward)
      .def("forward_batch", &DecoderStack::forward_batch);
}
