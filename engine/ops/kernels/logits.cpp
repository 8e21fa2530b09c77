// Row reductions over a vocabulary of logits that sampling does every token, CPU, float32.
//
// Why: a greedy step needs the lowest id of each row's maximum, and a drafter's step also its top
// probability at temperature 1 (draft_p_min); over a 152k vocabulary PyTorch takes several ops for
// each (argmax tracks an index per lane; ties need a second pass; softmax writes a whole row to read
// one value back), ~0.15-0.5 ms a row. Here each is one or two passes over the row.
//
//   logits_argmax(x [n, V])           -> int64 [n]: the lowest index holding the row's maximum;
//                                        -1 for a row holding NaN (the caller's general path decides)
//   logits_top_probability(x [n, V])  -> f32 [n]: max softmax(x[i]) = 1 / sum_j e^(x[i, j] - max);
//                                        NaN where softmax gives NaN (a NaN or +inf logit, or every
//                                        logit -inf)
//
// Rows may be strided (a view of a wider tensor) if each row is contiguous.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "native.h"  // QDOT_NAMESPACE
#include "vec.h"

namespace {

void check_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "logits must be float32 on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "logits must be [n, V] with contiguous rows");
}

// The row's maximum ignoring NaN, and whether it holds one.
struct RowMax {
  float value;
  bool nan;
};

RowMax row_max(const float* x, int64_t V) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  v8f m = v8f{} + neg_inf;
  v8i nan = {};
  int64_t j = 0;
  for (; j + 8 <= V; j += 8) {
    const v8f v = *reinterpret_cast<const v8f*>(x + j);
    nan |= v != v;
    m = v > m ? v : m;  // a NaN lane compares false: m keeps its value
  }
  float best = neg_inf;
  bool has_nan = false;
  for (int i = 0; i < 8; ++i) {
    best = m[i] > best ? m[i] : best;
    has_nan = has_nan || nan[i] != 0;
  }
  for (; j < V; ++j) {
    has_nan = has_nan || x[j] != x[j];
    best = x[j] > best ? x[j] : best;
  }
  return {best, has_nan};
}

// The first index holding m (which the row holds), 32 values at a time.
int64_t first_index_of(const float* x, int64_t V, float m) {
  int64_t j = 0;
  for (; j + 32 <= V; j += 32) {
    const v8i hit = (*reinterpret_cast<const v8f*>(x + j) == m) | (*reinterpret_cast<const v8f*>(x + j + 8) == m) |
                    (*reinterpret_cast<const v8f*>(x + j + 16) == m) | (*reinterpret_cast<const v8f*>(x + j + 24) == m);
    bool any = false;
    for (int i = 0; i < 8; ++i) any = any || hit[i] != 0;
    if (any) break;
  }
  for (; j < V; ++j)
    if (x[j] == m) return j;
  return 0;  // unreachable: m is one of the row's values (-inf too, when every value is)
}

// out[i] = value(row i, V, its RowMax) for every row of x, rows in parallel; out has T's dtype.
template <typename T, typename F>
at::Tensor per_row(const at::Tensor& x, const char* op, F value) {
  check_rows(x);
  const int64_t n = x.size(0), V = x.size(1), stride = x.stride(0);
  TORCH_CHECK(V > 0, op, ": rows must not be empty");
  at::Tensor out = at::empty({n}, x.options().dtype(c10::CppTypeToScalarType<T>::value));
  const float* xp = x.data_ptr<float>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * stride;
      dst[i] = value(row, V, row_max(row, V));
    }
  });
  return out;
}

at::Tensor logits_argmax(const at::Tensor& x) {
  return per_row<int64_t>(x, "logits_argmax", [](const float* row, int64_t V, const RowMax& m) -> int64_t {
    return m.nan ? -1 : first_index_of(row, V, m.value);
  });
}

at::Tensor logits_top_probability(const at::Tensor& x) {
  return per_row<float>(x, "logits_top_probability", [](const float* row, int64_t V, const RowMax& m) -> float {
    if (m.nan || std::isinf(m.value)) return std::numeric_limits<float>::quiet_NaN();
    // e^(x - max) <= 1 everywhere. A -inf logit (a pruned head's) is clamped here first, as
    // exp_nonpositive's own clamp cannot take infinities, to -87: ~1.6e-38 each, which no sum of
    // a vocabulary notices.
    // Float sums over 512 values, added up in double: one float sum over 152k terms drifts by
    // ~1e-5 (as torch's float32 softmax does); this stays within 1e-7 of float64.
    const v8f lo = v8f{} - 87.0f;
    double sum = 0.0;
    int64_t j = 0;
    while (j + 8 <= V) {
      v8f acc = {};
      for (const int64_t stop = std::min(V, j + 512); j + 8 <= stop; j += 8) {
        const v8f d = *reinterpret_cast<const v8f*>(row + j) - m.value;
        acc += exp_nonpositive(d > lo ? d : lo);
      }
      sum += hsum(acc);
    }
    for (; j < V; ++j) sum += std::exp(row[j] - m.value);
    return static_cast<float>(1.0 / sum);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("logits_argmax(Tensor x) -> Tensor");
  m.def("logits_top_probability(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("logits_argmax", &logits_argmax);
  m.impl("logits_top_probability", &logits_top_probability);
}
