"""Request checks shared by /api and /v1, made before any model is loaded so a bad request fails fast
with Ollama's status and message."""

from __future__ import annotations

import base64
import json
from typing import Any

from blobs import InvalidNameError, ModelNotFoundError
from blobs.model import StoredModel, load_stored_model
from engine.contract.json_grammar import SchemaError, compile_format
from server.text.render import Think, Tool

from .context import ServerContext
from .gojson import ApiError
from .settings import keep_alive_seconds


def stored_model(ctx: ServerContext, name: str, *, invalid_status: int = 404) -> StoredModel:
    """The stored model ``name`` or 404 `model 'X' not found` (Ollama answers an invalid name on
    generate/chat with the same 404; elsewhere with 400 `invalid model name`)."""
    try:
        model = load_stored_model(ctx.store, name)
    except InvalidNameError:
        if invalid_status == 404:
            raise ApiError(404, f"model '{name}' not found") from None
        raise ApiError(400, "invalid model name") from None
    except ModelNotFoundError:
        raise ApiError(404, f"model '{name}' not found") from None
    if model.model_path is None:
        raise ApiError(400, f"model '{name}' has no weights (no model layer)")
    return model


def parse_keep_alive(ctx: ServerContext, value: Any) -> float:
    try:
        return keep_alive_seconds(value, ctx.settings.keep_alive)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


THINK_LEVELS = ("low", "medium", "high", "max")


def check_think(name: str, think: Any, supported: bool) -> Think:
    """The request's ``think`` as Ollama applies it: a thinking model thinks unless told not to (unset
    means true), with a ``format`` too (the format then holds from the end of the reasoning:
    ``GenerateRequest.think_first``); asking a model without the capability to think is 400."""
    if not (think is None or isinstance(think, bool) or isinstance(think, str)):
        raise ApiError(400, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)')
    if isinstance(think, str) and think not in THINK_LEVELS:
        raise ApiError(400, f'invalid think value: {json.dumps(think)} (must be "high", "medium", "low", "max", '
                            'true, or false)')
    if supported:
        return True if think is None else think
    if think is True or think in THINK_LEVELS:
        raise ApiError(400, f'"{name}" does not support thinking')
    return think


# OpenAI's reasoning efforts as Ollama's openai layer maps them onto think ("" leaves the model's default).
_EFFORTS: dict[str, Think] = {"none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high",
                              "max": "max", "xhigh": "max", "ultra": "max"}


def think_from_effort(effort: Any) -> Think:
    if effort is None or effort == "":
        return None
    if not isinstance(effort, str) or effort not in _EFFORTS:
        raise ApiError(400, f'invalid reasoning value: {json.dumps(effort)} (must be "minimal", "low", "medium", '
                            '"high", "xhigh", "ultra", "max", or "none")')
    return _EFFORTS[effort]


def decode_tools(name: str, raw: list[Any], supported: bool) -> list[Tool]:
    """The request's tools; 400 when the model's template has no tools (Ollama's capability check)."""
    tools = []
    for t in raw:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, "invalid tool: a function with a name is required")
        if not isinstance(fn.get("parameters") or {}, dict):
            raise ApiError(400, "invalid tool: parameters must be an object")
        tools.append(Tool.from_dict(t))
    if tools and not supported:
        raise ApiError(400, f'"{name}" does not support tools')
    return tools


def check_format(fmt: Any) -> Any:
    """Validate ``format`` (None/"", "json", or a JSON schema; engine.contract.json_schema says what is enforced)
    before anything is loaded: a keyword that cannot be enforced is a 400 naming it. Returns what the
    engine request carries (None: free text)."""
    try:
        node = compile_format(fmt)
    except SchemaError as e:
        raise ApiError(400, str(e)) from None
    return None if node is None else fmt


def check_logprobs(top: int) -> None:
    if not 0 <= top <= 20:
        raise ApiError(400, "top_logprobs must be between 0 and 20")


def decode_images(name: str, images: list[str], vision: bool) -> list[bytes]:
    """The request's images (base64, checked as Go's decoder checks them); a model without a projector refuses
    any image with Ollama's error."""
    decoded = []
    for img in images:
        try:
            decoded.append(base64.b64decode(img, validate=True))
        except (ValueError, TypeError):
            raise ApiError(400, "illegal base64 data in images") from None
    if images and not vision:
        raise ApiError(400, f'"{name}" does not support vision')
    return decoded
