"""The options a generation runs with: defaults <- the model's parameters <- the request's options,
parsed once into one typed `engine.contract.options.Options`, and what /api/show reports about speculation
(decided by the engine's own rule, `engine.contract.speculation_plan.plan_speculation`).

Kept together because they are one policy: how a model's settings and a request combine.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobs.model import StoredModel
from engine.contract.capabilities import draft_layer_kind
from engine.contract.drafter_provenance import read_provenance
from engine.contract.gguf import GGUFFile, format_parameter_count
from engine.contract.llamacpp_launch import llamacpp_available, native_problem
from engine.contract.options import (
    SPECULATION_DEFAULTS,
    SPECULATION_OPTIONS,
    OptionRangeError,
    Options,
    ParamError,
)
from engine.contract.protocol import EngineError
from engine.contract.speculation_plan import plan_speculation
from engine.contract.vllm_launch import VllmLaunch, plan_launch, speculative_method

from .gojson import ApiError
from .settings import Settings, VllmSettings


def merged_options(model: StoredModel, options: dict[str, Any] | None) -> Options:
    """defaults <- model params <- request options, parsed once here; the engine decides the
    speculation from them. A wrong option type is Ollama's `option "x" must be of type ...`, which
    it surfaces as 500 on generate/chat; a value out of tandem's own ranges is a client error (400)."""
    try:
        return Options.merged(model.params, options)
    except OptionRangeError as e:
        raise ApiError(400, str(e)) from None
    except ParamError as e:
        raise ApiError(500, str(e)) from None


def draft_details(model: StoredModel) -> dict[str, Any] | None:
    if model.draft_path is None:
        return None
    with GGUFFile(model.draft_path) as f:
        return {"format": "gguf", "family": f.architecture, "parameter_size": format_parameter_count(f.parameter_count),
                "quantization_level": f.file_type}


def speculation_info(model: StoredModel, options: dict[str, Any] | None, has_mtp_head: bool) -> dict[str, Any]:
    """tandem's addition to /api/show: the draft model, the tunables' defaults, the model's own
    settings, what a request with these options would use (the engine's own rule) and the measurement
    each tuned parameter came from."""
    try:
        merged = Options.merged(model.params, options)
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    kind, trained = "model", {}
    if model.draft_path is not None:
        with GGUFFile(model.draft_path) as f:
            kind = draft_layer_kind(f.architecture, f.tensors)
            trained = read_provenance(f.metadata)
    plan = plan_speculation(merged, has_draft_layer=model.draft_path is not None, has_mtp_head=has_mtp_head,
                            draft_layer=kind)
    out = {
        "draft": draft_details(model),
        "defaults": dict(SPECULATION_DEFAULTS),
        "parameters": {k: v for k, v in model.params.items() if k in SPECULATION_OPTIONS or k == "n_max"},
        "effective": plan.as_options(),
        # where the model's speculation parameters came from (`tandem bench --apply`), per parameter
        "tuning": dict(model.tuning),
    }
    if trained:  # an MTP head `tandem train-drafter` fitted: its data, tokens, steps and validation acceptance
        out["trained_drafter"] = trained
    return out


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # native | llamacpp | vllm
    why: str  # for engine auto: why this engine serves the model ("" when the model or request named it)


def choose_engine(model: StoredModel, options: Options, settings: Settings) -> EngineChoice:
    """Which engine serves a request: the one the model's parameters or the request name, else the server's
    (TANDEM_ENGINE); ``auto`` (the default) is the native engine where it runs the model's architectures, else
    llama.cpp where a llama-server is at hand, else the native engine's refusal (400, naming the architecture)."""
    chosen = options.explicit_or("engine", settings.engine)
    if chosen != "auto":
        return EngineChoice(chosen, "")
    draft = model.config.get("draft") if isinstance(model.config.get("draft"), dict) else {}
    problem = native_problem(str(model.config.get("model_family") or ""), draft.get("architecture"))
    if problem is None and model.projector_path is not None:
        if not llamacpp_available():
            return EngineChoice("native", "the native engine runs this model's text; its images need the llamacpp "
                                          "engine, and no llama-server is installed")
        problem = "the native engine does not run the model's vision projector"
    if problem is None:
        return EngineChoice("native", "the native engine runs this model")
    if llamacpp_available():
        return EngineChoice("llamacpp", f"{problem}; llama.cpp runs it")
    raise EngineError(f"{problem}, and no llama-server is installed for the llamacpp engine "
                      "(scripts/install_llama_server.sh, or TANDEM_LLAMA_SERVER)", 400)


def engine_info(model: StoredModel, options: dict[str, Any] | None, settings: Settings) -> dict[str, Any]:
    """tandem's addition to /api/show: which engine a request with these options runs on and, on vLLM, the
    speculative method vLLM is started with."""
    try:
        merged = Options.merged(model.params, options)
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    try:
        choice = choose_engine(model, merged, settings)
    except EngineError as e:
        return {"backend": "none", "why": str(e)}
    backend = choice.engine
    out: dict[str, Any] = {"backend": backend}
    if choice.why:
        out["why"] = choice.why
    if backend == "vllm":
        launch = vllm_launch(model, settings.vllm)
        try:
            out["speculative_method"] = speculative_method(launch)
        except (OSError, ValueError):  # an unreadable DRAFT config: vLLM would refuse it at start, and say why
            out["speculative_method"] = None
        out["num_speculative_tokens"] = launch.num_speculative_tokens
        out["huggingface_folder"] = bool(model.hf_files)
    return out


def vllm_launch(model: StoredModel, settings: VllmSettings) -> VllmLaunch:
    """How the vllm engine starts (or attaches) for ``model``: its folders and its own parameters' speculation."""
    config = dict(model.hf_files).get("config.json")
    return plan_launch(model.params, files=tuple((n, str(p)) for n, p in model.hf_files),
                       draft_files=tuple((n, str(p)) for n, p in model.draft_hf_files),
                       has_mtp_head=config is not None and _has_mtp_layers(config), python=settings.python,
                       url=settings.url, served_model=settings.model, extra_args=settings.args)


@functools.lru_cache(maxsize=256)
def _has_mtp_layers(config: Path) -> bool:
    """Whether a Hugging Face config.json declares multi-token-prediction layers vLLM drafts with (``mtp``). Cached:
    the path is a content-addressed blob, read once rather than at every request."""
    try:
        c = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    text = c.get("text_config") if isinstance(c.get("text_config"), dict) else c
    return any(int(text.get(k) or 0) > 0 for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers"))
