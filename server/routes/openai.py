"""The OpenAI-compatible API under /v1, mapped onto the same generation pipeline as /api, as Ollama's
openai middleware maps it: `temperature` and `top_p` default to 1.0, `max_tokens` is `num_predict`,
`stop` is a string or a list, `seed` and the penalties pass through. Streaming is SSE ending in
`data: [DONE]`; errors are `{"error": {"message", "type", "param", "code"}}`.

tandem adds a `speculative_decoding` object (the final response, the finish chunk and the usage chunk)
and accepts an `options` object (e.g. `extra_body={"options": {"draft_num_predict": 6}}`) for any
Ollama/tandem option, applied under the mapped OpenAI fields.
"""

from __future__ import annotations

import base64
import json
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from blobs import BlobsError, ModelName
from blobs.model import load_stored_model
from engine.contract.protocol import GenerateRequest as EngineRequest
from engine.contract.protocol import GenerateResult, TokenChunk

from ..context import ctx_of
from ..gojson import ApiError, jfield, json_response, read_struct
from ..effective_options import merged_options
from ..pipeline import ChatInputs, Generation, open_chat, speculation_fields
from ..prompting import InsertNotSupported, Message, ModelPrompting, PromptError
from ..reply import ReplyPiece
from ..lifecycle import Lease
from ..sse import sse_response
from ..validation import parse_keep_alive, stored_model, think_from_effort

router = APIRouter()

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def error_response(status: int, message: str, param: str | None = None) -> Response:
    return json_response({"error": {"message": message, "type": _ERROR_TYPES.get(status, "api_error"),
                                     "param": param, "code": None}}, status)


def _error_event(e: ApiError) -> dict[str, Any]:
    return {"data": json.dumps({"error": {"message": e.message, "type": _ERROR_TYPES.get(e.status, "api_error"),
                                          "param": e.param, "code": None}})}


@dataclass
class ChatCompletionRequest:
    """POST /v1/chat/completions (the fields Ollama reads)."""

    model: str = jfield("string", "")
    messages: list[dict[str, Any]] = jfield("[]openai.Message", factory=list)
    stream: bool = jfield("bool", False)
    stream_options: dict[str, Any] | None = jfield("map[string]interface {}")
    max_tokens: int | None = jfield("int")
    max_completion_tokens: int | None = jfield("int")
    seed: int | None = jfield("int")
    stop: Any = jfield("any")  # string | [string]
    temperature: float | None = jfield("float64")
    top_p: float | None = jfield("float64")
    frequency_penalty: float | None = jfield("float64")
    presence_penalty: float | None = jfield("float64")
    response_format: dict[str, Any] | None = jfield("map[string]interface {}")
    tools: list[dict[str, Any]] = jfield("[]openai.Tool", factory=list)
    logprobs: bool = jfield("bool", False)
    top_logprobs: int = jfield("int", 0)
    reasoning_effort: str | None = jfield("string")
    reasoning: dict[str, Any] | None = jfield("map[string]interface {}")  # {"effort": ...}; wins over reasoning_effort
    keep_alive: Any = jfield("any")  # Ollama accepts it here too
    options: dict[str, Any] | None = jfield("map[string]interface {}")  # tandem extension


@dataclass
class CompletionRequest:
    """POST /v1/completions."""

    model: str = jfield("string", "")
    prompt: Any = jfield("any")
    suffix: str = jfield("string", "")
    stream: bool = jfield("bool", False)
    stream_options: dict[str, Any] | None = jfield("map[string]interface {}")
    max_tokens: int | None = jfield("int")
    seed: int | None = jfield("int")
    stop: Any = jfield("any")
    temperature: float | None = jfield("float64")
    top_p: float = jfield("float64", 0.0)
    frequency_penalty: float | None = jfield("float64")
    presence_penalty: float | None = jfield("float64")
    logprobs: int | None = jfield("int")
    keep_alive: Any = jfield("any")
    options: dict[str, Any] | None = jfield("map[string]interface {}")


