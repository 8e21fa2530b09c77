"""One decode forward from the engine's compute thread against the same forward from another thread.

    python -m benchmarks.thread_forward MODEL.gguf [--forwards 30] [--rounds 3] [--threads 2]

What ``engine.batching.compute`` is for: every thread that opens an OpenMP parallel region gets a team of worker
threads of its own, and once a process holds more workers than CPUs libgomp's teams stop spinning between regions.
A round times ``--forwards`` one-token forwards after a 32-token context on the compute thread, then as many from
this (the main) thread, which brings a second team; the median of each, per round, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.output import emit, host_line


def forwards_ms(model, cache, n: int) -> float:
    cache.truncate(0)
    model.forward(list(range(100, 132)), cache, logits_for="last")
    times = []
    for i in range(n):
        start = time.perf_counter()
        model.forward([200 + i], cache, logits_for="last")
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> str:
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--forwards", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    runtime = ModelRuntime.load(LoadSpec(model_path=args.model, num_ctx=256, num_thread=args.threads, device="cpu"))
    model = runtime.target
    cache = runtime.compute.run(lambda: model.new_cache(256))
    lines = [host_line(args.threads), "", f"`python -m benchmarks.thread_forward {' '.join(argv or [])}`".rstrip(), "",
             "| round | compute thread ms | another thread ms | another / compute |", "|---:|---:|---:|---:|"]
    for r in range(args.rounds):
        on_compute = runtime.compute.run(lambda: forwards_ms(model, cache, args.forwards))
        elsewhere = forwards_ms(model, cache, args.forwards)
        lines.append(f"| {r + 1} | {on_compute:.1f} | {elsewhere:.1f} | {elsewhere / on_compute:.2f} |")
    return emit(lines, args.markdown)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
