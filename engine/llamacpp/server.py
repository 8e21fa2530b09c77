"""Starting and stopping the llama-server a model runs on, from the engine process, as Ollama runs it: one server
per loaded model, ``-c`` the context of all its slots together, ``-np`` slots, ``-t`` threads, ``-ngl``/``-mg``
for GPUs, a DRAFT model as ``--model-draft``, the projector layer as ``--mmproj``. It runs under engine/process/reaper.py in a session of its own, so
that it stops with the engine process however that ends."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from engine.contract.llamacpp_launch import LlamaCppLaunch
from engine.contract.protocol import EngineError, LoadSpec
from engine.llamacpp.api import LlamaCppApi
from engine.backend_process import BackendProcess, free_port



def server_args(launch: LlamaCppLaunch, spec: LoadSpec, *, port: int, slots: int) -> list[str]:
    threads = spec.num_thread if spec.num_thread > 0 else (os.cpu_count() or 1)
    args = ["-m", spec.model_path, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(spec.num_ctx * slots), "-np", str(slots), "-t", str(threads),
            "-ngl", str(launch.n_gpu_layers), "--no-webui"]
    if spec.projector_path:  # the model's vision projector: images go in through llama.cpp's mtmd
        args += ["--mmproj", spec.projector_path]
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
        self.process = BackendProcess("llama-server", [binary, *server_args(launch, spec, port=self.port, slots=slots)],
                                      self.workdir, "llama-server.log")
        self.api = LlamaCppApi(f"http://127.0.0.1:{self.port}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until llama-server answers /health (200 once the model is loaded)."""
        self.process.wait_ready(self.api.healthy, timeout, poll=0.1)

    def log_tail(self) -> str:
        return self.process.log_tail()

    def stop(self) -> None:
        self.process.stop()
        self.api.close()
