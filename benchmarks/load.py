"""How long a model takes to load, cold (the packed-weight cache being built) and warm (mapped from it), and the
memory the loaded engine holds.

    python -m benchmarks.load TARGET.gguf [--draft DRAFT.gguf] [--rounds 3] [--threads 2] [--markdown PATH]

Each load runs in a fresh process (``engine.runtime.ModelRuntime.load`` with a ``LoadSpec`` as the server builds
it), so nothing of an earlier load stays in the process. Each round: one load without a cache directory (the
same-run baseline), one cold load (an empty cache directory), then one warm load (the directory the cold load
filled). The file pages stay in the OS page cache between loads, as they do between a server's keep_alive
expiry and the next request. Reported per load: wall seconds
until the engine can generate, and the process's resident memory (RSS) then and after a 16-token generation
(speculating with the draft when one is given: every weight has been read), against the GGUFs' size. The
cold load writes its cache in the background; the child exits once that write is done.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.output import emit, host_line

_CHILD = r"""
import json, os, sys, time
import torch
t0 = time.perf_counter()
from engine.contract.protocol import LoadSpec
from engine.runtime import ModelRuntime
spec = LoadSpec(**json.loads(sys.argv[1]))
engine = ModelRuntime.load(spec)
seconds = time.perf_counter() - t0
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
loaded = rss()
from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest
opts = Options.from_map({"num_predict": 16, "temperature": 0, "draft_num_predict": 3 if spec.draft_path else 0})
for _ in engine.generate(GenerateRequest(prompt="def fib(n):", options=opts)):
    pass
print(json.dumps({"seconds": seconds, "rss": loaded, "rss_used": rss(), "format": engine.facts.weight_format}))
"""


def _load(spec: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    gguf_bytes = os.path.getsize(args.target) + (os.path.getsize(args.draft) if args.draft else 0)
    rows: dict[str, list[dict]] = {"no cache": [], "cold": [], "warm": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as packs:
            spec = {"model_path": args.target, "draft_path": args.draft, "num_ctx": 4096, "num_thread": args.threads,
                    "device": "cpu"}
            rows["no cache"].append(_load(spec))
            rows["cold"].append(_load({**spec, "pack_dir": packs}))
            rows["warm"].append(_load({**spec, "pack_dir": packs}))
    cmd = " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["# Load time, cold and warm", "", host_line(args.threads), "", f"`python -m benchmarks.load {cmd}`", "",
             f"GGUFs: {gguf_bytes / 2**20:.0f} MiB. Median (min-max) over {args.rounds} rounds, each load in a fresh process.",
             "", "| load | seconds | RSS loaded | RSS after generating | / GGUFs | format |",
             "|---|---:|---:|---:|---:|---|"]
    for kind, rs in rows.items():
        secs = [r["seconds"] for r in rs]
        rss = statistics.median(r["rss"] for r in rs)
        used = statistics.median(r["rss_used"] for r in rs)
        lines.append(f"| {kind} | {statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f}) | "
                     f"{rss / 2**20:.0f} MiB | {used / 2**20:.0f} MiB | {used / gguf_bytes:.2f} | {rs[0]['format']} |")
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
