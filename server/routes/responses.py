"""OpenAI's Responses API, POST /v1/responses (what agent tools such as OpenAI's Codex CLI speak), on the chat
pipeline the way /v1/chat/completions is: the `input` items become chat messages through openai.py's message
converter (`instructions` a system message first, `developer` a system message, a `function_call` joined to
the assistant turn before it, a `function_call_output` a tool message named by its call, a `reasoning` item
the next assistant turn's thinking); `max_output_tokens` is `num_predict`; `temperature` and `top_p` default to
1.0 as on /v1/chat/completions; `reasoning.effort` maps onto think as `reasoning_effort` does (absent: the
model's default); `text.format` (`json_schema`, `json_object`) is the format.

tandem keeps no responses: `previous_response_id` is refused (send the whole conversation, as Codex CLI does
with `store: false`), `store`, `metadata` and `user` are ignored. Only function tools exist here; a
`tool_choice` of "none" offers none, a named function offers only it ("required" cannot be enforced and acts as
"auto"). As on the chat route, an `options` object passes any Ollama/tandem option (a `seed`, say), and the
response carries `speculative_decoding`. The output and the stream events are built in `responses_output`.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from engine.contract.protocol import TokenChunk

from ..gojson import INTERNAL_ERROR, ApiError, jfield, json_response, read_struct
from ..pipeline import ChatInputs, Generation, open_chat
from ..prompting import Message
from ..reply import ReplyPiece, ReplySplitter
from ..validation import think_from_effort
from .openai import _message_from_openai, _sse
from .responses_output import OutputBuilder, new_id

router = APIRouter()
log = logging.getLogger("tandem.server")


@dataclass
class ResponsesRequest:
    """POST /v1/responses (the fields tandem reads; the rest are ignored as Go's decoder would)."""

    model: str = jfield("string", "")
    input: Any = jfield("any")  # string | [item]
    instructions: str | None = jfield("string")
    tools: list[dict[str, Any]] = jfield("[]openai.ResponsesTool", factory=list)
    tool_choice: Any = jfield("any")  # "auto" | "none" | "required" | {"type": "function", "name"}
    parallel_tool_calls: bool | None = jfield("bool")
    max_output_tokens: int | None = jfield("int")
    temperature: float | None = jfield("float64")
    top_p: float | None = jfield("float64")
    reasoning: dict[str, Any] | None = jfield("map[string]interface {}")  # {"effort", "summary"}
    text: dict[str, Any] | None = jfield("map[string]interface {}")  # {"format": {...}}
    stream: bool = jfield("bool", False)
    previous_response_id: str | None = jfield("string")
    metadata: dict[str, Any] | None = jfield("map[string]interface {}")
    keep_alive: Any = jfield("any")  # Ollama's, as on the chat route
    options: dict[str, Any] | None = jfield("map[string]interface {}")  # tandem extension


# --- input -> chat messages ------------------------------------------------------------------------------

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")


def _parts_text(content: Any, where: str) -> list[dict[str, Any]] | str:
    """Content as the chat route's converter reads it: a string, or text and image_url parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"invalid {where} content", "input")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text") or part.get("refusal") or "")})
        elif kind == "input_image":
            # only inline images (data URLs); the chat converter decodes them, and refuses other URLs
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url") or ""}})
        else:
            raise ApiError(400, f"unsupported {where} content part type: {kind}", "input")
    return parts


def _joined_text(content: Any, where: str) -> str:
    parts = _parts_text(content, where)
    return parts if isinstance(parts, str) else "\n".join(p.get("text", "") for p in parts)


def _chat_history(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as OpenAI chat messages (the shape openai.py's converter takes)."""
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input is required: a string or a non-empty list of items", "input")
    history: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    thinking = ""  # reasoning items' text, for the assistant turn that follows them
    for item in items:
        if not isinstance(item, dict):
            raise ApiError(400, "invalid input item", "input")
        kind = item.get("type") or "message"
        if kind == "reasoning":
            # the raw reasoning (`content`) when the client kept it, else the summary (what tandem sends)
            thinking += _joined_text(item.get("content") or item.get("summary") or [], "reasoning")
            continue
        if kind == "message":
            role = _ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise ApiError(400, f"invalid message role: {item.get('role')}", "input")
            history.append({"role": role, "content": _parts_text(item.get("content"), "message")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            # calls belong to the assistant turn they came in (our own output lists the message first)
            if not history or history[-1]["role"] != "assistant":
                history.append({"role": "assistant", "content": ""})
            history[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            history.append({"role": "tool", "tool_call_id": item.get("call_id"),
                            "content": _joined_text(item.get("output") or "", "function_call_output")})
        else:
            raise ApiError(400, f"unsupported input item type: {kind}", "input")
        if thinking and history[-1]["role"] == "assistant":
            history[-1]["reasoning"], thinking = thinking, ""
    return history


def _messages(history: list[dict[str, Any]]) -> tuple[list[Message], bool]:
    """The chat converter's messages, and whether any carried an image; its errors name `input` here."""
    try:
        decoded = [_message_from_openai(m, history) for m in history]
    except ApiError as e:
        raise ApiError(e.status, e.message, "input") from None
    return [m for m, _ in decoded], any(images for _, images in decoded)


# --- tools, format, options ------------------------------------------------------------------------------


def _function_tools(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses API's flattened function tools ({type, name, description, parameters, strict}); the
    chat shape ({type, function: {...}}) is taken too."""
    tools = []
    for t in raw:
        if t.get("type") != "function":
            raise ApiError(400, f"unsupported tool type: {t.get('type')} (tandem runs function tools only)", "tools")
        fn = t["function"] if isinstance(t.get("function"), dict) else t
        tools.append({"type": "function", "name": fn.get("name"), "description": fn.get("description"),
                      "parameters": fn.get("parameters"), "strict": fn.get("strict")})
    return tools


def _offered(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]]:
    """The tools the prompt shows, in the chat shape decode_tools reads."""
    if choice not in (None, "auto", "none", "required") and not (isinstance(choice, dict) and choice.get("type")):
        raise ApiError(400, "invalid tool_choice", "tool_choice")
    if choice == "none":
        return []
    if isinstance(choice, dict) and choice.get("type") == "function":
        tools = [t for t in tools if t["name"] == choice.get("name")]
        if not tools:
            raise ApiError(400, f"tool_choice names an unknown function: {choice.get('name')}", "tool_choice")
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if t[k]}}
            for t in tools]


def _format_of(text: dict[str, Any] | None) -> Any:
    fmt = (text or {}).get("format")
    if not fmt:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format.schema must be a JSON schema object", "text.format.schema")
        return fmt["schema"]
    raise ApiError(400, f"unsupported text.format type: {kind}", "text.format")


def _options(req: ResponsesRequest) -> dict[str, Any]:
    options: dict[str, Any] = dict(req.options or {})
    if req.max_output_tokens is not None:
        if req.max_output_tokens <= 0:  # 0 or -1 must not mean "unbounded"
            raise ApiError(400, "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 1, "
                                f"but got {req.max_output_tokens} instead.", "max_output_tokens")
        options["num_predict"] = req.max_output_tokens
    options["temperature"] = req.temperature if req.temperature is not None else 1.0
    options["top_p"] = req.top_p if req.top_p is not None else 1.0
    return options


def _response_object(req: ResponsesRequest, tools: list[dict[str, Any]], options: dict[str, Any],
                     effort: Any) -> dict[str, Any]:
    """The response as response.created shows it, with the request's settings echoed back as OpenAI does."""
    return {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": req.model, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "previous_response_id": None, "reasoning": {"effort": effort, "summary": None}, "store": False,
            "temperature": options["temperature"], "top_p": options["top_p"],
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": tools,
            "truncation": "disabled", "metadata": req.metadata or {}, "usage": None}


# --- the route ---------------------------------------------------------------------------------------------


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req: ResponsesRequest = await read_struct(request, ResponsesRequest, "openai.ResponsesRequest")
    if not req.model:
        raise ApiError(400, "model is required", "model")
    if req.previous_response_id:
        raise ApiError(400, "previous_response_id is not supported: tandem stores no responses; send the whole "
                            "conversation in input", "previous_response_id")
    messages, has_images = _messages(_chat_history(req))
    effort = (req.reasoning or {}).get("effort")
    think = think_from_effort(effort)
    tools = _function_tools(req.tools)
    raw_options = _options(req)
    prep = await open_chat(request, ChatInputs(
        "/v1/responses", req.model, messages, think, req.keep_alive, format=lambda: _format_of(req.text),
        tools=lambda: _offered(tools, req.tool_choice), options=lambda: raw_options, images=has_images,
        images_param="input"), t0)
    gen, splitter = prep.gen, prep.splitter()
    out = OutputBuilder(_response_object(req, tools, raw_options, effort))
    if not req.stream:
        async for _ in _build(gen, splitter, out):
            pass
        return json_response(out.response)
    return EventSourceResponse(_stream(gen, splitter, out), sep="\n", ping=None)


async def _build(gen: Generation, splitter: ReplySplitter, out: OutputBuilder) -> AsyncIterator[dict[str, Any]]:
    """The generation's events as the response's stream events (the start ones first)."""
    for event in out.start():
        yield event
    async with aclosing(gen.events()) as items:  # closed with us: a client that leaves cancels the engine
        async for item in items:
            if isinstance(item, TokenChunk):
                piece = splitter.feed(item.text) if item.text else ReplyPiece()
                events = out.feed(piece, len(item.token_ids))
            else:
                events = out.feed(splitter.finish()) + out.finish(item)
            for event in events:
                yield event


async def _stream(gen: Generation, splitter: ReplySplitter, out: OutputBuilder) -> AsyncIterator[dict[str, str]]:
    """SSE with each event's type as its `event:` line, as OpenAI sends them; a failure after the start is an
    `error` event and `response.failed`, never an exception's text (no `[DONE]`: the Responses API has none)."""
    failure: ApiError | None = None
    try:
        async with aclosing(_build(gen, splitter, out)) as events:
            async for event in events:
                yield {"event": event["type"], **_sse(event)}
    except ApiError as e:
        failure = e
    except Exception:  # a bug: its text goes to the log only, as the app's handler does for whole answers
        log.exception("/v1/responses: the stream failed")
        failure = ApiError(500, INTERNAL_ERROR)
    if failure is not None:
        for event in out.fail(failure):
            yield {"event": event["type"], **_sse(event)}
