"""A GGUF's linear layers by kind, timed at decode and verification widths.

    python -m benchmarks.linears MODEL.gguf [--widths 1,3,4,5] [--passes 7] [--format qdot] [--threads N]
        [--markdown out.md]
    python -m benchmarks.linears --synthetic Q5_0:4864x896,Q4_0:4864x896 OUT.gguf [--threads 1] [--passes 300]

Each kind is one weight name (``ffn_down``, ``attn_q``, ``output`` ...) in one quantization type: all of a
model's tensors of that kind and type are loaded as linears (``--format``, default ``qdot``) and a pass runs
each once on a random activation of each width. Reported per kind: the best pass in ms and picoseconds per
weight and activation row, which compares types at one width (a kernel's cost per weight) and widths for one
type (how flat verification is). To compare two checkouts, run this in each, alternating, as
``docs/bench/qdot-avx2-widths.md`` did.

``--synthetic TYPE:NxK,...`` first writes MODEL.gguf with one random weight of each (rows N, K values a row; a
type gguf-py can quantize: Q4_0, Q5_0, Q8_0 ...). One such weight of a few MB stays in the last-level cache, and
with ``--threads 1`` and a few hundred passes its best pass is the kernel's own cost, steady to about 1 % on a
shared host whose speed moves by half between minutes (docs/bench/q5-plane-zen3-avx2-dec07.md).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

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


def write_synthetic(path: str | Path, specs: str, seed: int = 0) -> None:
    """A GGUF at ``path`` holding one random weight (normal, scale 0.02) per ``TYPE:NxK`` of ``specs``, named
    ``blk.0.<type>_<N>x<K>.weight`` (so each is a kind of its own)."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    for spec in specs.split(","):
        type_name, shape = spec.split(":")
        n, k = (int(v) for v in shape.lower().split("x"))
        qtype = gguf.GGMLQuantizationType[type_name]
        weight = rng.standard_normal((n, k)).astype(np.float32) * 0.02
        writer.add_tensor(f"blk.0.{type_name.lower()}_{n}x{k}.weight", quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--widths", default="1,3,4,5")
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--format", default="qdot")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    ap.add_argument("--synthetic", help="write MODEL as random weights TYPE:NxK[,TYPE:NxK...] first")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.synthetic:
        write_synthetic(args.model, args.synthetic)
    rows = measure(args.model, widths, args.passes, args.format)
    head = ["kind", "tensors", *(f"m={m} ms (ps / weight / row)" for m in widths)]
    lines = [host_line(torch.get_num_threads()), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
