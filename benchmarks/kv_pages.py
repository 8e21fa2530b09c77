"""Decode steps over long KV caches in 2 MB pages against 4 kB pages, side by side in one process.

    python -m benchmarks.kv_pages MODEL.gguf [--shapes 4000x1,1000x8,400x8,100x8] [--reps 20] [--threads 2]
        [--markdown PATH]

For each shape CONTEXTxSEQUENCES: SEQUENCES caches are filled with CONTEXT prompt positions each (a different
prompt per cache), then each is copied twice: into a cache as every load now makes it (``KVCache``: a mapping
advised for 2 MB pages, ``engine.ops.memory.empty_on_huge_pages``) and into ordinary 4 kB pages (a tensor
clone). Each rep times one decode step (one token per sequence: ``forward`` alone, ``forward_batch`` for several)
over each copy, the order alternating between reps, so the host's drift hits both alike; the step's new
positions are cut back after it. Reported: ms per step (median and min over reps) and the per-rep ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.output import emit, host_line


def _step(model, caches, token: int) -> float:
    """Seconds of one decode step over ``caches`` (their new position cut back after)."""
    from engine.models.transformer import SequenceRows

    lengths = [c.length for c in caches]
    t0 = time.perf_counter()
    if len(caches) == 1:
        model.forward([token], caches[0])
    else:
        model.forward_batch([SequenceRows([token], c) for c in caches])
    took = time.perf_counter() - t0
    for c, n in zip(caches, lengths):
        c.truncate(n)
    return took


def measure(model, context: int, sequences: int, reps: int, chunk: int = 256) -> dict[str, list[float]]:
    """ms per decode step of ``sequences`` caches at ``context`` positions, per rep: {'2 MB': [...], '4 kB': [...]}."""
    vocab = model.config.vocab_size
    huge, small = [], []
    for s in range(sequences):
        cache = model.new_cache(context + 8)
        prompt = [(1000 + 7 * s + i) % vocab for i in range(context)]
        for i in range(0, context, chunk):
            model.forward(prompt[i:i + chunk], cache, logits_for="none")
        plain = model.new_cache(context + 8)
        plain.k, plain.v = cache.k.clone(), cache.v.clone()  # torch's allocator: 4 kB pages
        plain.length, plain.tokens = cache.length, list(cache.tokens)
        huge.append(cache)
        small.append(plain)
    times: dict[str, list[float]] = {"2 MB": [], "4 kB": []}
    order = [("2 MB", huge), ("4 kB", small)]
    for r in range(reps):
        for name, caches in order if r % 2 == 0 else order[::-1]:
            times[name].append(_step(model, caches, 5) * 1e3)
    return times


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kv_pages", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--shapes", default="4000x1,1000x8,400x8,100x8", help="CONTEXTxSEQUENCES, comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)

    import torch

    from engine.models.loader import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    lines = [f"`python -m benchmarks.kv_pages {' '.join(argv or [])}`".rstrip(), "", host_line(args.threads), "",
             "| context x sequences | 2 MB pages ms/step (median / min) | 4 kB pages ms/step (median / min) | "
             "2 MB / 4 kB per rep (median, range) |",
             "|---|---:|---:|---:|"]
    with torch.no_grad():
        for shape in args.shapes.split(","):
            context, sequences = (int(x) for x in shape.lower().split("x"))
            t = measure(model, context, sequences, args.reps)
            ratios = [a / b for a, b in zip(t["2 MB"], t["4 kB"])]
            lines.append(f"| {context} x {sequences} | {statistics.median(t['2 MB']):.2f} / {min(t['2 MB']):.2f} | "
                         f"{statistics.median(t['4 kB']):.2f} / {min(t['4 kB']):.2f} | "
                         f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return emit(lines, args.markdown)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
