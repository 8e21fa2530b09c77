"""Ollama's generation endpoints, `/api/generate` and `/api/chat`.

Request bodies are decoded into dataclasses whose fields mirror Ollama's api/types.go (same JSON names,
same defaults, Go's decoder messages for type errors); the answers are NDJSON streams or, for
`stream: false`, one merged object. The generation itself is `server.pipeline`'s, shared with /v1.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.contract.protocol import GenerateRequest as EngineRequest
from engine.contract.protocol import TokenChunk

from ..context import ctx_of
from ..gojson import ApiError, decode_struct, json_response, read_struct, rfc3339
from ..ndjson import stream_or_collect
from ..effective_options import merged_options
from ..pipeline import ChatInputs, Generation, logprobs_json, open_chat, speculation_fields
from ..prompting import InsertNotSupported, Message, ModelPrompting, PromptError
from ..reply import ReplyPiece, ReplySplitter, thinking_on
from ..lifecycle import Lease
from ..types import ChatBody, GenerateBody, MessageBody
from ..validation import check_format, check_logprobs, check_think, decode_images, parse_keep_alive, stored_model

router = APIRouter()


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: GenerateBody = await read_struct(request, GenerateBody, "api.GenerateRequest")
    if not req.model:
        raise ApiError(400, "model is required")
    check_logprobs(req.top_logprobs)
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    if req.raw and (req.template or req.system or req.context):
        raise ApiError(400, "raw mode does not support template, system, or context")
    model = await anyio.to_thread.run_sync(stored_model, ctx, req.model)
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    fmt = check_format(req.format)
    think = check_think(req.model, req.think, prompting.supports_thinking)
    images = decode_images(req.model, req.images, prompting.supports_vision)

    if not req.prompt and req.keep_alive is not None and keep_alive == 0:
        await ctx.lifecycle.unload(model)
        return json_response({"model": req.model, "created_at": rfc3339(), "response": "", "done": True,
                              "done_reason": "unload"})
    options = merged_options(model, req.options)
    if req.suffix and not prompting.supports_insert:  # Ollama asks the model for the capability, raw or not
        raise ApiError(400, f'"{req.model}" does not support insert')

    def render() -> str:
        if req.raw:
            return req.prompt
        try:
            return prompting.generate_prompt(
                prompt=req.prompt, system=req.system or model.system, suffix=req.suffix or None,
                template=req.template or None,
                history=[] if req.context else [Message.from_dict(m) for m in model.messages], think=think,
                images=images)
        except InsertNotSupported:
            raise ApiError(400, f'"{req.model}" does not support insert') from None
        except PromptError as e:
            raise ApiError(e.status, str(e)) from None

    if req.debug_render_only:
        text = await anyio.to_thread.run_sync(render)
        return json_response({"model": req.model, "created_at": rfc3339(), "response": "", "done": False,
                              "_debug_info": debug_info(text, len(images))})

    gen = Generation(ctx, request, "/api/generate", req.model, model, options, keep_alive, t0)
    if not req.prompt:  # load only
        await gen.load_only()
        return json_response({"model": req.model, "created_at": rfc3339(), "response": "", "done": True,
                              "done_reason": "load"})

    async def build(lease: Lease) -> EngineRequest:
        prompt = await anyio.to_thread.run_sync(render)
        return EngineRequest(prompt=prompt, options=options, images=images,
                             raw_tokens=list(req.context) if req.context else None,
                             add_bos=None if req.raw else prompting.add_bos_for(prompt),
                             logprobs=req.logprobs or req.top_logprobs > 0, top_logprobs=req.top_logprobs,
                             shift=req.shift, truncate=req.truncate,
                             format=fmt, think_first=fmt is not None and thinking_on(think))

    await gen.open(build)
    splitter = ReplySplitter.for_request(prompting, gen.prompt, (), think, raw=req.raw)

    def payload(piece: ReplyPiece) -> dict[str, Any]:
        return {"response": piece.content, **({"thinking": piece.thinking} if piece.thinking else {})}

    def merge(items: list[dict[str, Any]]) -> dict[str, Any]:
        final = merge_native(items, "response", "".join(i.get("response", "") for i in items))
        thinking = "".join(i.get("thinking", "") for i in items)
        if thinking:
            final = _reorder({**final, "thinking": thinking}, ["model", "created_at", "response", "thinking"])
        return final

    return await stream_or_collect(native_events(gen, req.model, splitter, payload, with_context=not req.raw),
                                   req.stream, merge)


def debug_info(rendered: str, images: int = 0) -> dict[str, Any]:
    """Ollama's `_debug_info` (api.DebugInfo) for `_debug_render_only`: the zero-valued response
    around it, as Go marshals it (image_count omitted when 0)."""
    out: dict[str, Any] = {"rendered_template": rendered}
    if images:
        out["image_count"] = images
    return out


async def native_events(gen: Generation, model: str, splitter: ReplySplitter,
                        payload: Callable[[ReplyPiece], dict[str, Any]],
                        with_context: bool) -> AsyncIterator[dict[str, Any]]:
    """The NDJSON objects of /api/generate and /api/chat, which differ only in how the reply is carried
    (``payload``: `response`/`thinking` or `message`) and whether the final one has `context`. The text
    goes through the request's splitter (thinking, tool calls, content) as it arrives."""
    async for item in gen.events():
        if isinstance(item, TokenChunk):
            piece = splitter.feed(item.text) if item.text else ReplyPiece()
            if not piece and not item.logprobs:
                continue  # nothing decided yet (a partial tag or call is held back)
            out: dict[str, Any] = {"model": model, "created_at": rfc3339(), **payload(piece), "done": False}
            if item.logprobs:
                out["logprobs"] = logprobs_json(item.logprobs)
            yield out
        else:
            final: dict[str, Any] = {"model": model, "created_at": rfc3339(), **payload(splitter.finish()),
                                     "done": True, "done_reason": item.done_reason}
            if with_context:
                final["context"] = item.context
            final.update(gen.stats(item))
            final.update(speculation_fields(item))
            yield final


