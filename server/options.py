"""The options a generation runs with: defaults <- the model's parameters <- the request's options,
speculation resolved (`modelfile.resolve_options`), the load-time subset that decides when an engine
must reload, and what /api/show reports about speculation.

Kept together because they are one policy: how a model's settings and a request combine.
"""

from __future__ import annotations

from typing import Any

from blobs.model import StoredModel
from modelfile import (
    SPECULATION_DEFAULTS,
    SPECULATION_OPTIONS,
    ParamError,
    coerce_options,
    resolve_options,
)

from .gojson import ApiError
from .prompting import ModelPrompting


def merged_options(model: StoredModel, options: dict[str, Any] | None, prompting: ModelPrompting) -> dict[str, Any]:
    """defaults <- model params <- request options, speculation resolved. A wrong option type is
    Ollama's `option "x" must be of type ...`, which it surfaces as 500 on generate/chat."""
    try:
        return resolve_options(model.params, options, has_draft_layer=model.draft_path is not None,
                               has_mtp_head=prompting.facts.has_mtp_head)
    except ParamError as e:
        raise ApiError(500, str(e)) from None


def load_options(model: StoredModel, options: dict[str, Any] | None) -> dict[str, Any]:
    """Load-time options the model's parameters or the request set explicitly (a change reloads)."""
    try:
        request = coerce_options(options)
    except ParamError as e:
        raise ApiError(500, str(e)) from None
    out = {}
    for key in ("num_ctx", "num_thread"):
        value = request.get(key, model.params.get(key))
        if value is not None:
            out[key] = value
    return out


def draft_details(model: StoredModel) -> dict[str, Any] | None:
    if model.draft_path is None:
        return None
    from engine.gguf import GGUFFile, format_parameter_count

    with GGUFFile(model.draft_path) as f:
        return {"format": "gguf", "family": f.architecture, "parameter_size": format_parameter_count(f.parameter_count),
                "quantization_level": f.file_type}


def speculation_info(model: StoredModel, options: dict[str, Any] | None, has_mtp_head: bool) -> dict[str, Any]:
    """tandem's addition to /api/show: the draft model, the tunables' defaults, the model's own
    settings and what a request with these options would use."""
    effective = resolve_options(model.params, options, has_draft_layer=model.draft_path is not None,
                                has_mtp_head=has_mtp_head)
    return {
        "draft": draft_details(model),
        "defaults": dict(SPECULATION_DEFAULTS),
        "parameters": {k: v for k, v in model.params.items() if k in SPECULATION_OPTIONS or k == "n_max"},
        "effective": {k: effective[k] for k in SPECULATION_DEFAULTS},
    }
