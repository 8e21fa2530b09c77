"""A GGUF's linear layers by kind, timed at decode and verification widths.

    python -m benchmarks.linears MODEL.gguf [--widths 1,3,4,5] [--passes 7] [--format qdot] [--markdown out.md]

Each kind is one weight name (``ffn_down``, ``attn_q``, ``output`` ...) in one quantization type: all of a
model's tensors of that kind and type are loaded as linears (``--format``, default ``qdot``) and a pass runs
each once on a random activation of each width. Reported per kind: the best pass in ms and picoseconds per
weight and activation row, which compares types at one width (a kernel's cost per weight) and widths for one
type (how flat verification is). To compare two checkouts, run this in each, alternating, as
``docs/bench/qdot-avx2-widths.md`` did.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from benchmarks.output import emit, host_line
from engine.contract.gguf import GGUFFile
from engine.ops.linear import load_linear


def kinds(f: GGUFFile) -> dict[str, list[str]]:
    """Weight names by (kind, type): "ffn_down Q6_K" -> ["blk.0.ffn_down.weight", ...]; 2-D weights only,
    embeddings left out (a lookup, not a matmul)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, t in f.tensors.items():
        if len(t.shape) != 2 or not name.endswith(".weight") or name.startswith("token_embd"):
            continue
        kind = name.split(".")[-2] if name.startswith("blk.") else name.removesuffix(".weight")
        out[f"{kind} {t.type_name}"].append(name)
    return dict(sorted(out.items()))


@torch.no_grad()
def measure(path: str, widths: list[int], passes: int, fmt: str) -> list[list[str]]:
    f = GGUFFile(path)
    rows = []
    for kind, names in kinds(f).items():
        lins = [load_linear(f, n, fmt) for n in names]
        k = lins[0].in_features
        weights = sum(f.tensors[n].n_elements for n in names)
        cells = [kind, str(len(names))]
        for m in widths:
            x = torch.randn(m, k)
            for lin in lins:
                lin(x)  # warm: first-call allocations, pages
            best = float("inf")
            for _ in range(passes):
                t0 = time.perf_counter()
                for lin in lins:
                    lin(x)
                best = min(best, time.perf_counter() - t0)
            cells.append(f"{best * 1e3:.2f} ({best * 1e12 / weights / m:.1f} ps)")
        rows.append(cells)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--widths", default="1,3,4,5")
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--format", default="qdot")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    rows = measure(args.model, widths, args.passes, args.format)
    head = ["kind", "tensors", *(f"m={m} ms (ps / weight / row)" for m in widths)]
    lines = [host_line(torch.get_num_threads()), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