def _options(req: ChatCompletionRequest | CompletionRequest, top_p_default_when_zero: bool) -> dict[str, Any]:
    options: dict[str, Any] = dict(req.options or {})
    stop = req.stop
    if isinstance(stop, str):
        options["stop"] = [stop]
    elif isinstance(stop, list):
        if not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "invalid type for 'stop' field", "stop")
        options["stop"] = list(stop)
    elif stop is not None:
        raise ApiError(400, "invalid type for 'stop' field", "stop")
    for key in ("max_completion_tokens", "max_tokens"):
        limit = getattr(req, key, None)
        if limit is not None and limit <= 0:  # OpenAI's answer; 0 or -1 must not mean "unbounded"
            raise ApiError(400, f"Invalid '{key}': integer below minimum value. Expected a value >= 1, "
                                f"but got {limit} instead.", key)
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    options["temperature"] = req.temperature if req.temperature is not None else 1.0
    if req.seed is not None:
        options["seed"] = req.seed
    if req.frequency_penalty is not None:
        options["frequency_penalty"] = req.frequency_penalty
    if req.presence_penalty is not None:
        options["presence_penalty"] = req.presence_penalty
    if top_p_default_when_zero:
        options["top_p"] = req.top_p if req.top_p else 1.0
    else:
        options["top_p"] = req.top_p if req.top_p is not None else 1.0
    return options


def _format_of(response_format: dict[str, Any] | None) -> Any:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return schema if schema else None
    return None


def _tool_name_for(messages: list[dict[str, Any]], call_id: str) -> str:
    """The function a tool result answers, from the assistant call with its id (the last one wins)."""
    for m in reversed(messages):
        for call in m.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == call_id:
                return str((call.get("function") or {}).get("name") or "")
    return ""


def _message_from_openai(m: dict[str, Any], history: list[dict[str, Any]] | None = None) -> tuple[Message, list[bytes]]:
    """An OpenAI message as Ollama's: content parts joined, data-URI images decoded into the message, tool calls'
    string arguments parsed, a tool result named after the call it answers."""
    role = m.get("role")
    if not isinstance(role, str):
        raise ApiError(400, "invalid message role", "messages")
    content = m.get("content")
    images: list[bytes] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(400, "invalid message format", "messages")
            kind = part.get("type")
            if kind == "text":
                parts.append(str(part.get("text", "")))
            elif kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str) or not url.startswith("data:"):
                    raise ApiError(400, "invalid image input", "messages")
                try:
                    images.append(base64.b64decode(url.split(",", 1)[1], validate=True))
                except (IndexError, ValueError):
                    raise ApiError(400, "invalid image input", "messages") from None
            else:
                raise ApiError(400, f"invalid message part type: {kind}", "messages")
        text = "\n".join(parts)
    else:
        raise ApiError(400, "invalid message content type", "messages")
    data: dict[str, Any] = {"role": role, "content": text}
    if images:  # the message's own images: tagged into its turn, as /api/chat's `images` are
        data["images"] = images
    if m.get("tool_calls"):
        data["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id"):
        data["tool_call_id"] = m["tool_call_id"]
    if role.lower() == "tool":
        name = m.get("name") or (_tool_name_for(history or [], m["tool_call_id"]) if m.get("tool_call_id") else "")
        if name:
            data["tool_name"] = name
    if m.get("reasoning"):
        data["thinking"] = m["reasoning"]
    try:
        return Message.from_dict(data), images
    except (ValueError, TypeError, AttributeError):
        raise ApiError(400, "invalid tool call arguments", "messages") from None


def _usage(result: GenerateResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_eval_count, "completion_tokens": result.eval_count,
            "total_tokens": result.prompt_eval_count + result.eval_count}


def _sse(obj: Any) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False, separators=(",", ":"))}


async def _sse_response(events: AsyncIterator[dict[str, Any]]) -> Response:
    """OpenAI's SSE: ``[DONE]`` after the last event, an error object as the event after a failure."""
    return await sse_response(events, _error_event, trailer={"data": "[DONE]"})


def _completion_id(prefix: str) -> str:
    return f"{prefix}-{random.randint(0, 999)}"


