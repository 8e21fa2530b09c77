"""How a model is served by llama.cpp's ``llama-server`` (the llamacpp engine), decided in the server process.

tandem's native engine runs the architectures in ``capabilities.SUPPORTED_ARCHITECTURES`` and is the home of its
speculation; llama.cpp runs the others (over a hundred architectures), as Ollama itself now runs every GGUF
through upstream llama-server. ``engine auto`` (the default) picks the native engine where it runs the model and
every option the request asks for, else llama.cpp where a ``llama-server`` is at hand (``TANDEM_LLAMA_SERVER``,
the one ``scripts/install_llama_server.sh`` linked beside this Python, or one on PATH) or attached
(``TANDEM_LLAMACPP_URL``), else the native engine's own refusal.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .capabilities import DRAFTER_ARCHITECTURES, SUPPORTED_ARCHITECTURES
from .options import Options

ENV_BINARY = "TANDEM_LLAMA_SERVER"
ENV_URL = "TANDEM_LLAMACPP_URL"
ENV_ARGS = "TANDEM_LLAMACPP_ARGS"  # more llama-server flags (--flash-attn on, --cache-type-k q8_0, ...), shell-quoted

#: Options only the native engine has: a request that sets one on a llama.cpp model is refused (400), as on vLLM.
NATIVE_ONLY = {
    "relaxed_top_n": lambda o: o.relaxed_top_n > 0,
    "draft_acceptance": lambda o: o.draft_acceptance != "strict",
    "draft_trace": lambda o: o.draft_trace,
    "relaxed_scope": lambda o: o.relaxed_scope != "all",
    # llama.cpp drafts to the depth it is given: tandem's controller that prices each round is the native engine's
    "draft_schedule": lambda o: o.draft_schedule != "fixed",
    # drafting from earlier outputs is tandem's own drafter (llama.cpp's lookup drafts from the context only)
    "drafter": lambda o: o.drafter == "suffix",
}


@dataclass(frozen=True)
class LlamaCppLaunch:
    """What to start (``binary``) or attach to (``url``), and the load-time choices llama-server takes."""

    binary: str | None = None
    url: str | None = None
    n_gpu_layers: int = 0  # Ollama's num_gpu: layers offloaded (-ngl)
    main_gpu: int = 0  # -mg
    # the model's drafter as llama-server runs it (engine.llamacpp.server picks the --spec-type): ``model`` the
    # DRAFT layer (draft-simple, or draft-eagle3 / draft-dflash by its architecture), ``ngram`` n-gram lookup,
    # ``mtp`` the target's own NextN layers where it has them (draft-mtp), ``none``
    drafter: str = "none"
    draft_n_max: int = 0  # the most tokens a round drafts (draft_num_predict); a request asks for fewer
    why: str = ""  # for engine auto: why llama.cpp serves this model (/api/show, /api/ps)
    extra_args: tuple[str, ...] = ()  # TANDEM_LLAMACPP_ARGS, after tandem's own

    @property
    def attached(self) -> bool:
        return self.url is not None


def find_llama_server(env: Mapping[str, str] | None = None) -> str | None:
    """The llama-server to start: ``TANDEM_LLAMA_SERVER``, else the one the install script linked beside this
    Python (``.venv/bin/llama-server``), else one on PATH; None when there is none."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_BINARY)
    if explicit:
        return explicit
    beside = Path(sys.prefix) / "bin" / "llama-server"
    if beside.exists():
        return str(beside)
    return shutil.which("llama-server")


def llamacpp_available(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(ENV_URL)) or find_llama_server(env) is not None


def native_problem(architecture: str, draft_architecture: str | None = None) -> str | None:
    """Why the native engine cannot run a model (None: it can)."""
    if architecture not in SUPPORTED_ARCHITECTURES:
        return f'the native engine does not run architecture "{architecture}"'
    if draft_architecture and draft_architecture not in SUPPORTED_ARCHITECTURES | DRAFTER_ARCHITECTURES:
        return f'the native engine does not run draft architecture "{draft_architecture}"'
    return None


def refusal(options: Options) -> str | None:
    """The 400 for an option llama.cpp does not have (None: every option maps onto llama-server)."""
    for name, is_set in NATIVE_ONLY.items():
        if name in options.explicit and is_set(options):
            return f"{name} is not supported by the llamacpp engine (it is the native engine's); " \
                   "remove it or serve the model with PARAMETER engine native"
    return None


def plan(options: Options, model_options: Options, *, has_draft: bool, why: str = "",
         env: Mapping[str, str] | None = None) -> LlamaCppLaunch:
    """The launch for a model on llama.cpp: GPU offload from the request's merged options (a change reloads), the
    drafter from the model's own parameters only (llama-server fixes it at start; a request that asks for no
    speculation sets its depth to 0 instead of restarting the server)."""
    env = os.environ if env is None else env
    model = model_options
    drafter = "none"
    if model.draft_num_predict > 0 and model.drafter != "none":
        if has_draft and model.drafter in ("auto", "model"):
            drafter = "model"
        elif model.drafter == "ngram":
            drafter = "ngram"
        elif not has_draft and model.drafter in ("auto", "mtp"):
            drafter = "mtp"  # only where the GGUF has NextN layers: llama-server is started without it otherwise
    ngl = options.num_gpu if "num_gpu" in options.explicit and options.num_gpu > 0 else 0
    return LlamaCppLaunch(
        binary=find_llama_server(env), url=env.get(ENV_URL) or None,
        n_gpu_layers=ngl, main_gpu=options.main_gpu or 0,
        drafter=drafter, draft_n_max=model.draft_num_predict if drafter != "none" else 0,
        why=why, extra_args=tuple(shlex.split(env.get(ENV_ARGS, ""))),
    )
