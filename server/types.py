"""Request bodies of Ollama's native API, field for field as api/types.go declares them (JSON name,
Go type for the decoder's messages, default). The other surfaces' bodies sit with their routes (`routes/openai.py`,
`routes/responses.py`, `routes/anthropic_request.py`, `/v1/embeddings` in `routes/embed.py`), and /api/create's with
the importer that builds from it (`importer/request.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .gojson import jfield


@dataclass
class GenerateBody:
    """POST /api/generate."""

    model: str = jfield("string", "")
    prompt: str = jfield("string", "")
    suffix: str = jfield("string", "")
    system: str = jfield("string", "")
    template: str = jfield("string", "")
    context: list[int] | None = jfield("[]int")  # deprecated: tokens of a previous response
    stream: bool = jfield("*bool", True)
    raw: bool = jfield("bool", False)
    format: Any = jfield("any")  # "json" or a JSON schema
    keep_alive: Any = jfield("any")  # seconds or a Go duration string; negative = forever
    images: list[str] = jfield("[]string", factory=list)  # base64
    options: dict[str, Any] | None = jfield("map[string]interface {}")
    think: Any = jfield("any")  # bool or "low" | "medium" | "high" | "max"
    truncate: bool = jfield("*bool", True)
    shift: bool = jfield("*bool", True)
    logprobs: bool = jfield("bool", False)
    top_logprobs: int = jfield("int", 0)
    debug_render_only: bool = jfield("bool", False, json_name="_debug_render_only")


@dataclass
class ChatBody:
    """POST /api/chat."""

    model: str = jfield("string", "")
    messages: list[dict[str, Any]] = jfield("[]api.Message", factory=list)
    tools: list[dict[str, Any]] = jfield("[]api.Tool", factory=list)
    format: Any = jfield("any")
    options: dict[str, Any] | None = jfield("map[string]interface {}")
    stream: bool = jfield("*bool", True)
    keep_alive: Any = jfield("any")
    think: Any = jfield("any")
    truncate: bool = jfield("*bool", True)
    shift: bool = jfield("*bool", True)
    logprobs: bool = jfield("bool", False)
    top_logprobs: int = jfield("int", 0)
    debug_render_only: bool = jfield("bool", False, json_name="_debug_render_only")


@dataclass
class MessageBody:
    """One chat message (api.Message)."""

    role: str = jfield("string", "")
    content: str = jfield("string", "")
    thinking: str = jfield("string", "")
    images: list[str] = jfield("[]string", factory=list)
    tool_calls: list[dict[str, Any]] = jfield("[]api.ToolCall", factory=list)
    tool_name: str = jfield("string", "")
    tool_call_id: str = jfield("string", "")


@dataclass
class ShowBody:
    model: str = jfield("string", "")
    name: str = jfield("string", "")  # deprecated alias of model
    system: str = jfield("string", "")
    options: dict[str, Any] | None = jfield("map[string]interface {}")
    verbose: bool = jfield("bool", False)


@dataclass
class CopyBody:
    source: str = jfield("string", "")
    destination: str = jfield("string", "")


@dataclass
class DeleteBody:
    model: str = jfield("string", "")
    name: str = jfield("string", "")


@dataclass
class EmbedBody:
    """POST /api/embed (api.EmbedRequest)."""

    model: str = jfield("string", "")
    input: Any = jfield("any")  # a string or a list of strings
    keep_alive: Any = jfield("any")
    truncate: bool = jfield("*bool", True)
    dimensions: int = jfield("int", 0)
    options: dict[str, Any] | None = jfield("map[string]interface {}")


@dataclass
class EmbeddingBody:
    """POST /api/embeddings (api.EmbeddingRequest, deprecated)."""

    model: str = jfield("string", "")
    prompt: str = jfield("string", "")
    keep_alive: Any = jfield("any")
    options: dict[str, Any] | None = jfield("map[string]interface {}")
