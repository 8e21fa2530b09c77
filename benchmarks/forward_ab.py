"""Two checkouts' forwards side by side: one model loaded in each, forwards of each width timed alternately.

    python -m benchmarks.forward_ab --base DIR --model target.gguf [--widths 1,4,8] [--prefill 256]
        [--rounds 20] [--threads 2] [--markdown out.md]

For a change to the kernels or the forward (how they split work among threads, say) whose effect is a few percent
on a host whose own drift is more: each checkout loads the model once in a process of its own (its own kernel
build), both stay up, and each round asks both for the same forwards, the base first on even rounds and this
checkout first on odd ones, so the host's slow spells hit both sides alike. A forward of width w is w tokens after a
128-token prompt (logits for every row, as a verification or a batch of w sequences needs them), run and then
truncated away; ``--prefill N`` adds an N-token prompt chunk (logits for its last row). Reported per width: each
side's median and minimum (ms), and this checkout over the base (median over median, minimum over minimum).
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.output import emit, host_line

HERE = Path(__file__).resolve().parent.parent
PROMPT = 128  # tokens in the cache before every timed forward


def worker(model: str, ctx: int, threads: int) -> None:
    """A checkout's side: load ``model``, say ``ready``, then for each line ``width reps chunk`` print the reps'
    seconds. Self-contained (its source is what a side runs, so that a base checkout older than this benchmark can
    be measured): it imports only torch and that checkout's engine."""
    import sys
    import time

    import torch

    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    engine = ModelRuntime.load(LoadSpec(model_path=model, num_ctx=ctx, num_thread=threads, device="cpu"))
    target = engine.target
    cache = target.new_cache(ctx)
    vocab = target.config.vocab_size
    ids = [(1000 + i) % vocab for i in range(PROMPT)]
    torch.set_grad_enabled(False)
    target.forward(ids, cache, logits_for="last")
    print("ready", flush=True)
    for line in sys.stdin:
        width, reps, chunk = (int(x) for x in line.split())
        feed = [(2000 + i) % vocab for i in range(width)]
        times = []
        for _ in range(reps):
            cache.truncate(PROMPT)
            t0 = time.perf_counter()
            target.forward(feed, cache, logits_for="last" if chunk else "all")
            times.append(time.perf_counter() - t0)
        cache.truncate(PROMPT)
        print(" ".join(f"{t:.6f}" for t in times), flush=True)


def _start(tree: Path, model: str, ctx: int, threads: int) -> subprocess.Popen:
    """A worker in ``tree`` (its own packages first on the path, its own kernel build)."""
    code = (f"import sys\nsys.path.insert(0, {str(tree)!r})\nPROMPT = {PROMPT}\n" + textwrap.dedent(inspect.getsource(worker))
            + f"\nworker({model!r}, {ctx}, {threads})\n")
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise SystemExit(f"the worker in {tree} did not start (said {line!r})")
    return proc


def measure(base: Path, model: str, widths: list[int], prefill: int, rounds: int,
            threads: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per row label ("w=4", "prefill 256"): (the base's seconds, this checkout's), every rep of every round."""
    plan = [(f"w={w}", w, max(1, 8 // w), 0) for w in widths] + ([(f"prefill {prefill}", prefill, 1, 1)]
                                                                   if prefill else [])
    ctx = PROMPT + max([w for w in widths] + [prefill]) + 16
    sides = [_start(base, model, ctx, threads), _start(HERE, model, ctx, threads)]
    times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, *_ in plan}
    try:
        for r in range(rounds):
            for label, width, reps, chunk in plan:
                for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                    sides[side].stdin.write(f"{width} {reps} {chunk}\n")
                    sides[side].stdin.flush()
                    times[label][side].extend(float(x) for x in sides[side].stdout.readline().split())
    finally:
        for p in sides:
            p.stdin.close()
            p.wait(60)
    return times


def report(times: dict[str, tuple[list[float], list[float]]], command: str, threads: int) -> list[str]:
    lines = ["# Two checkouts' forwards, interleaved", "", host_line(threads), "", f"`{command}`", "",
             "| forward | base ms (median / min) | this ms (median / min) | this / base (median) | (min) |",
             "|---|---:|---:|---:|---:|"]
    for label, (a, b) in times.items():
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append(f"| {label} | {ma * 1e3:.1f} / {min(a) * 1e3:.1f} | {mb * 1e3:.1f} / {min(b) * 1e3:.1f} | "
                     f"{mb / ma:.3f} | {min(b) / min(a):.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.forward_ab", description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the other checkout (a git worktree of the commit before, say)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--widths", default="1,4,8")
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",") if w]
    times = measure(Path(args.base).resolve(), args.model, widths, args.prefill, args.rounds, args.threads)
    command = (f"python -m benchmarks.forward_ab --base {Path(args.base).name} --model {Path(args.model).name} "
               f"--widths {args.widths} --prefill {args.prefill} --rounds {args.rounds} --threads {args.threads}")
    emit(report(times, command, args.threads), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
