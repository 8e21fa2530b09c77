"""The native decoder stack against the Python blocks, in one process, alternating forward by forward.

    python -m benchmarks.fused_stack MODEL.gguf [MODEL.gguf ...] [--forwards 120] [--context 128]
        [--widths 1,4] [--markdown out.md]

Both paths run the same kernels (engine.models.fused_stack), so their logits are bit-identical; what
differs is the Python and dispatch time between a block's small ops. Each forward appends ``w`` tokens
after a ``--context``-token prompt and is rolled back; the two paths alternate so the host's drift hits
both alike. Reported: median (p10-p90) ms per forward, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.output import emit, host_line
from engine.models.loader import load_model


@torch.no_grad()
def measure(path: str, forwards: int, context: int, widths: list[int]) -> list[str]:
    model = load_model(path)
    rows = []
    try:
        cache = model.new_cache(context + max(widths) + 1)
        model.forward(list(range(100, 100 + context)), cache, logits_for="none")
        base = cache.length
        for w in widths:
            times: dict[str, list[float]] = {"python": [], "native": []}
            for i in range(forwards * 2 + 2):
                path_name = "native" if i % 2 == 0 else "python"
                model.use_fused_stack(path_name == "native")  # the fused block ops stay on either way
                t0 = time.perf_counter()
                model.forward([1000] * w, cache, logits_for="all")
                if i >= 2:
                    times[path_name].append((time.perf_counter() - t0) * 1e3)
                cache.truncate(base)
            model.use_fused_stack(True)
            med = {k: statistics.median(v) for k, v in times.items()}

            def spread(v: list[float]) -> str:
                s = sorted(v)
                return f"{s[len(s) // 10]:.1f}-{s[9 * len(s) // 10]:.1f}"

            rows.append(f"| {Path(path).name} | {w} | {med['python']:.2f} ({spread(times['python'])}) | "
                        f"{med['native']:.2f} ({spread(times['native'])}) | {med['python'] / med['native']:.2f}x |")
    finally:
        model.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--forwards", type=int, default=120, help="timed forwards per path and width")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--widths", default="1,4")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    lines = ["# Native decoder stack vs Python blocks", "", host_line(torch.get_num_threads()), "",
             f"{args.forwards} forwards per path and width after a {args.context}-token prompt, alternating.", "",
             "| model | width | Python blocks ms (p10-p90) | native stack ms (p10-p90) | speed-up |",
             "|---|---:|---:|---:|---:|"]
    for path in args.models:
        lines += measure(path, args.forwards, args.context, widths)
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