# --- /v1/chat/completions ----------------------------------------------------------------------------


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req: ChatCompletionRequest = await read_struct(request, ChatCompletionRequest, "openai.ChatCompletionRequest")
    if not req.model:
        raise ApiError(400, "model is required", "model")
    if not req.messages:
        raise ApiError(400, "[] is too short - 'messages'", "messages")
    if not all(isinstance(m, dict) for m in req.messages):
        raise ApiError(400, "invalid message format", "messages")
    decoded = [_message_from_openai(m, req.messages) for m in req.messages]
    effort = req.reasoning.get("effort") if isinstance(req.reasoning, dict) and req.reasoning.get("effort") \
        else req.reasoning_effort

    def check_top_logprobs(prompting: ModelPrompting) -> None:  # after the model's checks: a missing model's 404 comes first
        if not 0 <= req.top_logprobs <= 20:
            raise ApiError(400, "top_logprobs must be between 0 and 20", "top_logprobs")

    prep = await open_chat(request, ChatInputs(
        "/v1/chat/completions", req.model, [m for m, _ in decoded], think_from_effort(effort), req.keep_alive,
        format=lambda: _format_of(req.response_format), tools=lambda: req.tools,
        options=lambda: _options(req, top_p_default_when_zero=False),
        images=any(images for _, images in decoded), images_param="messages", check=check_top_logprobs,
        logprobs=req.logprobs, top_logprobs=req.top_logprobs), t0)
    gen = prep.gen
    splitter = prep.splitter()
    cid = _completion_id("chatcmpl")
    created = int(time.time())
    include_usage = bool((req.stream_options or {}).get("include_usage"))

    def base(obj: str) -> dict[str, Any]:
        return {"id": cid, "object": obj, "created": created, "model": req.model, "system_fingerprint": "fp_ollama"}

    if not req.stream:
        whole = ReplyPiece()
        logprobs: list[dict[str, Any]] = []
        result: GenerateResult | None = None
        async for item in gen.events():
            if isinstance(item, TokenChunk):
                _add(whole, splitter.feed(item.text))
                logprobs += _openai_logprobs(item)
            else:
                _add(whole, splitter.finish())
                result = item
        assert result is not None
        message: dict[str, Any] = {"role": "assistant", "content": whole.content}
        if whole.thinking:
            message["reasoning"] = whole.thinking
        if whole.tool_calls:
            message["tool_calls"] = _openai_tool_calls(whole)
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": _finish_reason(result.done_reason, bool(whole.tool_calls))}
        if req.logprobs:
            choice["logprobs"] = {"content": logprobs}
        return json_response({**base("chat.completion"), "choices": [choice], "usage": _usage(result),
                              "speculative_decoding": speculation_fields(result)})

    async def events() -> AsyncIterator[dict[str, Any]]:
        first = True
        called = False  # a tool call was sent: a finish for "stop" says "tool_calls"
        async for item in gen.events():
            if isinstance(item, TokenChunk):
                piece = splitter.feed(item.text) if item.text else ReplyPiece()
                if not piece and not item.logprobs:
                    continue
                lps = {"content": _openai_logprobs(item)} if req.logprobs else None
                for delta in _deltas(piece):
                    if first:
                        delta = {"role": "assistant", **delta}
                        first = False
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
                    if lps is not None:
                        choice["logprobs"], lps = lps, None
                    called = called or "tool_calls" in delta
                    yield _sse({**base("chat.completion.chunk"), "choices": [choice]})
            else:
                rest = splitter.finish()
                for delta in _deltas(rest) if rest else []:
                    if first:
                        delta = {"role": "assistant", **delta}
                        first = False
                    called = called or "tool_calls" in delta
                    yield _sse({**base("chat.completion.chunk"),
                                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                spec = speculation_fields(item)
                delta = {"role": "assistant", "content": ""} if first else {}
                yield _sse({**base("chat.completion.chunk"),
                            "choices": [{"index": 0, "delta": delta,
                                         "finish_reason": _finish_reason(item.done_reason, called)}],
                            "speculative_decoding": spec})
                if include_usage:
                    yield _sse({**base("chat.completion.chunk"), "choices": [], "usage": _usage(item),
                                "speculative_decoding": spec})

    return await _sse_response(events())


def _add(whole: ReplyPiece, piece: ReplyPiece) -> None:
    whole.content += piece.content
    whole.thinking += piece.thinking
    whole.tool_calls += piece.tool_calls


def _openai_tool_calls(piece: ReplyPiece) -> list[dict[str, Any]]:
    """OpenAI's tool calls: an id, the call's index, type "function", the arguments as a JSON string."""
    return [{"id": c.id, "index": c.index, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)}}
            for c in piece.tool_calls]


def _deltas(piece: ReplyPiece) -> list[dict[str, Any]]:
    """The stream deltas of one piece; reasoning goes in a chunk of its own before content or calls, as
    Ollama's openai layer splits a mixed one. A piece with only logprobs still gets one (empty) delta."""
    out: list[dict[str, Any]] = []
    if piece.thinking:
        out.append({"reasoning": piece.thinking})
    if piece.content or piece.tool_calls or not out:
        delta: dict[str, Any] = {"content": piece.content}
        if piece.tool_calls:
            delta["tool_calls"] = _openai_tool_calls(piece)
        out.append(delta)
    return out


