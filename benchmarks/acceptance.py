"""A round's sampling and acceptance time: the sampler's pipeline plus a rule, over a real vocabulary's width.

    python -m benchmarks.acceptance [--vocab 151936] [--widths 1,3,5] [--reps 200] [--markdown out.md]

Times ``engine.sampling.sampler.process`` followed by ``strict_accept`` on random logits, per verification
width and sampling setting, handing the rule either the sampler's ``Distribution`` (its candidates, what the
decode loop passes) or its dense ``[width, vocab]`` rows, alternately, in one process. Reported: median ms
per round for each, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.output import emit, host_line
from engine.sampling.sampler import SamplingOptions, process
from engine.speculative.acceptance import strict_accept

SETTINGS = {
    "greedy": SamplingOptions(temperature=0),
    "t0.6 min_p 0.01": SamplingOptions(temperature=0.6, min_p=0.01),
}


def time_rounds(vocab: int, width: int, opts: SamplingOptions, reps: int, seed: int = 0) -> dict[str, float]:
    """Median seconds of process + strict_accept per round, for each form of the target rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(width, vocab, generator=gen) * 3
    drafts = [int(i) for i in logits[:-1].argmax(-1)]  # accepted drafts: the round reaches its bonus
    history = list(range(1000, 1300))
    times: dict[str, list[float]] = {"candidates": [], "dense": []}
    for i in range(2 * reps):
        form = "candidates" if i % 2 == 0 else "dense"
        t0 = time.perf_counter()
        dist = process(logits, history, drafts, opts)
        strict_accept(dist if form == "candidates" else dist.probs, None, drafts, gen)
        times[form].append(time.perf_counter() - t0)
    return {form: statistics.median(v) for form, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.acceptance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936, help="logits per row (default: Qwen2.5's)")
    ap.add_argument("--widths", default="1,3,5", help="verification widths: drafts + 1")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    lines = ["# Sampling + acceptance per round", "", host_line(torch.get_num_threads()), "",
             f"`python -m benchmarks.acceptance --vocab {args.vocab} --widths {args.widths} --reps {args.reps}`", "",
             "| sampling | width | Distribution ms | dense rows ms | dense / Distribution |",
             "|---|---:|---:|---:|---:|"]
    for name, opts in SETTINGS.items():
        for width in (int(w) for w in args.widths.split(",") if w):
            t = time_rounds(args.vocab, width, opts, args.reps)
            lines.append(f"| {name} | {width} | {t['candidates'] * 1e3:.3f} | {t['dense'] * 1e3:.3f} | "
                         f"{t['dense'] / t['candidates']:.2f}x |")
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
