"""How fast a long prompt is evaluated by the size of the chunks it goes through the target in.

    python -m benchmarks.prompt_chunks MODEL.gguf [--lengths 1700,4000] [--chunks 64,128,256,384,512] [--reps 3]
        [--threads 2] [--markdown out.md]

The model is loaded once; each repetition runs every (length, chunk) cell once, in order, so the host's drift
falls on all cells alike. A cell is one prompt of that many tokens on an empty cache, forwarded chunk by chunk
with logits for its last position only (what a request's prefill does). Reported: prompt tokens / seconds, the
median over repetitions, and each chunk's rate over the best chunk's at that length. This chose
``engine.batching.policy.PROMPT_CHUNK_ROWS``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.output import emit, host_line


def time_prompt(model, cache, ids: list[int], chunk: int) -> float:
    cache.truncate(0)
    start = time.perf_counter()
    for i in range(0, len(ids), chunk):
        model.forward(ids[i:i + chunk], cache, logits_for="last" if i + chunk >= len(ids) else "none")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> str:
    from engine.batching.compute import ComputeThread

    # on the thread the engine runs its forwards on (engine.batching.compute)
    return ComputeThread.shared().run(lambda: _main(argv))


def _main(argv: list[str] | None) -> str:
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--lengths", default="1700,4000")
    ap.add_argument("--chunks", default="64,128,256,384,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    runtime = ModelRuntime.load(LoadSpec(model_path=args.model, num_ctx=max(lengths) + 16, num_thread=args.threads,
                                         device="cpu"))
    model = runtime.target
    cache = model.new_cache(max(lengths) + 16)
    text = open(__file__, encoding="utf-8").read()  # code and prose: real tokens of any vocabulary
    tokens = runtime.tokenize(text)
    seconds: dict[tuple[int, int], list[float]] = {}
    time_prompt(model, cache, list(range(100, 164)), 64)  # warm up
    for _ in range(args.reps):
        for n in lengths:
            ids = (tokens * (n // len(tokens) + 1))[:n]
            for c in chunks:
                seconds.setdefault((n, c), []).append(time_prompt(model, cache, ids, c))
    lines = [host_line(args.threads), "", f"`python -m benchmarks.prompt_chunks {' '.join(argv or [])}`".rstrip(), "",
             "| prompt tokens | " + " | ".join(f"chunk {c} tok/s" for c in chunks) + " | best |",
             "|---:|" + "---:|" * (len(chunks) + 1)]
    for n in lengths:
        rates = {c: n / statistics.median(seconds[(n, c)]) for c in chunks}
        best = max(rates, key=rates.get)
        lines.append(f"| {n} | " + " | ".join(f"{rates[c]:.1f} ({rates[c] / rates[best]:.2f})" for c in chunks)
                     + f" | {best} |")
    return emit(lines, args.markdown)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
