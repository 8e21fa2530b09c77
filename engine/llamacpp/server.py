"""Starting and stopping the llama-server a model runs on, from the engine process, as Ollama runs it: one server
per loaded model, ``-c`` the context of all its slots together, ``-np`` slots, ``-t`` threads, ``-ngl``/``-mg``
for GPUs, a DRAFT model as ``--model-draft``. It runs under engine/process/reaper.py in a session of its own, so
that it stops with the engine process however that ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.contract.llamacpp_launch import LlamaCppLaunch
from engine.contract.protocol import EngineError, LoadSpec
from engine.llamacpp.api import LlamaCppApi
from engine.vllm.server import free_port

LOG_TAIL_LINES = 25
STOP_TIMEOUT = 15.0


def server_args(launch: LlamaCppLaunch, spec: LoadSpec, *, port: int, slots: int) -> list[str]:
    threads = spec.num_thread if spec.num_thread > 0 else (os.cpu_count() or 1)
    args = ["-m", spec.model_path, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(spec.num_ctx * slots), "-np", str(slots), "-t", str(threads),
            "-ngl", str(launch.n_gpu_layers), "--no-webui"]
    if launch.main_gpu:
        args += ["-mg", str(launch.main_gpu)]
    if launch.draft_n_max > 0 and spec.draft_path:
        # the type named: without it this llama.cpp loads the draft model and drafts nothing
        args += ["--model-draft", spec.draft_path, "--spec-type", "draft-simple", "--spec-draft-n-max", str(launch.draft_n_max),
                 "-ngld", str(launch.n_gpu_layers)]
    elif launch.ngram:
        args += ["--spec-type", "ngram-simple"]
    return args


class LlamaCppServer:
    def __init__(self, launch: LlamaCppLaunch, spec: LoadSpec, *, slots: int):
        binary = launch.binary
        if not binary or not (shutil.which(binary) or os.access(binary, os.X_OK)):
            raise EngineError("the llamacpp engine needs llama-server: run scripts/install_llama_server.sh, set "
                              "TANDEM_LLAMA_SERVER to its path, or TANDEM_LLAMACPP_URL to attach to a running one", 500)
        self.workdir = Path(tempfile.mkdtemp(prefix="tandem-llamacpp-"))
        self.port = free_port()
        self.log_path = self.workdir / "llama-server.log"
        reaper = Path(__file__).parent.parent / "process" / "reaper.py"
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(reaper), str(os.getpid()), "--", binary,
                 *server_args(launch, spec, port=self.port, slots=slots)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=self.workdir)
        self.api = LlamaCppApi(f"http://127.0.0.1:{self.port}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until llama-server answers /health (200 once the model is loaded); one that exits first, or is not up
        within ``timeout``, is an error carrying the end of its log."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self.alive():
                raise EngineError(f"llama-server failed to start (exit code {self._proc.returncode}); the end of its "
                                  f"log:\n{self.log_tail()}", 500)
            if self.api.healthy(timeout=2.0):
                return
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"llama-server did not start within {timeout:g}s; the end of its log:\n"
                                  f"{self.log_tail()}", 500)
            time.sleep(0.1)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join([l for l in text.splitlines() if l.strip()][-lines:])

    def stop(self) -> None:
        if self.alive():
            self._proc.terminate()
            try:
                self._proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait(5)
        self.api.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
