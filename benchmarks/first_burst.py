"""The first burst of clients after a load: what a model's first concurrent users see.

    python -m benchmarks.first_burst --model target.gguf [--draft draft.gguf] [--clients 8] [--tokens 64] [--rounds 3]
        [--parallel 8] [--idle SECONDS] [--base PATH] [--markdown out.md]

Each round starts ``tandem serve`` afresh (``--parallel`` slots, on a store in a temporary directory whose packed
weights one load before the rounds wrote: a restart's load), creates the plain model (no speculation; with
``--draft`` the DRAFT pair instead), loads it with one short request, and then sends ``--clients`` greedy requests
at once, each with a prompt no request asked before, streaming ``--tokens`` tokens through ``/api/generate`` in raw
mode (benchmarks.serving's prompts and client), at once or ``--idle`` seconds after the load. Reported per round:
the aggregate tokens/s of the burst (its tokens over its wall time), the time to the first token (median and slowest
over the clients) and the p95 over the streams of their mean inter-token latency. The steady state of the same
server follows in each round: one more burst of fresh prompts.

Why its own benchmark: a server's first burst meets what no later one does (slots whose caches were never written,
first-time allocations), and benchmarks.serving's levels run on one long-lived server. With ``--base PATH`` (another
checkout, e.g. a ``git worktree`` of the commit before a change) every round runs that tree's server too, the two
alternating (the host drifts), each from its own tree with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.output import emit, host_line
from benchmarks.serving import create, run_level, start_server, stop_server, stream_raw


def burst(url: str, model: str, clients: int, tokens: int) -> dict[str, float]:
    """``clients`` requests at once (benchmarks.serving.run_level), each with a prompt never asked before."""
    tag = uuid.uuid4().hex[:8]
    fresh = lambda u, m, prompt, n: stream_raw(u, m, f"({tag}) {prompt}", n)  # noqa: E731
    return run_level(url, model, clients, tokens, fresh)


def one_server(home: Path, tree: Path | None, clients: int, tokens: int, parallel: int,
               idle: float = 0.0) -> tuple[dict, dict]:
    """A fresh server from ``tree`` on the store in ``home``: its first burst ``idle`` seconds after the load, then
    one more (the steady state). The model is the pair when the store holds a draft model, else the plain one."""
    proc, url = start_server(home, parallel, tree=tree)
    try:
        create(url, "burst", modelfile(home))
        stream_raw(url, "burst", "Say hello.", 4)  # the load
        if clients == 0:
            return {}, {}
        time.sleep(idle)
        return burst(url, "burst", clients, tokens), burst(url, "burst", clients, tokens)
    finally:
        stop_server(proc)  # it waits for the load's packed-weight cache to be written


MODEL_FILE, DRAFT_FILE = "model.gguf", "draft.gguf"


def modelfile(home: Path) -> str:
    """Plain (no speculation), or the DRAFT pair drafting from its draft model and the request alone (no suffix
    drafting: every burst's prompts are new, but its outputs would be drafted from the earlier bursts')."""
    base = f"FROM {home / MODEL_FILE}\nPARAMETER engine native\n"
    if (home / DRAFT_FILE).exists():
        return base + f"DRAFT {home / DRAFT_FILE}\nPARAMETER draft_suffix false\n"
    return base + "PARAMETER drafter none\n"


def prepared_store(model: str, draft: str | None = None) -> Path:
    """A store whose model file is ``model`` (and ``draft``), linked where it can be: create reads them from the
    store's directory."""
    home = Path(tempfile.mkdtemp(prefix="tandem-first-burst-"))
    for src, name in ((model, MODEL_FILE), (draft, DRAFT_FILE)):
        if src is None:
            continue
        try:
            os.link(src, home / name)
        except OSError:
            shutil.copy(src, home / name)
    return home


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_burst", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", help="a draft model: the burst goes to the DRAFT pair instead of the plain model")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds between the load and the burst")
    ap.add_argument("--base", help="another checkout, run alternately with this one")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    trees = [("this", None)] + ([("base", Path(args.base))] if args.base else [])
    rows: dict[str, list[tuple[dict, dict]]] = {label: [] for label, _ in trees}
    home = prepared_store(args.model, args.draft)
    try:
        # One load first, so that every round's server finds the packed weights in the store (a restart's load,
        # not a first one's: that one also writes the pack cache while the burst runs).
        for _, tree in trees:
            one_server(home, tree, 0, 0, args.parallel)
        for rnd in range(args.rounds):
            for label, tree in (trees if rnd % 2 else trees[::-1]):
                rows[label].append(one_server(home, tree, args.clients, args.tokens, args.parallel, args.idle))
                print(f"round {rnd + 1} {label} done", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    command = (f"python -m benchmarks.first_burst --model {Path(args.model).name}"
               + (f" --draft {Path(args.draft).name}" if args.draft else "") + f" --clients {args.clients} "
               f"--tokens {args.tokens} --rounds {args.rounds} --parallel {args.parallel}"
               + (f" --idle {args.idle:g}" if args.idle else "")
               + (" --base <checkout>" if args.base else ""))
    title = f"# The first burst of {args.clients} clients after a load" + (" (the DRAFT pair)" if args.draft else "")
    lines = [title, "", host_line(os.cpu_count() or 1), "",
             f"`{command}`", "",
             "| tree | round | first burst tok/s | TTFT p50 s | TTFT max s | ITL p95 ms | next burst tok/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, _ in trees:
        for i, (first, later) in enumerate(rows[label]):
            lines.append(f"| {label} | {i + 1} | {first['aggregate']:.1f} | {first['ttft_p50']:.2f} | "
                         f"{first['ttft_max']:.2f} | {first['itl_p95_ms']:.0f} | {later['aggregate']:.1f} |")
        med = lambda key, which=0: statistics.median(r[which][key] for r in rows[label])  # noqa: E731
        lines.append(f"| **{label}, median** | | **{med('aggregate'):.1f}** | {med('ttft_p50'):.2f} | "
                     f"{med('ttft_max'):.2f} | {med('itl_p95_ms'):.0f} | {med('aggregate', 1):.1f} |")
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