def _finish_reason(done_reason: str, called: bool) -> str | None:
    if done_reason == "stop" and called:
        return "tool_calls"
    return done_reason or None


def _openai_logprobs(chunk: TokenChunk) -> list[dict[str, Any]]:
    return [{"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.bytes),
             "top_logprobs": [{"token": t, "logprob": p, "bytes": list(b)} for t, p, b in lp.top_logprobs]}
            for lp in chunk.logprobs or []]


# --- /v1/completions ----------------------------------------------------------------------------------


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: CompletionRequest = await read_struct(request, CompletionRequest, "openai.CompletionRequest")
    if not req.model:
        raise ApiError(400, "model is required", "model")
    if not isinstance(req.prompt, str):
        raise ApiError(400, "invalid prompt: only a single string is supported", "prompt")
    model = await anyio.to_thread.run_sync(stored_model, ctx, req.model)
    top = req.logprobs or 0
    if not 0 <= top <= 20:
        raise ApiError(400, "logprobs must be between 0 and 20", "logprobs")
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    raw_options = _options(req, top_p_default_when_zero=True)
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    options = merged_options(model, raw_options)
    if req.suffix and not prompting.supports_insert:
        raise ApiError(400, f'"{req.model}" does not support insert', "suffix")

    def render() -> str:
        # Ollama sends /v1/completions through /api/generate without raw: the template applies.
        try:
            return prompting.generate_prompt(prompt=req.prompt, system=model.system, suffix=req.suffix or None,
                                             template=None, history=[Message.from_dict(m) for m in model.messages])
        except InsertNotSupported:
            raise ApiError(400, f'"{req.model}" does not support insert', "suffix") from None
        except PromptError as e:
            raise ApiError(e.status, str(e)) from None

    async def build(lease: Lease) -> EngineRequest:
        prompt = await anyio.to_thread.run_sync(render)
        return EngineRequest(prompt=prompt, options=options, add_bos=prompting.add_bos_for(prompt),
                             logprobs=top > 0, top_logprobs=top)

    gen = Generation(ctx, request, "/v1/completions", req.model, model, options, keep_alive, t0)
    await gen.open(build)
    cid = _completion_id("cmpl")
    created = int(time.time())
    include_usage = bool((req.stream_options or {}).get("include_usage"))

    def base() -> dict[str, Any]:
        return {"id": cid, "object": "text_completion", "created": created, "model": req.model,
                "system_fingerprint": "fp_ollama"}

    if not req.stream:
        parts: list[str] = []
        result: GenerateResult | None = None
        async for item in gen.events():
            if isinstance(item, TokenChunk):
                parts.append(item.text)
            else:
                result = item
        assert result is not None
        return json_response({**base(), "choices": [{"text": "".join(parts), "index": 0, "logprobs": None,
                                                     "finish_reason": result.done_reason or None}],
                              "usage": _usage(result), "speculative_decoding": speculation_fields(result)})

    async def events() -> AsyncIterator[dict[str, Any]]:
        async for item in gen.events():
            if isinstance(item, TokenChunk):
                if item.text:
                    yield _sse({**base(), "choices": [{"text": item.text, "index": 0, "logprobs": None,
                                                       "finish_reason": None}]})
            else:
                spec = speculation_fields(item)
                yield _sse({**base(), "choices": [{"text": "", "index": 0, "logprobs": None,
                                                   "finish_reason": item.done_reason or None}],
                            "speculative_decoding": spec})
                if include_usage:
                    yield _sse({**base(), "choices": [], "usage": _usage(item), "speculative_decoding": spec})

    return await _sse_response(events())


# --- /v1/models ----------------------------------------------------------------------------------------


def _model_object(name: ModelName, modified: float) -> dict[str, Any]:
    return {"id": name.display(), "object": "model", "created": int(modified), "owned_by": name.namespace}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    ctx = ctx_of(request)
    entries = await anyio.to_thread.run_sync(ctx.store.list_models)
    return json_response({"object": "list", "data": [_model_object(e.name, e.modified_at.timestamp()) for e in entries]})


@router.get("/v1/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> Response:
    ctx = ctx_of(request)
    try:
        m = await anyio.to_thread.run_sync(load_stored_model, ctx.store, model)
    except BlobsError:
        raise ApiError(404, f"model '{model}' not found", "model") from None
    return json_response(_model_object(m.name, m.modified_at.timestamp()))
