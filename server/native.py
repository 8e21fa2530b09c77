"""Ollama's native API (`/api/*`), and the generation pipeline that `/v1` shares with it.

Request bodies are decoded into dataclasses whose fields mirror Ollama's api/types.go (same JSON names,
same defaults, Go's decoder messages for type errors). Streaming endpoints answer NDJSON; an error before
the first byte gets a proper status and `{"error": ...}`, an error after it a final `{"error": ...}` line.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from blobs import (
    BlobsError,
    DigestMismatchError,
    InvalidDigestError,
    InvalidNameError,
    ModelName,
    ModelNotFoundError,
    parse_digest,
)
from blobs.model import StoredModel, load_stored_model
from engine.options import (
    SPECULATION_DEFAULTS,
    SPECULATION_OPTIONS,
    Options,
    coerce_options,
)
from engine.process.protocol import (
    EngineCrashedError,
    EngineError,
    GenerateResult,
    TokenChunk,
    TokenLogprob,
)
from engine.process.protocol import GenerateRequest as EngineRequest
from engine.speculative.plan import plan_speculation
from importer import (
    CreateError,
    CreateRequest,
    LocalBlobSink,
    ProgressEvent,
    create_model,
    hf_source,
    request_from_modelfile,
)
from modelfile import ParamError, ParseError, parse

from .gojson import (
    ApiError,
    decode_struct,
    go_json_kind,
    json_bytes,
    json_response,
    read_json,
    rfc3339,
)
from .prompting import (
    InsertNotSupported,
    Message,
    ModelPrompting,
    PromptError,
    Tool,
    chat_messages,
)
from .scheduler import GenerationStream, Lease, QueueFullError
from .settings import keep_alive_seconds
from .types import ChatBody, CopyBody, DeleteBody, GenerateBody, MessageBody, ShowBody

if TYPE_CHECKING:
    from .app import ServerContext

log = logging.getLogger("tandem.server")

router = APIRouter()


def ctx_of(request: Request) -> "ServerContext":
    return request.app.state.ctx


# =============================================================================================
# Shared validation
# =============================================================================================


def stored_model(ctx: "ServerContext", name: str, *, invalid_status: int = 404) -> StoredModel:
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


def parse_keep_alive(ctx: "ServerContext", value: Any) -> float:
    try:
        return keep_alive_seconds(value, ctx.settings.keep_alive)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def merged_options(model: StoredModel, options: dict[str, Any] | None) -> Options:
    """defaults <- model params <- request options, parsed once here; the engine decides the
    speculation from them. A wrong option type is Ollama's `option "x" must be of type ...`, which
    it surfaces as 500 on generate/chat."""
    try:
        return Options.merged(model.params, options)
    except ParamError as e:
        raise ApiError(500, str(e)) from None


def load_options(options: Options) -> dict[str, Any]:
    """Load-time options the model's parameters or the request set explicitly (a change reloads)."""
    return {key: getattr(options, key) for key in ("num_ctx", "num_thread") if key in options.explicit}


def check_think(name: str, think: Any) -> None:
    if think is None or think is False:
        return
    if think is True or think in ("low", "medium", "high", "max"):
        raise ApiError(400, f'"{name}" does not support thinking')
    raise ApiError(400, f'invalid think value: {json.dumps(think)} (must be "high", "medium", "low", true, or false)')


def check_format(fmt: Any) -> Any:
    """Validate ``format`` (None/"", "json", or a JSON schema in engine.sampling.constrain's subset) before
    anything is loaded; returns what the engine request carries (None: free text)."""
    from engine.sampling.constrain import SchemaError, compile_format

    try:
        node = compile_format(fmt)
    except SchemaError as e:
        raise ApiError(400, str(e)) from None
    return None if node is None else fmt


def check_logprobs(top: int) -> None:
    if not 0 <= top <= 20:
        raise ApiError(400, "top_logprobs must be between 0 and 20")


def decode_images(name: str, images: list[str]) -> None:
    """Images need a vision model; tandem runs text models only, so any image is refused (after the
    base64 check Go's decoder would have made)."""
    for img in images:
        try:
            base64.b64decode(img, validate=True)
        except (ValueError, TypeError):
            raise ApiError(400, "illegal base64 data in images") from None
    if images:
        raise ApiError(400, f'"{name}" does not support vision')


# =============================================================================================
# The generation pipeline (shared with /v1)
# =============================================================================================


