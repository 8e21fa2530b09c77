"""Starts a backend server (vLLM, llama-server) and makes sure nothing of it outlives the tandem engine process that asked for it.

    python reaper.py PARENT_PID -- COMMAND...

Run as a script (no package imports) in a session of its own, it starts COMMAND (vLLM's server) in its process
group and watches: when COMMAND exits, when PARENT_PID is gone (the server's watchdog killed a frozen engine with
SIGKILL, which leaves no chance to clean up) or when it is asked to stop (SIGTERM), it stops the whole group:
vLLM's API server spawns an engine-core process and workers, which a signal to the server alone can leave
running. SIGTERM first, SIGKILL after ``GRACE`` seconds (a frozen, stopped vLLM only answers SIGKILL). Its exit
code is COMMAND's (or 1 when it had to be stopped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE = 10.0  # seconds vLLM gets to exit after SIGTERM before the group is killed
POLL = 0.5


def _stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to every process of the group but this one, then SIGKILL to those left after GRACE."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)  # the engine core exits just after the server
    os.killpg(os.getpgid(0), signal.SIGKILL)  # ends this process too, with whatever is left


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: reaper.py PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    child = subprocess.Popen(argv[2:])
    while True:
        code = child.poll()
        if code is not None or stopping or os.getppid() != parent:
            if code is None or _left_in_group():
                _stop_group(child)
            return code if code is not None else 1
        time.sleep(POLL)


def _left_in_group() -> bool:
    """Whether any other process of this group is still there (vLLM's engine core after its server exited)."""
    group = os.getpgid(0)
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getpgid(int(entry)) == group:
                    return True
            except (ProcessLookupError, PermissionError):
                continue
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
