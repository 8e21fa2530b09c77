"""An Anthropic Messages request (POST /v1/messages) as tandem's chat: the messages, tools, options and
think setting the generation pipeline takes, as Ollama's anthropic middleware converts them.

Content blocks map onto Ollama's message fields: `text` joins into the content, `image` into images (then
refused: tandem runs text models), `thinking` into the assistant's thinking, `tool_use` into its tool calls,
and each `tool_result` becomes a `tool` message of its own, named after the call it answers.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from ..gojson import ApiError, jfield
from ..prompting import Message, Think

#: Block types carried into the prompt; `redacted_thinking` is opaque (encrypted by Anthropic) and dropped.
_IGNORED_BLOCKS = ("redacted_thinking",)


@dataclass
class MessagesRequest:
    """POST /v1/messages (the fields tandem reads; `metadata`, `cache_control`, `service_tier` and the
    like are accepted and ignored)."""

    model: str = jfield("string", "")
    max_tokens: int | None = jfield("int")
    messages: list[dict[str, Any]] = jfield("[]anthropic.MessageParam", factory=list)
    system: Any = jfield("any")  # string | [text block]
    stop_sequences: list[str] | None = jfield("[]string")
    temperature: float | None = jfield("float64")
    top_p: float | None = jfield("float64")
    top_k: int | None = jfield("int")
    tools: list[dict[str, Any]] = jfield("[]anthropic.Tool", factory=list)
    tool_choice: dict[str, Any] | None = jfield("map[string]interface {}")
    thinking: dict[str, Any] | None = jfield("map[string]interface {}")
    output_config: dict[str, Any] | None = jfield("map[string]interface {}")  # {"format": {"type": "json_schema", ...}}
    stream: bool = jfield("bool", False)
    keep_alive: Any = jfield("any")  # tandem/Ollama extension, as on /v1/chat/completions
    options: dict[str, Any] | None = jfield("map[string]interface {}")  # tandem extension: any Ollama/tandem option


def check_request(req: MessagesRequest, *, generating: bool = True) -> None:
    """What Anthropic's API refuses before anything else (count_tokens takes no max_tokens)."""
    if not req.model:
        raise ApiError(400, "model: field required")
    if generating:
        if req.max_tokens is None:
            raise ApiError(400, "max_tokens: field required")
        if req.max_tokens < 1:  # Anthropic's 0 only pre-warms its prompt cache; tandem has nothing to warm
            raise ApiError(400, f"max_tokens: must be at least 1, got {req.max_tokens}")
    if not req.messages:
        raise ApiError(400, "messages: at least one message is required")


# --- messages ----------------------------------------------------------------------------------------


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return content
    raise ApiError(400, f"{where}: content must be a string or a list of content blocks")


def _text_and_images(content: Any, where: str) -> tuple[str, list[bytes]]:
    """The text and images of a content that holds nothing else (the system prompt, a tool result)."""
    texts: list[str] = []
    images: list[bytes] = []
    for i, block in enumerate(_blocks(content, where) if content is not None else []):
        kind, at = block.get("type"), f"{where}.{i}"
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif kind == "image":
            images.append(_image(block, at))
        else:
            raise ApiError(400, f"{at}: unsupported content block type {json.dumps(kind)}")
    return "\n".join(texts), images


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{where}: must be a string")
    return value


def _image(block: dict[str, Any], where: str) -> bytes:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str):
        raise ApiError(400, f"{where}: only base64 image sources are supported")
    try:
        return base64.b64decode(source["data"], validate=True)
    except ValueError:
        raise ApiError(400, f"{where}: invalid base64 image data") from None


def system_message(system: Any) -> list[Message]:
    text, images = _text_and_images(system, "system")
    if images:
        raise ApiError(400, "system: only text blocks are allowed")
    return [Message("system", text)] if text else []


def _tool_message(block: dict[str, Any], names: dict[str, str], where: str) -> Message:
    """A tool result as Ollama's `tool` message. An error result says so in its text: the message has no
    error flag, and the model should not read a failure as the tool's answer."""
    call_id = _string(block.get("tool_use_id"), f"{where}.tool_use_id")
    text, images = _text_and_images(block.get("content"), f"{where}.content")
    if block.get("is_error"):
        text = f"Error: {text}"
    return Message("tool", text, images=images or None, tool_name=names.get(call_id) or None, tool_call_id=call_id)


def _user_messages(blocks: list[dict[str, Any]], names: dict[str, str], where: str) -> list[Message]:
    """A user turn: its tool results as `tool` messages and its text (and images) as user messages, in
    the order given."""
    out: list[Message] = []
    texts: list[str] = []
    images: list[bytes] = []

    def flush() -> None:
        if texts or images:
            out.append(Message("user", "\n".join(texts), images=list(images) or None))
            texts.clear()
            images.clear()

    for i, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content.{i}"
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif kind == "image":
            images.append(_image(block, at))
        elif kind == "tool_result":
            flush()
            out.append(_tool_message(block, names, at))
        elif kind not in _IGNORED_BLOCKS:
            raise ApiError(400, f"{at}: unsupported content block type {json.dumps(kind)} in a user message")
    flush()
    return out