def timings(t_start_ns: int, lease: Lease, result: GenerateResult) -> dict[str, int]:
    """Ollama's Metrics fields, in its order, zero values omitted (omitempty)."""
    out = {
        "total_duration": time.perf_counter_ns() - t_start_ns,
        "load_duration": int(lease.load_seconds * 1e9),
        "prompt_eval_count": result.prompt_eval_count,
        "prompt_eval_duration": result.prompt_eval_duration_ns,
        "eval_count": result.eval_count,
        "eval_duration": result.eval_duration_ns,
    }
    return {k: v for k, v in out.items() if v}


def logprobs_json(items: list[TokenLogprob] | None) -> list[dict[str, Any]]:
    out = []
    for lp in items or []:
        entry: dict[str, Any] = {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.bytes)}
        if lp.top_logprobs:
            entry["top_logprobs"] = [{"token": t, "logprob": p, "bytes": list(b)} for t, p, b in lp.top_logprobs]
        out.append(entry)
    return out


class Generation:
    """One generation request from lease to last token: runs the engine stream, watches the client
    (a disconnect cancels the engine's work), and on completion logs the request and counts metrics."""

    def __init__(self, ctx: "ServerContext", request: Request, endpoint: str, name: str, model: StoredModel,
                 options: Options, keep_alive: float, t_start_ns: int, load: dict[str, Any]):
        self.ctx = ctx
        self.load = load
        self.request = request
        self.endpoint = endpoint
        self.name = name
        self.model = model
        self.options = options
        self.keep_alive = keep_alive
        self.t_start_ns = t_start_ns
        self.lease: Lease | None = None
        self.stream: GenerationStream | None = None
        self.result: GenerateResult | None = None
        self._watch: asyncio.Task | None = None
        self._gone = asyncio.Event()
        self.client_gone = False

    async def open(self, build: Callable[[Lease], Awaitable[EngineRequest]]) -> None:
        """Lease the model's engine (loading it if needed) and prepare the engine request."""
        self._start_watch()
        try:
            self.lease = await self._acquire()
            try:
                engine_req = await build(self.lease)
            except BaseException:
                self.lease.release()
                raise
            self.stream = GenerationStream(self.lease, engine_req)
            if self.client_gone:
                self.stream.cancel()
        except BaseException:
            self._stop_watch()
            raise

    async def load_only(self) -> None:
        """An empty prompt: load the model (applying keep_alive) and generate nothing."""
        self._start_watch()
        try:
            (await self._acquire()).release()
        finally:
            self._stop_watch()

    async def _acquire(self) -> Lease:
        """The scheduler's lease, given up if the client leaves while the request waits in the queue."""
        acquire = asyncio.ensure_future(self.ctx.scheduler.acquire(self.model, self.load, self.keep_alive))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not acquire.done():
            acquire.cancel()
            try:
                (await acquire).release()  # it may have completed meanwhile
            except BaseException:
                pass
            log.info("%s %s: client disconnected while waiting for the model", self.endpoint, self.name)
            raise ApiError(499, "request canceled")
        try:
            return acquire.result()
        except QueueFullError as e:
            raise ApiError(503, str(e)) from None
        except EngineError as e:
            raise ApiError(e.status, str(e)) from None

    def _start_watch(self) -> None:
        receive = self.request.receive
        self._gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.client_gone = True
                    self._gone.set()
                    if self.stream is not None and self.result is None:
                        log.info("%s %s: client disconnected, cancelling the generation", self.endpoint, self.name)
                        self.stream.cancel()
                    return

        self._watch = asyncio.get_running_loop().create_task(watch())

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def events(self) -> AsyncIterator[TokenChunk | GenerateResult]:
        assert self.stream is not None
        try:
            async for item in self.stream:
                if isinstance(item, GenerateResult):
                    self.result = item
                    self._finished(item)
                yield item
            if self.result is None:  # the stream ended early: cancelled
                raise ApiError(499, "request canceled")
        except EngineCrashedError as e:
            log.error("%s %s: %s", self.endpoint, self.name, e)
            raise ApiError(500, str(e)) from None
        except EngineError as e:
            log.error("%s %s: engine error: %s", self.endpoint, self.name, e)
            raise ApiError(e.status, str(e)) from None
        finally:
            self._stop_watch()
            if self.result is None:
                self.stream.cancel()

    def stats(self, result: GenerateResult) -> dict[str, Any]:
        assert self.lease is not None
        return timings(self.t_start_ns, self.lease, result)

    def _finished(self, result: GenerateResult) -> None:
        self.ctx.metrics.record_generation(self.model.name.display(), result)
        spec = result.speculation
        eval_s = result.eval_duration_ns / 1e9
        rate = result.eval_count / eval_s if eval_s > 0 else 0.0
        total_s = (time.perf_counter_ns() - self.t_start_ns) / 1e9
        line = (f"{self.endpoint} {self.model.name.display()}: prompt {result.prompt_eval_count} tokens "
                f"({result.prompt_cached} cached) in {result.prompt_eval_duration_ns / 1e9:.2f}s, "
                f"generated {result.eval_count} tokens in {eval_s:.2f}s ({rate:.1f} tokens/s), "
                f"done_reason={result.done_reason}, total {total_s:.2f}s")
        if spec.drafter != "none" and spec.draft_n:
            line += (f"; speculation ({spec.drafter}): drafted {spec.draft_n}, accepted {spec.draft_n_accepted} "
                     f"({100 * spec.acceptance_rate:.1f}%), {spec.mean_accepted_length(result.eval_count):.2f} "
                     f"tokens/forward, mean depth {spec.mean_depth:.2f}")
        elif spec.drafter == "none":
            line += "; no speculation"
        log.info(line)


