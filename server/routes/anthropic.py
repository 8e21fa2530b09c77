"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), as Ollama serves it so that
tools such as Claude Code can use a local model: the request becomes a chat on the same generation pipeline
as /api/chat and /v1/chat/completions (`anthropic_request` converts it), the reply's reasoning, text and
tool calls become `thinking`, `text` and `tool_use` content blocks.

Streaming is SSE with Anthropic's event names (message_start, ping, content_block_start/delta/stop,
message_delta, message_stop; `error` for a failure once the stream has begun). Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}` with the matching status. tandem adds a
`speculative_decoding` object to the message (non-streaming) and to the message_delta event.

Approximated: `stop_reason` is "end_turn" when a stop sequence ended the output too (the engine does not
say which stop matched; Ollama answers the same), `tool_choice` as `anthropic_request.ToolChoice` says,
and `usage.input_tokens` counts the whole prompt (tandem's prompt cache is not reported apart).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import string
import time
from typing import Any, AsyncGenerator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.contract.protocol import GenerateResult, TokenChunk
from server.text.render import ToolCall

from ..gojson import INTERNAL_ERROR, ApiError, json_response, read_struct
from ..pipeline import Chat, ChatInputs, open_chat, speculation_fields
from ..reply import ReplyPiece
from ..sse import sse_response
from .anthropic_request import (
    MessagesRequest,
    ToolChoice,
    chat_messages_of,
    check_request,
    format_of,
    options_of,
    system_message,
    think_of,
    tool_choice_of,
    tools_of,
)

log = logging.getLogger("tandem.server")
router = APIRouter()

# --- errors --------------------------------------------------------------------------------------------

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, message: str) -> Response:
    return json_response(error_body(status, message), status)


def _anthropic_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Answer the route's failures in Anthropic's shape (the app's handlers give /v1 OpenAI's); an
    unexpected exception's text goes to the log only."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e.status, e.message)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, INTERNAL_ERROR)

    return wrapped


# --- the request, prepared --------------------------------------------------------------------------------


async def _open(request: Request, req: MessagesRequest, endpoint: str, t0: int, *, count: bool,
                truncate: bool = True) -> tuple[Chat, ToolChoice]:
    """The generation, leased and rendered, and the tool choice its reply is read with; with `count` the
    prompt's token count, known before the first token (a stream's message_start reports it; a whole answer
    has the engine's count)."""
    messages = system_message(req.system) + chat_messages_of(req.messages)
    choice = tool_choice_of(req.tool_choice, tools_of(req.tools))
    chat = await open_chat(request, ChatInputs(
        endpoint, req.model, messages, think_of(req.thinking), req.keep_alive,
        format=lambda: format_of(req.output_config), tools=lambda: choice.offered, options=lambda: options_of(req),
        images=any(m.images for m in messages), truncate=truncate, count_prompt=count), t0)
    return chat, choice


async def _decode(request: Request) -> MessagesRequest:
    return await read_struct(request, MessagesRequest, "anthropic.MessagesRequest")


# --- content blocks ---------------------------------------------------------------------------------------


def _random_id(prefix: str) -> str:
    return prefix + "".join(random.choices(string.ascii_letters + string.digits, k=24))


def _event(name: str, data: dict[str, Any]) -> dict[str, str]:
    return {"event": name, "data": json.dumps({"type": name, **data}, ensure_ascii=False, separators=(",", ":"))}


class ContentBlocks:
    """The reply as Anthropic's content blocks, built from the splitter's pieces: one block open at a time,
    a piece of another kind closes it and opens its own. A tool call is parsed whole, so its block carries
    the input in one input_json_delta. `feed` and `close` return the stream's events; `blocks` is the same
    content assembled (the non-streaming answer), so both answers always agree."""

    def __init__(self, max_calls: int | None):
        self.blocks: list[dict[str, Any]] = []
        self.calls = 0
        self._open = False
        self._max_calls = max_calls

    def feed(self, piece: ReplyPiece) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        if piece.thinking:
            out += self._delta("thinking", piece.thinking)
        if piece.content:
            out += self._delta("text", piece.content)
        for call in piece.tool_calls:
            if self._max_calls is None or self.calls < self._max_calls:
                out += self._tool_use(call)
        return out

    def close(self) -> list[dict[str, str]]:
        if not self._open:
            return []
        self._open = False
        return [_event("content_block_stop", {"index": len(self.blocks) - 1})]

    def _start(self, block: dict[str, Any]) -> list[dict[str, str]]:
        out = self.close()
        out.append(_event("content_block_start", {"index": len(self.blocks), "content_block": block}))
        self.blocks.append(dict(block))
        self._open = True
        return out

    def _delta(self, kind: str, text: str) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        if not (self._open and self.blocks[-1]["type"] == kind):
            # A thinking block carries a signature at Anthropic; tandem has none to give (it ignores one sent back).
            out += self._start({"type": "text", "text": ""} if kind == "text"
                               else {"type": "thinking", "thinking": "", "signature": ""})
        self.blocks[-1][kind] += text
        out.append(_event("content_block_delta", {"index": len(self.blocks) - 1,
                                                  "delta": {"type": f"{kind}_delta", kind: text}}))
        return out

    def _tool_use(self, call: ToolCall) -> list[dict[str, str]]:
        self.calls += 1
        arguments = dict(call.arguments)
        out = self._start({"type": "tool_use", "id": _random_id("toolu_"), "name": call.name, "input": {}})
        self.blocks[-1]["input"] = arguments
        out.append(_event("content_block_delta", {"index": len(self.blocks) - 1, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(arguments, ensure_ascii=False)}}))
        return out + self.close()


def _stop_reason(done_reason: str, called: bool) -> str:
    if called:
        return "tool_use"
    return "max_tokens" if done_reason == "length" else "end_turn"


def _usage(result: GenerateResult) -> dict[str, int]:
    return {"input_tokens": result.prompt_eval_count, "output_tokens": result.eval_count}


# --- POST /v1/messages ------------------------------------------------------------------------------------


@router.post("/v1/messages")
@_anthropic_errors
async def create_message(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await _decode(request)
    check_request(req)
    chat, choice = await _open(request, req, "/v1/messages", t0, count=req.stream)
    gen, input_tokens, splitter = chat.gen, chat.prompt_tokens, chat.splitter()
    blocks = ContentBlocks(choice.max_calls)
    message = {"id": _random_id("msg_"), "type": "message", "role": "assistant", "model": req.model}

    if not req.stream:
        result: GenerateResult | None = None
        async for item in gen.events():
            if isinstance(item, TokenChunk):
                blocks.feed(splitter.feed(item.text))
            else:
                blocks.feed(splitter.finish())
                result = item
        assert result is not None
        return json_response({**message, "content": blocks.blocks,
                              "stop_reason": _stop_reason(result.done_reason, blocks.calls > 0),
                              "stop_sequence": None, "usage": _usage(result),
                              "speculative_decoding": speculation_fields(result)})

    async def events() -> AsyncGenerator[dict[str, str], None]:
        started = False
        async for item in gen.events():
            if not started:  # only once the engine answered: an earlier failure is a plain HTTP error
                started = True
                yield _event("message_start", {"message": {
                    **message, "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})
                yield _event("ping", {})
            if isinstance(item, TokenChunk):
                for e in blocks.feed(splitter.feed(item.text)):
                    yield e
                continue
            for e in blocks.feed(splitter.finish()) + blocks.close():
                yield e
            yield _event("message_delta", {
                "delta": {"stop_reason": _stop_reason(item.done_reason, blocks.calls > 0), "stop_sequence": None},
                "usage": _usage(item), "speculative_decoding": speculation_fields(item)})
            yield _event("message_stop", {})

    return await _sse_response(events())


async def _sse_response(events: AsyncGenerator[dict[str, str], None]) -> Response:
    """Anthropic's SSE: a failure after the first event is an `error` event, as Anthropic sends one."""
    return await sse_response(events, _error_event, log_failures="/v1/messages stream failed")


def _error_event(e: ApiError) -> dict[str, str]:
    return {"event": "error", "data": json.dumps(error_body(e.status, e.message), ensure_ascii=False)}


# --- POST /v1/messages/count_tokens -----------------------------------------------------------------------


@router.post("/v1/messages/count_tokens")
@_anthropic_errors
async def count_tokens(request: Request) -> Response:
    """The rendered prompt's tokens (system, tools and messages through the model's template), counted by
    the loaded model's tokenizer; nothing is generated."""
    t0 = time.perf_counter_ns()
    req = await _decode(request)
    check_request(req, generating=False)
    # Not truncated: a conversation past the context must show in the count (clients compact on it).
    chat, _ = await _open(request, req, "/v1/messages/count_tokens", t0, count=True, truncate=False)
    gen = chat.gen
    assert gen.stream is not None
    gen.stream.cancel()  # never started: this only hands the lease back
    gen._stop_watch()  # events() would stop it; nothing is consumed here
    return json_response({"input_tokens": chat.prompt_tokens})
