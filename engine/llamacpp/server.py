"""Starting and stopping the llama-server a model runs on, from the engine process, as Ollama runs it: one server
per loaded model, ``-c`` the context of all its slots together, ``-np`` slots, ``-t`` threads, ``-ngl``/``-mg``
for GPUs, a DRAFT model as ``--model-draft``, the projector layer as ``--mmproj``. It runs under engine/process/reaper.py in a session of its own, so
that it stops with the engine process however that ends."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from engine.contract.capabilities import has_mtp_head
from engine.contract.gguf import GGUFFile
from engine.contract.llamacpp_launch import LlamaCppLaunch
from engine.contract.protocol import EngineError, LoadSpec
from engine.llamacpp.api import LlamaCppApi
from engine.backend_process import BackendProcess, BackendServer, free_port



NGRAM_LOOKUP = 3  # the n-gram llama.cpp looks up (tandem's own drafter matches the longest suffix of up to 4)
#: llama.cpp's speculative type for a DRAFT layer of these architectures (any other: an independent model)
DRAFT_TYPES = {"eagle3": "draft-eagle3", "dflash": "draft-dflash"}


def speculative_type(launch: LlamaCppLaunch, spec: LoadSpec) -> str:
    """The ``--spec-type`` llama-server starts with for the launch's drafter ("none": no speculation). The type
    is always named: without it this llama.cpp loads a draft model and drafts nothing."""
    if launch.draft_n_max <= 0:
        return "none"
    if launch.drafter == "model" and spec.draft_path:
        with GGUFFile(spec.draft_path) as f:
            return DRAFT_TYPES.get(f.architecture, "draft-simple")
    if launch.drafter == "ngram":
        return "ngram-simple"
    if launch.drafter == "mtp":
        with GGUFFile(spec.model_path) as f:
            return "draft-mtp" if has_mtp_head(f.tensors) else "none"
    return "none"


def server_args(launch: LlamaCppLaunch, spec: LoadSpec, *, port: int, slots: int) -> list[str]:
    threads = spec.num_thread if spec.num_thread > 0 else (os.cpu_count() or 1)
    args = ["-m", spec.model_path, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(spec.num_ctx * slots), "-np", str(slots), "-t", str(threads),
            "-ngl", str(launch.n_gpu_layers), "--no-webui"]
    if spec.projector_path:  # the model's vision projector: images go in through llama.cpp's mtmd
        args += ["--mmproj", spec.projector_path]
    if launch.main_gpu:
        args += ["-mg", str(launch.main_gpu)]
    kind = speculative_type(launch, spec)
    if kind.startswith("draft-") and kind != "draft-mtp":
        args += ["--model-draft", str(spec.draft_path), "-ngld", str(launch.n_gpu_layers)]
    if kind == "ngram-simple":
        args += ["--spec-ngram-simple-size-n", str(NGRAM_LOOKUP), "--spec-ngram-simple-size-m", str(launch.draft_n_max)]
    if kind != "none":
        args += ["--spec-type", kind, "--spec-draft-n-max", str(launch.draft_n_max)]
    return args + list(launch.extra_args)


class LlamaCppServer(BackendServer):
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
