"""The processes under a tandem engine process, read from /proc: the server-backed engines (vLLM, llama.cpp) run
their server under engine/process/reaper.py, so tests find it, kill it or freeze it there."""

from __future__ import annotations

import os


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def backend_pid(engine_pid: int) -> int:
    """The server (vLLM's API server, llama-server) under an engine process (engine -> reaper -> server)."""
    (reaper,) = [p for p in children(engine_pid) if "reaper.py" in open(f"/proc/{p}/cmdline").read()]
    (server,) = children(reaper)
    return server
