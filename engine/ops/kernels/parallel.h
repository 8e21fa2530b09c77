// Work handed out in chunks from a shared counter: one parallel region whose threads each take the next chunk
// until none is left, instead of at::parallel_for's split into one contiguous share per thread up front.
//
// Why: a share fixed up front is only balanced when every item costs the same and every core runs as fast.
// A prompt chunk's causal attention gives its later rows more keys (the first chunk's second half has three
// times the first half's keys), and on a shared host one core is often slower for a while; the other thread
// then waited at the region's end. Each item is computed the same whichever thread takes it, so the results do
// not change. Not for streams through memory: the linears' weight blocks taken this way restarted a weight
// stream at every chunk and ran 1.1x slower (docs/bench/attention-reductions-zen5.md).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace {

// Chunks of `chunk` items of [0, n) (the last may be shorter), on torch's threads: each thread makes its worker
// once (make_worker(): scratch buffers it reuses) and calls worker(begin, end) for every chunk it takes.
template <typename MakeWorker>
inline void parallel_chunks(int64_t n, int64_t chunk, const MakeWorker& make_worker) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + chunk - 1) / chunk);
  std::atomic<int64_t> next{0};
  // One task per thread (inside another parallel region, or with one thread, the one call takes every chunk).
  at::parallel_for(0, std::max<int64_t>(threads, 1), 1, [&](int64_t, int64_t) {
    auto worker = make_worker();
    for (int64_t b; (b = next.fetch_add(chunk, std::memory_order_relaxed)) < n;) worker(b, std::min(n, b + chunk));
  });
}

}  // namespace