def merge_native(items: list[dict[str, Any]], key: str, value: Any) -> dict[str, Any]:
    """The `stream:false` answer: the final object with the whole text under ``key`` and every logprob."""
    final = dict(items[-1])
    final[key] = value
    lps = [lp for i in items for lp in i.get("logprobs", [])]
    if lps:
        final["logprobs"] = lps
    return _reorder(final, ["model", "created_at", key, "logprobs", "done"])


def _reorder(obj: dict[str, Any], first: list[str]) -> dict[str, Any]:
    out = {k: obj[k] for k in first if k in obj}
    out.update({k: v for k, v in obj.items() if k not in out})
    return out


def decode_messages(raw: list[dict[str, Any]]) -> list[Message]:
    out = []
    for m in raw:
        body: MessageBody = decode_struct(MessageBody, m, "Message")
        try:
            out.append(Message.from_dict({**m, "role": body.role.lower(), "content": body.content}))
        except (ValueError, TypeError, AttributeError):
            raise ApiError(400, "invalid tool call in message") from None
    return out


def chat_message(piece: ReplyPiece) -> dict[str, Any]:
    """api.Message of an answer chunk: role and content always, thinking and tool calls when present."""
    msg: dict[str, Any] = {"role": "assistant", "content": piece.content}
    if piece.thinking:
        msg["thinking"] = piece.thinking
    if piece.tool_calls:
        msg["tool_calls"] = [c.to_dict() for c in piece.tool_calls]
    return msg


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: ChatBody = await read_struct(request, ChatBody, "api.ChatRequest")
    if not req.model:
        raise ApiError(400, "model is required")
    check_logprobs(req.top_logprobs)
    parse_keep_alive(ctx, req.keep_alive)  # a bad keep_alive is refused before the messages are read
    messages = decode_messages(req.messages)

    def check_images(prompting: ModelPrompting) -> None:
        for m in req.messages:
            decode_images(req.model, m.get("images") or [], prompting.supports_vision)

    prep = await open_chat(request, ChatInputs(
        "/api/chat", req.model, messages, req.think, req.keep_alive, format=lambda: req.format,
        tools=lambda: req.tools, options=lambda: req.options, check=check_images, truncate=req.truncate,
        shift=req.shift, logprobs=req.logprobs, top_logprobs=req.top_logprobs, empty_loads=True,
        render_only=req.debug_render_only), t0)
    if prep.rendered is not None:
        return json_response({"model": req.model, "created_at": rfc3339(), "message": {"role": "", "content": ""},
                              "done": False, "_debug_info": debug_info(prep.rendered)})
    if prep.done_reason:  # load or unload only
        return json_response({"model": req.model, "created_at": rfc3339(),
                              "message": {"role": "assistant", "content": ""}, "done": True,
                              "done_reason": prep.done_reason})
    splitter = prep.splitter()

    def merge(items: list[dict[str, Any]]) -> dict[str, Any]:
        whole = ReplyPiece("".join(i["message"]["content"] for i in items),
                           "".join(i["message"].get("thinking", "") for i in items))
        message = chat_message(whole)
        calls = [c for i in items for c in i["message"].get("tool_calls", [])]
        if calls:
            message["tool_calls"] = calls
        return merge_native(items, "message", message)

    events = native_events(prep.gen, req.model, splitter, lambda piece: {"message": chat_message(piece)},
                           with_context=False)
    return await stream_or_collect(events, req.stream, merge)
