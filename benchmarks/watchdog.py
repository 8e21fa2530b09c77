"""How long a frozen engine holds its model: a real ``tandem serve`` with default settings, one model, a streaming
generation whose engine process is stopped (SIGSTOP) after its first token; then the time until the stream ends
with its error, and until the next request to the model is served by a fresh engine.

    python -m benchmarks.watchdog --model target.gguf [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.output import emit, host_line
from benchmarks.serving import create, start_server


def engine_pids(server_pid: int) -> set[int]:
    """The server's engine processes: its children started by multiprocessing's spawn."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and "spawn_main" in cmd:
            pids.add(int(entry.name))
    return pids


def post(url: str, body: dict, timeout: float = 600):
    return urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(),
                                                         headers={"Content-Type": "application/json"}),
                                  timeout=timeout)


def one_round(url: str, server_pid: int) -> tuple[float, float]:
    """(seconds from the freeze to the stream's error line, seconds from the freeze to the next request served)."""
    post(url + "/api/generate", {"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}).read()
    before = engine_pids(server_pid)
    frozen = None
    with post(url + "/api/generate", {"model": "m", "prompt": "Tell me a long story.",
                                      "options": {"num_predict": -1}}) as r:
        for raw in r:
            line = json.loads(raw)
            if frozen is None:
                (frozen,) = before
                os.kill(frozen, signal.SIGSTOP)
                t0 = time.monotonic()
            if "error" in line:
                break
        errored = time.monotonic() - t0
    post(url + "/api/generate", {"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}).read()
    served = time.monotonic() - t0
    try:
        os.kill(frozen, signal.SIGKILL)  # the watchdog has killed it already, unless it failed to
    except ProcessLookupError:
        pass
    return errored, served


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.watchdog", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="tandem-watchdog-"))
    shutil.copy(args.model, home / Path(args.model).name)
    proc, url = start_server(home, parallel=1)
    rows = []
    try:
        create(url, "m", f"FROM {home / Path(args.model).name}\n")
        for i in range(args.rounds):
            rows.append(one_round(url, proc.pid))
            print(f"round {i + 1}: error after {rows[-1][0]:.1f} s, served after {rows[-1][1]:.1f} s",
                  file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(home, ignore_errors=True)  # the model copy and the store: gigabytes per run
    lines = ["# A frozen engine, default settings", "", host_line(os.cpu_count() or 1), "",
             f"`python -m benchmarks.watchdog --model {Path(args.model).name} --rounds {args.rounds}`", "",
             "| round | freeze -> stream's error line, s | freeze -> next request served, s |", "|---:|---:|---:|"]
    lines += [f"| {i + 1} | {e:.1f} | {s:.1f} |" for i, (e, s) in enumerate(rows)]
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