def speculation_fields(result: GenerateResult) -> dict[str, Any]:
    return result.speculation.to_json(result.eval_count)


# =============================================================================================
# Response plumbing: NDJSON streams or one object
# =============================================================================================


async def stream_or_collect(chunks: AsyncIterator[dict[str, Any]], stream: bool,
                            merge: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> Response:
    """Answer with an NDJSON stream (errors after the first line become a final error line) or, for
    stream=false, one object merged from all chunks. An error before the first chunk is a status."""
    it = chunks.__aiter__()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        raise ApiError(500, "no response") from None
    except BaseException:
        await _aclose(it)
        raise
    if not stream:
        items = [first]
        try:
            async for item in it:
                items.append(item)
        finally:
            await _aclose(it)
        return json_response(merge(items))

    async def body() -> AsyncIterator[bytes]:
        try:
            yield json_bytes(first)
            async for item in it:
                yield json_bytes(item)
        except ApiError as e:
            yield json_bytes({"error": e.message})
        finally:
            await _aclose(it)

    return StreamingResponse(body(), media_type="application/x-ndjson")


async def _aclose(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass


def merge_last(items: list[dict[str, Any]]) -> dict[str, Any]:
    return items[-1]


async def thread_progress(work: Callable[[Callable[[ProgressEvent], None]], Any]) -> AsyncIterator[dict[str, Any]]:
    """Run ``work(progress)`` in a thread and yield its ProgressEvents as JSON objects. CreateError /
    blob errors become ApiErrors with their status."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    def progress(ev: ProgressEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ev.to_json())

    def run() -> None:
        try:
            work(progress)
        except BaseException as e:  # handed to the consumer
            loop.call_soon_threadsafe(queue.put_nowait, e)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    threading.Thread(target=run, name="tandem-progress", daemon=True).start()
    while True:
        item = await queue.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise _as_api_error(item)
        yield item


def _as_api_error(e: BaseException) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, CreateError):
        return ApiError(e.status, str(e))
    if isinstance(e, ModelNotFoundError):
        return ApiError(404, str(e))
    if isinstance(e, (InvalidNameError, InvalidDigestError, DigestMismatchError, ParseError, ParamError)):
        return ApiError(400, str(e))
    if isinstance(e, BlobsError):
        return ApiError(400, str(e))
    if isinstance(e, OSError):
        return ApiError(500, str(e))
    log.exception("unexpected error", exc_info=e)
    return ApiError(500, f"{type(e).__name__}: {e}")


# =============================================================================================
# /api/generate
# =============================================================================================


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: GenerateBody = decode_struct(GenerateBody, await read_json(request, "api.GenerateRequest"),
                                      "GenerateRequest")
    if not req.model:
        raise ApiError(400, "model is required")
    check_logprobs(req.top_logprobs)
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    if req.raw and (req.template or req.system or req.context):
        raise ApiError(400, "raw mode does not support template, system, or context")
    model = await anyio.to_thread.run_sync(stored_model, ctx, req.model)
    check_think(req.model, req.think)
    fmt = check_format(req.format)
    decode_images(req.model, req.images)

    if not req.prompt and req.keep_alive is not None and keep_alive == 0:
        await ctx.scheduler.unload(model)
        return json_response({"model": req.model, "created_at": rfc3339(), "response": "", "done": True,
                              "done_reason": "unload"})
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    options = merged_options(model, req.options)
    if not req.raw and req.suffix and not (req.template or prompting.supports_insert):
        raise ApiError(400, f'"{req.model}" does not support insert')

    def render() -> str:
        if req.raw:
            return req.prompt
        try:
            return prompting.generate_prompt(
                prompt=req.prompt, system=req.system or model.system, suffix=req.suffix or None,
                template=req.template or None,
                history=[] if req.context else [Message.from_dict(m) for m in model.messages])
        except InsertNotSupported:
            raise ApiError(400, f'"{req.model}" does not support insert') from None
        except PromptError as e:
            raise ApiError(e.status, str(e)) from None

    if req.debug_render_only:
        text = await anyio.to_thread.run_sync(render)
        return json_response({"model": req.model, "created_at": rfc3339(),
                              "debug_info": {"rendered_template": text, "image_count": 0}})

    gen = Generation(ctx, request, "/api/generate", req.model, model, options, keep_alive, t0,
                     load_options(options))
    if not req.prompt:  # load only
        await gen.load_only()
        return json_response({"model": req.model, "created_at": rfc3339(), "response": "", "done": True,
                              "done_reason": "load"})

    async def build(lease: Lease) -> EngineRequest:
        prompt = await anyio.to_thread.run_sync(render)
        return EngineRequest(prompt=prompt, options=options, raw_tokens=list(req.context) if req.context else None,
                             add_bos=None if req.raw else prompting.add_bos_for(prompt),
                             logprobs=req.logprobs or req.top_logprobs > 0, top_logprobs=req.top_logprobs,
                             shift=req.shift, truncate=req.truncate,
                             format=fmt)

    await gen.open(build)

    def merge(items: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_native(items, "response", "".join(i.get("response", "") for i in items))

    return await stream_or_collect(native_events(gen, req.model, lambda text: {"response": text},
                                                 with_context=not req.raw), req.stream, merge)


async def native_events(gen: "Generation", model: str, payload: Callable[[str], dict[str, Any]],
                        with_context: bool) -> AsyncIterator[dict[str, Any]]:
    """The NDJSON objects of /api/generate and /api/chat, which differ only in how text is carried
    (``payload``: `response` or `message`) and whether the final one has `context`."""
    async for item in gen.events():
        if isinstance(item, TokenChunk):
            if not item.text and not item.logprobs:
                continue
            out: dict[str, Any] = {"model": model, "created_at": rfc3339(), **payload(item.text), "done": False}
            if item.logprobs:
                out["logprobs"] = logprobs_json(item.logprobs)
            yield out
        else:
            final: dict[str, Any] = {"model": model, "created_at": rfc3339(), **payload(""), "done": True,
                                     "done_reason": item.done_reason}
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


# =============================================================================================
# /api/chat
# =============================================================================================


def decode_messages(raw: list[dict[str, Any]]) -> list[Message]:
    out = []
    for m in raw:
        body: MessageBody = decode_struct(MessageBody, m, "Message")
        out.append(Message.from_dict({**m, "role": body.role.lower(), "content": body.content}))
    return out


async def chat_engine_request(gen: Generation, prompting: ModelPrompting, messages: list[Message],
                              tools: list[Tool], options: Options, *, truncate: bool, shift: bool,
                              logprobs: bool, top_logprobs: int,
                              format: Any = None) -> Callable[[Lease], Awaitable[EngineRequest]]:
    """The `build` step of a chat: render with Ollama's truncation (oldest messages dropped until the
    prompt fits num_ctx), which needs the loaded engine's tokenizer."""

    async def build(lease: Lease) -> EngineRequest:
        num_ctx = lease.runner.spec.num_ctx

        def fits(text: str) -> bool:
            return len(lease.engine.tokenize(text, prompting.add_bos_for(text))) < num_ctx

        def render() -> str:
            try:
                return prompting.chat_prompt(messages, tools, fits if truncate else None)
            except PromptError as e:
                raise ApiError(e.status, str(e)) from None

        prompt = await anyio.to_thread.run_sync(render)
        return EngineRequest(prompt=prompt, options=options, add_bos=prompting.add_bos_for(prompt),
                             logprobs=logprobs or top_logprobs > 0, top_logprobs=top_logprobs,
                             shift=shift, truncate=truncate,
                             format=format)

    return build


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: ChatBody = decode_struct(ChatBody, await read_json(request, "api.ChatRequest"), "ChatRequest")
    if not req.model:
        raise ApiError(400, "model is required")
    check_logprobs(req.top_logprobs)
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    messages = decode_messages(req.messages)
    model = await anyio.to_thread.run_sync(stored_model, ctx, req.model)
    if req.tools:  # no tool-call parser yet, so no model claims the capability
        raise ApiError(400, f'"{req.model}" does not support tools')
    check_think(req.model, req.think)
    fmt = check_format(req.format)
    for m in req.messages:
        decode_images(req.model, m.get("images") or [])

    if not messages and req.keep_alive is not None and keep_alive == 0:
        await ctx.scheduler.unload(model)
        return json_response({"model": req.model, "created_at": rfc3339(),
                              "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "unload"})
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    options = merged_options(model, req.options)
    full = chat_messages(model, messages)

    if req.debug_render_only:
        try:
            text = await anyio.to_thread.run_sync(lambda: prompting.chat_prompt(full, []))
        except PromptError as e:
            raise ApiError(e.status, str(e)) from None
        return json_response({"model": req.model, "created_at": rfc3339(),
                              "message": {"role": "assistant", "content": ""},
                              "debug_info": {"rendered_template": text, "image_count": 0}})

    gen = Generation(ctx, request, "/api/chat", req.model, model, options, keep_alive, t0,
                     load_options(options))
    if not messages:  # load only
        await gen.load_only()
        return json_response({"model": req.model, "created_at": rfc3339(),
                              "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "load"})

    build = await chat_engine_request(gen, prompting, full, [], options, truncate=req.truncate, shift=req.shift,
                                      logprobs=req.logprobs, top_logprobs=req.top_logprobs, format=fmt)
    await gen.open(build)

    def merge(items: list[dict[str, Any]]) -> dict[str, Any]:
        text = "".join(i["message"]["content"] for i in items)
        return merge_native(items, "message", {"role": "assistant", "content": text})

    return await stream_or_collect(
        native_events(gen, req.model, lambda text: {"message": {"role": "assistant", "content": text}},
                      with_context=False), req.stream, merge)


# =============================================================================================
# /api/create and /api/blobs
# =============================================================================================


def _old_form_request(ctx: "ServerContext", body: dict[str, Any]) -> CreateRequest:
    """The pre-2025 create body `{"name","modelfile","path"}`: the Modelfile is parsed here and its
    files are paths on this machine, relative to `path` (the Modelfile's location) when given."""
    name = body.get("model") or body.get("name")
    if not name or not isinstance(name, str):
        raise ApiError(400, "model is required")
    text = body.get("modelfile") or ""
    path = body.get("path") or ""
    if not isinstance(text, str) or not isinstance(path, str):
        raise ApiError(400, "modelfile and path must be strings")
    base = Path(path).expanduser() if path else Path.cwd()
    if path and base.is_file():
        if not text:
            text = base.read_text(encoding="utf-8", errors="replace")
        base = base.parent
    if not text:
        raise ApiError(400, "neither 'from' or 'files' was specified")
    try:
        commands = parse(text)
    except ParseError as e:
        raise ApiError(400, str(e)) from None
    warnings: list[str] = []
    req = request_from_modelfile(commands, name, base.resolve(), LocalBlobSink(ctx.store), warnings)
    for w in warnings:
        log.warning("create %s: %s", name, w)
    quant = body.get("quantize") or body.get("quantization")
    if isinstance(quant, str) and quant:
        req.quantize = quant
    if isinstance(body.get("draft_quantize"), str) and body["draft_quantize"]:
        req.draft_quantize = body["draft_quantize"]
    return req


@router.post("/api/create")
async def create(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await read_json(request, "api.CreateRequest")
    stream = body.get("stream")
    stream = True if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(400, f"json: cannot unmarshal {go_json_kind(stream)} into Go struct field CreateRequest.stream of type bool")
    old_form = body.get("modelfile") and not body.get("files") and not body.get("from")
    try:
        if old_form:
            req = await anyio.to_thread.run_sync(_old_form_request, ctx, body)
        else:
            req = CreateRequest.from_json(body)
        ModelName.parse(req.model)
    except (CreateError, InvalidNameError, BlobsError, OSError) as e:
        raise _as_api_error(e) from None

    def work(progress: Callable[[ProgressEvent], None]) -> None:
        if req.from_ and not req.files and hf_source.is_hf_name(req.from_) and not LocalBlobSink(ctx.store).has_model(req.from_):
            # `"from": "hf.co/org/repo:tag"` of a model not pulled yet: pulled first, as Ollama does.
            from .pull import fetch_into_store

            req.files = fetch_into_store(ctx.store, hf_source.parse_hf_name(req.from_), progress)
            req.from_ = None
        name = create_model(ctx.store, req, progress)
        log.info("created %s", name.display())

    return await stream_or_collect(thread_progress(work), stream, merge_last)


def _blob_digest(digest: str) -> str:
    try:
        return parse_digest(digest)
    except InvalidDigestError:
        raise ApiError(400, "invalid digest format") from None


@router.head("/api/blobs/{digest}")
async def head_blob(request: Request, digest: str) -> Response:
    canonical = _blob_digest(digest)
    if not ctx_of(request).store.has_blob(canonical):
        return json_response({"error": f'blob "{digest}" not found'}, 404)
    return Response(status_code=200)


@router.post("/api/blobs/{digest}")
async def post_blob(request: Request, digest: str) -> Response:
    ctx = ctx_of(request)
    canonical = _blob_digest(digest)
    if ctx.store.has_blob(canonical):
        return Response(status_code=200)
    chunks = request.stream().__aiter__()

    def body_chunks() -> Any:
        while True:
            try:
                chunk = anyio.from_thread.run(chunks.__anext__)
            except StopAsyncIteration:
                return
            if chunk:
                yield chunk

    try:
        got, size = await anyio.to_thread.run_sync(lambda: ctx.store.write_blob(body_chunks(), expected_digest=canonical))
    except DigestMismatchError as e:
        raise ApiError(400, f'digest mismatch, expected "{digest}", got "{e.got}"') from None
    log.info("stored blob %s (%d bytes)", got, size)
    return Response(status_code=201)


# =============================================================================================
# /api/tags, /api/show, /api/copy, /api/delete, /api/ps, /api/version
# =============================================================================================


def _tags(ctx: "ServerContext") -> dict[str, Any]:
    models = []
    for entry in ctx.store.list_models():
        try:
            m = load_stored_model(ctx.store, entry.name)
        except (BlobsError, OSError, ValueError) as e:
            log.warning("skipping %s: %s", entry.name, e)
            continue
        name = entry.name.display()
        models.append({"name": name, "model": name, "modified_at": rfc3339(entry.modified_at), "size": entry.size,
                       "digest": entry.digest, "details": m.details()})
    return {"models": models}


@router.get("/api/tags")
@router.head("/api/tags")
async def tags(request: Request) -> Response:
    return json_response(await anyio.to_thread.run_sync(_tags, ctx_of(request)))


def draft_details(model: StoredModel) -> dict[str, Any] | None:
    if model.draft_path is None:
        return None
    from engine.gguf import GGUFFile, format_parameter_count

    with GGUFFile(model.draft_path) as f:
        return {"format": "gguf", "family": f.architecture, "parameter_size": format_parameter_count(f.parameter_count),
                "quantization_level": f.file_type}


def speculation_info(model: StoredModel, options: dict[str, Any] | None, has_mtp_head: bool) -> dict[str, Any]:
    """tandem's addition to /api/show: the draft model, the tunables' defaults, the model's own
    settings and what a request with these options would use (the engine's own rule)."""
    try:
        merged = Options.merged(model.params, options)
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    plan = plan_speculation(merged, has_draft_layer=model.draft_path is not None, has_mtp_head=has_mtp_head)
    return {
        "draft": draft_details(model),
        "defaults": dict(SPECULATION_DEFAULTS),
        "parameters": {k: v for k, v in model.params.items() if k in SPECULATION_OPTIONS or k == "n_max"},
        "effective": plan.as_options(),
    }


def _show(ctx: "ServerContext", req: ShowBody, name: str) -> dict[str, Any]:
    from .show import model_info, modelfile_text, parameters_text

    model = stored_model(ctx, name, invalid_status=400)
    params = dict(model.params)
    try:  # Ollama's show applies the request's options over the model's parameters
        params.update(coerce_options(req.options))
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    if req.system:
        model = dataclasses.replace(model, system=req.system)
    prompting = ctx.prompts.get(model)
    out: dict[str, Any] = {}
    if model.licenses:
        out["license"] = "\n".join(model.licenses)
    out["modelfile"] = modelfile_text(dataclasses.replace(model, params=params))
    if params:
        out["parameters"] = parameters_text(params)
    if model.template:
        out["template"] = model.template
    if model.system:
        out["system"] = model.system
    out["details"] = model.details()
    if model.messages:
        out["messages"] = model.messages
    out["model_info"] = model_info(model, verbose=req.verbose)
    out["capabilities"] = prompting.capabilities()
    out["modified_at"] = rfc3339(model.modified_at)
    out["speculation"] = speculation_info(model, req.options, prompting.facts.has_mtp_head)
    return out


@router.post("/api/show")
async def show(request: Request) -> Response:
    ctx = ctx_of(request)
    req: ShowBody = decode_struct(ShowBody, await read_json(request, "api.ShowRequest"), "ShowRequest")
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    return json_response(await anyio.to_thread.run_sync(_show, ctx, req, name))


@router.post("/api/copy")
async def copy(request: Request) -> Response:
    ctx = ctx_of(request)
    req: CopyBody = decode_struct(CopyBody, await read_json(request, "api.CopyRequest"), "CopyRequest")
    try:
        ModelName.parse(req.source)
    except InvalidNameError:
        raise ApiError(400, f"source {json.dumps(req.source)} is invalid") from None
    try:
        ModelName.parse(req.destination)
    except InvalidNameError:
        raise ApiError(400, f"destination {json.dumps(req.destination)} is invalid") from None
    try:
        await anyio.to_thread.run_sync(ctx.store.copy, req.source, req.destination)
    except ModelNotFoundError:
        raise ApiError(404, f"model {json.dumps(req.source)} not found") from None
    log.info("copied %s to %s", req.source, req.destination)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete(request: Request) -> Response:
    ctx = ctx_of(request)
    req: DeleteBody = decode_struct(DeleteBody, await read_json(request, "api.DeleteRequest"), "DeleteRequest")
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    try:
        model = await anyio.to_thread.run_sync(load_stored_model, ctx.store, name)
    except InvalidNameError:
        raise ApiError(400, "invalid model name") from None
    except ModelNotFoundError:
        raise ApiError(404, f"model '{name}' not found") from None
    try:
        await anyio.to_thread.run_sync(ctx.store.delete, name)
    except ModelNotFoundError:
        raise ApiError(404, f"model '{name}' not found") from None
    # Its engine goes too, unless another name (a copy) still runs on the same weights.
    if not await anyio.to_thread.run_sync(_weights_in_use, ctx, model):
        await ctx.scheduler.unload(model)
    log.info("deleted %s", name)
    return Response(status_code=200)


def _weights_in_use(ctx: "ServerContext", model: StoredModel) -> bool:
    for entry in ctx.store.list_models():
        try:
            other = load_stored_model(ctx.store, entry.name)
        except (BlobsError, OSError, ValueError):
            continue
        if (other.model_path, other.draft_path) == (model.model_path, model.draft_path):
            return True
    return False


@router.get("/api/ps")
async def ps(request: Request) -> Response:
    ctx = ctx_of(request)
    models = []
    for r in ctx.scheduler.loaded():
        facts = r.facts
        size = facts.memory_bytes or r.model.size
        on_gpu = facts.device.startswith("cuda")
        models.append({
            "name": r.name, "model": r.name, "size": size, "digest": r.model.digest, "details": r.model.details(),
            "expires_at": rfc3339(r.expires_at.astimezone()), "size_vram": size if on_gpu else 0,
            "context_length": r.spec.num_ctx,
            # tandem's addition: what runs it
            "engine": {"pid": r.engine.pid, "device": facts.device, "weight_format": facts.weight_format,
                       "draft_architecture": facts.draft_architecture,
                       "draft_weight_format": facts.draft_weight_format},
        })
    return json_response({"models": models})


@router.post("/api/push")
async def push(request: Request) -> Response:
    raise ApiError(400, "pushing models is not supported by tandem; share the GGUF files or the models directory")


@router.get("/api/version")
@router.head("/api/version")
async def version(request: Request) -> Response:
    return json_response({"version": ctx_of(request).version})
