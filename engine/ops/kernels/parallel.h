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
#include <memory>

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

// [0, n) in one contiguous share per thread, as at::parallel_for splits it, except that a thread done with its own
// share takes `chunk` items at a time from the far end of another's: fn(begin, end) for every piece, each item
// exactly once. For streams through memory (the linears' weight blocks): a share is still read front to back as
// one stream (pieces taken from a shared counter restarted the stream at every chunk: see above), and only the
// tail of a slower thread's share moves. On a shared host one core is often slower for a while, and with fixed
// shares the other then waited at the region's end (libgomp's barrier spin: 7 % of a 2-core Zen 3's eight-row
// forward, 12 % of a Zen 4's under eight clients).
template <typename Fn>
inline void parallel_shares(int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + chunk - 1) / chunk);
  if (threads <= 1 || at::in_parallel_region()) {
    fn(0, n);
    return;
  }
  // Share t: [front, back) packed in one word (front in the high half), so that its owner taking from the front
  // and a thief taking from the back agree on what is left with one compare-and-swap each.
  TORCH_CHECK(n < (int64_t{1} << 32), "parallel_shares: ", n, " items do not fit a share's 32-bit bounds");
  struct alignas(64) Share {
    std::atomic<uint64_t> range;
    static uint64_t pack(uint64_t front, uint64_t back) { return front << 32 | back; }
    // Up to `chunk` items from the front (the owner) or the back (a thief): false when none is left.
    bool take(uint64_t chunk, bool from_back, int64_t& begin, int64_t& end) {
      for (uint64_t r = range.load(std::memory_order_relaxed);;) {
        const uint64_t front = r >> 32, back = r & 0xFFFFFFFFu;
        if (front >= back) return false;
        const uint64_t size = std::min<uint64_t>(back - front, chunk);
        const uint64_t b = from_back ? back - size : front;
        const uint64_t rest = from_back ? pack(front, b) : pack(b + size, back);
        if (range.compare_exchange_weak(r, rest, std::memory_order_relaxed)) {
          begin = static_cast<int64_t>(b);
          end = static_cast<int64_t>(b + size);
          return true;
        }
      }
    }
  };
  std::unique_ptr<Share[]> shares(new Share[threads]);
  for (int64_t t = 0; t < threads; ++t) {
    shares[t].range.store(Share::pack(n * t / threads, n * (t + 1) / threads));
  }
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t begin, end;
      // Own share, front to back; then the back of the others' shares, a chunk at a time, while any is left.
      while (shares[t].take(chunk, false, begin, end)) fn(begin, end);
      for (bool took = true; took;) {
        took = false;
        for (int64_t v = 1; v < threads; ++v) {
          if (shares[(t + v) % threads].take(chunk, true, begin, end)) {
            fn(begin, end);
            took = true;
          }
        }
      }
    }
  });
}

}  // namespace