def _assistant_message(blocks: list[dict[str, Any]], names: dict[str, str], where: str) -> Message:
    """An assistant turn: text, its reasoning (`thinking` blocks) and tool calls (`tool_use` blocks,
    remembered by id so that later results can name their tool)."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content.{i}"
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif kind == "thinking":
            thinking.append(_string(block.get("thinking"), f"{at}.thinking"))
        elif kind == "tool_use":
            call_id = _string(block.get("id"), f"{at}.id")
            name = _string(block.get("name"), f"{at}.name")
            arguments = block.get("input") if block.get("input") is not None else {}
            if not isinstance(arguments, dict):
                raise ApiError(400, f"{at}.input: must be an object")
            names[call_id] = name
            calls.append({"id": call_id, "function": {"index": len(calls), "name": name, "arguments": arguments}})
        elif kind not in _IGNORED_BLOCKS:
            raise ApiError(400, f"{at}: unsupported content block type {json.dumps(kind)} in an assistant message")
    return Message.from_dict({"role": "assistant", "content": "\n".join(texts), "thinking": "\n".join(thinking),
                              "tool_calls": calls})


def chat_messages_of(raw: list[dict[str, Any]]) -> list[Message]:
    """The request's messages as tandem's."""
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        role = m.get("role")
        blocks = _blocks(m.get("content"), where)
        if role == "user":
            out += _user_messages(blocks, names, where)
        elif role == "assistant":
            out.append(_assistant_message(blocks, names, where))
        elif role == "system":
            # Not Anthropic's (its system prompt is the top-level field), but clients send one mid-conversation
            # (a budget or context update), and Ollama passes it through as a system message: so does tandem.
            out += system_message(blocks)
        else:
            raise ApiError(400, f"{where}.role: must be \"user\", \"assistant\" or \"system\", got {json.dumps(role)}")
    return out


# --- tools, think, format, options -------------------------------------------------------------------


def tools_of(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic's tool definitions in the OpenAI/Ollama form `validation.decode_tools` reads. Server tools
    (web search, code execution...) run at Anthropic; they have no input_schema and are refused."""
    out = []
    for i, tool in enumerate(raw):
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"tools.{i}.name: a tool name is required")
        if not isinstance(schema, dict):
            raise ApiError(400, f"tools.{i}: tool {json.dumps(name)} has no input_schema "
                                "(Anthropic's server tools are not supported)")
        out.append({"type": "function", "function": {"name": name, "description": tool.get("description") or "",
                                                     "parameters": schema}})
    return out


@dataclass(frozen=True)
class ToolChoice:
    """`tool_choice` as far as tandem can honour it: tandem cannot force a call in the model's own call
    syntax, so "any" offers the tools as "auto" does and "tool" offers only the named tool (the model may
    still answer in text); "none" offers no tools; `disable_parallel_tool_use` keeps the first call only."""

    offered: list[dict[str, Any]]
    max_calls: int | None = None


def tool_choice_of(choice: dict[str, Any] | None, tools: list[dict[str, Any]]) -> ToolChoice:
    if choice is None:
        return ToolChoice(tools)
    kind = choice.get("type")
    single = 1 if choice.get("disable_parallel_tool_use") is True else None
    if kind in ("auto", "any"):
        return ToolChoice(tools, single)
    if kind == "none":
        return ToolChoice([])
    if kind == "tool":
        named = [t for t in tools if t["function"]["name"] == choice.get("name")]
        if not named:
            raise ApiError(400, f"tool_choice.name: no tool named {json.dumps(choice.get('name'))} in tools")
        return ToolChoice(named, single)
    raise ApiError(400, f"tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\", got {json.dumps(kind)}")


def think_of(thinking: dict[str, Any] | None) -> Think:
    """`thinking` as Ollama's think: "enabled" on, "disabled" off, absent or "adaptive" the model's
    default (a thinking model thinks). `budget_tokens` is not enforced: the engine has no separate
    reasoning budget, and `max_tokens` bounds reasoning and answer together as it does at Anthropic."""
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind == "enabled":
        return True
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    raise ApiError(400, f"thinking.type: must be \"enabled\", \"disabled\" or \"adaptive\", got {json.dumps(kind)}")


def format_of(output_config: dict[str, Any] | None) -> Any:
    """`output_config.format` (Anthropic's structured outputs: a JSON schema) as tandem's `format`."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, 'output_config.format: must be {"type": "json_schema", "schema": {...}}')
    return fmt["schema"]


def options_of(req: MessagesRequest) -> dict[str, Any]:
    """The request's sampling fields as Ollama options, over tandem's `options` extension. Unset fields
    keep the model's own parameters (Ollama's anthropic layer sets only what is sent)."""
    options: dict[str, Any] = dict(req.options or {})
    if req.max_tokens is not None:
        options["num_predict"] = req.max_tokens
    if req.stop_sequences is not None:
        options["stop"] = list(req.stop_sequences)
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(req, key)
        if value is not None:
            options[key] = value
    return options


__all__ = ["MessagesRequest", "ToolChoice", "chat_messages_of", "check_request", "format_of",
           "options_of", "system_message", "think_of", "tool_choice_of", "tools_of"]
