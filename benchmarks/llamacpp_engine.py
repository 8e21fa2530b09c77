"""The llamacpp engine measured: what tandem adds in front of llama-server, and tandem's own engine beside it.

    python -m benchmarks.llamacpp_engine --model TARGET.gguf [--draft DRAFT.gguf] [--levels 1,8] [--tokens 64]
        [--rounds 3] [--parallel 8] [--native] [--markdown out.md]

Starts ``tandem serve`` on a fresh store and creates ``llamacpp`` (``PARAMETER engine llamacpp``) from the GGUF, with
``--draft`` also ``llamacpp-spec`` (the DRAFT pair through llama-server's draft-simple, depth 4), and with
``--native`` the same model on tandem's own engine (``native``). The ``llamacpp`` model's own llama-server (its
``/api/ps`` endpoint) is measured directly too (``llamacpp-direct``; the pair's as ``llamacpp-spec-direct``): one
process, with and without tandem in front, so the ratio is tandem's overhead alone (its HTTP front, the engine process
relaying the stream, its rendering).
Every level runs every target in turn, each round, every other round in reverse (the host drifts). Every client
streams one greedy completion of the same chat-formatted text: from llama-server's own ``/v1/completions``, and from
tandem's ``/api/generate`` in raw mode (the same tokens).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.output import emit, host_line
from benchmarks.serving import (create, drafted_cell, endpoint_of, interleaved_rounds, run_level, start_server,
                               stop_server, stream_completion, stream_raw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.llamacpp_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--native", action="store_true", help="also the same GGUF on tandem's own engine")
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--settle", type=float, default=60.0, help="seconds between the loads and the first round")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    home = Path(tempfile.mkdtemp(prefix="tandem-llamacpp-bench-"))
    shutil.copy(args.model, home / "target.gguf")
    base = f"FROM {home / 'target.gguf'}\nPARAMETER num_ctx 2048\n"
    models = {"llamacpp": base + "PARAMETER engine llamacpp\nPARAMETER drafter none\n"}
    if args.draft:
        shutil.copy(args.draft, home / "draft.gguf")
        models["llamacpp-spec"] = (base + f"DRAFT {home / 'draft.gguf'}\nPARAMETER engine llamacpp\n"
                                   "PARAMETER draft_num_predict 4\nPARAMETER draft_schedule fixed\n")
    if args.native:
        models["native"] = base + "PARAMETER engine native\nPARAMETER drafter none\n"
    proc, url = start_server(home, args.parallel)
    cells: dict[tuple[str, int], list[dict]] = {}
    try:
        for name, modelfile in models.items():
            create(url, name, modelfile)
        targets = [(name, url, name, stream_raw) for name in models]
        for _, u, name, stream in targets:  # load, and warm
            run_level(u, name, 1, 8, stream)
        # a native engine writes its packed-weight cache in the background after its first load: a measurement
        # beside that write measures the write (0.71x instead of 0.96x for the llamacpp target through tandem)
        time.sleep(args.settle)
        targets.insert(1, ("llamacpp-direct", endpoint_of(url, "llamacpp"), "direct", stream_completion))
        if args.draft:
            targets.insert(3, ("llamacpp-spec-direct", endpoint_of(url, "llamacpp-spec"), "direct", stream_completion))
        cells = interleaved_rounds(targets, levels, args.rounds, args.tokens)
    finally:
        stop_server(proc)
        if os.environ.get("TANDEM_BENCH_KEEP"):
            print(f"kept {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    lines = ["# The llamacpp engine: tandem in front of llama-server", "",
             host_line(os.cpu_count() or 1), "",
             f"`python -m benchmarks.llamacpp_engine --model {Path(args.model).name}"
             + (f" --draft {Path(args.draft).name}" if args.draft else "") + (" --native" if args.native else "")
             + f" --levels {args.levels} --tokens {args.tokens} --rounds {args.rounds} --parallel {args.parallel}`", "",
             "× direct: the median over rounds of this target's aggregate over llama-server's own in the same round "
             "(llamacpp and llamacpp-direct are one llama-server process, llamacpp-spec and llamacpp-spec-direct "
             "another; native against llamacpp-direct). × plain: over the same engine without speculation.", "",
             "| target | clients | aggregate tok/s | × direct | × plain | stream tok/s (median) | inter-token ms p50 "
             "| drafted (accepted) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (label, c), runs in cells.items():
        agg = statistics.median(r["aggregate"] for r in runs)
        spec = label.startswith("llamacpp-spec")
        direct = cells.get(("llamacpp-spec-direct" if spec else "llamacpp-direct", c))
        plain = cells.get(("llamacpp-direct" if label.endswith("direct") else "llamacpp", c)) if spec else None

        def ratio(other):
            return f"{statistics.median(r['aggregate'] / o['aggregate'] for r, o in zip(runs, other)):.3f}" \
                if other else ""

        lines.append(f"| {label} | {c} | {agg:.2f} | {ratio(direct)} | {ratio(plain)} | "
                     f"{statistics.median(r['stream'] for r in runs):.2f} | "
                     f"{statistics.median(r['itl_p50_ms'] for r in runs):.0f} | {drafted_cell(runs)} |")
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
