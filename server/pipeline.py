"""The generation pipeline shared by /api/generate, /api/chat and /v1: from the model lifecycle's lease to the
engine's last token, with the client watched (a disconnect cancels the engine's work) and the finished
request logged and counted; and a chat's preparation (`open_chat`), the same for the four chat routes. The
routes only decode requests and shape the answers.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from fastapi import Request

from blobs.model import StoredModel
from engine.contract.options import Options
from engine.contract.protocol import (
    EngineCrashedError,
    EngineError,
    GenerateResult,
    TokenChunk,
    TokenLogprob,
)
from engine.contract.protocol import GenerateRequest as EngineRequest

from .context import ServerContext, ctx_of
from .effective_options import merged_options
from .gojson import ApiError
from .prompting import Message, ModelPrompting, PromptError, RenderedChat, Think, Tool, chat_messages
from .reply import ReplySplitter, thinking_on
from .engine_process.stream import GenerationStream
from .lifecycle import Lease, QueueFullError
from .validation import check_format, check_think, decode_tools, parse_keep_alive, stored_model

log = logging.getLogger("tandem.server")


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

    def __init__(self, ctx: ServerContext, request: Request, endpoint: str, name: str, model: StoredModel,
                 options: Options, keep_alive: float, t_start_ns: int):
        self.ctx = ctx
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
        self.prompt = ""  # the rendered prompt, once open (the reply's parsers read how it ends)
        self._watch: asyncio.Task | None = None
        self._gone = asyncio.Event()
        self.client_gone = False
        self._build: Callable[[Lease], Awaitable[EngineRequest]] | None = None
        self._retried = False

    async def _check_completion(self) -> None:
        """An embedding model cannot generate: Ollama's 400 `"<model>" does not support generate` (`chat`
        on the chat endpoints), before anything is loaded."""
        prompting = await anyio.to_thread.run_sync(self.ctx.prompts.get, self.model)
        if prompting.is_embedding:
            what = "chat" if "chat" in self.endpoint else "generate"
            raise ApiError(400, f'"{self.name}" does not support {what}')

    async def open(self, build: Callable[[Lease], Awaitable[EngineRequest]]) -> None:
        """Lease the model's engine (loading it if needed) and prepare the engine request."""
        await self._check_completion()
        self._build = build
        self._start_watch()
        try:
            await self._open_stream()
        except BaseException:
            self._stop_watch()
            raise

    async def _open_stream(self) -> None:
        assert self._build is not None
        self.lease = await self._acquire()
        try:
            engine_req = await self._build(self.lease)
        except EngineError as e:  # the engine died or froze while the prompt was tokenized
            lost = self._engine_lost(e)
            if lost:
                self.lease.crashed = True
            self.lease.release()
            if lost and self._may_retry():
                return await self._open_stream()
            log.error("%s %s: %s", self.endpoint, self.name, e)
            raise ApiError(e.status, str(e)) from None
        except BaseException:
            self.lease.release()
            raise
        self.prompt = engine_req.prompt
        self.stream = GenerationStream(self.lease, engine_req)
        if self.client_gone:
            self.stream.cancel()

    def _engine_lost(self, error: EngineError) -> bool:
        assert self.lease is not None
        return isinstance(error, EngineCrashedError) or not self.lease.engine.alive()

    def _may_retry(self) -> bool:
        """Whether a request whose engine died (crashed, killed by the watchdog, replaced) before it streamed
        anything is tried again on a new engine: once, and only for a client still waiting. The client sees
        a delay instead of an error; a second death is the model's fault, not bad luck, and is reported."""
        if self._retried or self.client_gone:
            return False
        self._retried = True
        log.warning("%s %s: the engine was lost before the first token; trying again on a new engine",
                    self.endpoint, self.name)
        return True

    async def load_only(self) -> None:
        """An empty prompt: load the model (applying keep_alive) and generate nothing."""
        await self._check_completion()
        self._start_watch()
        try:
            (await self._acquire()).release()
        finally:
            self._stop_watch()

    async def _acquire(self) -> Lease:
        """The lifecycle's lease, given up if the client leaves while the request waits in the queue."""
        acquire = asyncio.ensure_future(self.ctx.lifecycle.acquire(self.model, self.options, self.keep_alive))
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
            streamed = False
            while True:
                try:
                    async for item in self.stream:
                        if isinstance(item, GenerateResult):
                            self.result = item
                            self._finished(item)
                        streamed = True
                        yield item
                    break
                except EngineCrashedError:
                    if streamed or not self._may_retry():
                        raise
                    await self.stream.finished.wait()  # its lease is given back: the dead engine is dropped
                    await self._open_stream()
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


async def chat_engine_request(gen: Generation, prompting: ModelPrompting, messages: list[Message],
                              tools: list[Tool], options: Options, *, truncate: bool, shift: bool,
                              logprobs: bool, top_logprobs: int,
                              format: Any = None, think: Think = None) -> Callable[[Lease], Awaitable[EngineRequest]]:
    """The `build` step of a chat: render with Ollama's truncation (oldest messages dropped until the
    prompt fits num_ctx), which needs the loaded engine's tokenizer."""

    async def build(lease: Lease) -> EngineRequest:
        num_ctx = options.effective_num_ctx(lease.runner.spec.num_ctx)

        def fits(text: str) -> bool:
            return len(lease.engine.tokenize(text, prompting.add_bos_for(text))) < num_ctx

        def render() -> RenderedChat:
            try:
                return prompting.chat_render(messages, tools, fits if truncate else None, think)
            except PromptError as e:
                raise ApiError(e.status, str(e)) from None

        rendered = await anyio.to_thread.run_sync(render)
        prompt = rendered.text
        return EngineRequest(prompt=prompt, options=options, add_bos=prompting.add_bos_for(prompt),
                             images=[image_bytes(i) for i in rendered.images],
                             logprobs=logprobs or top_logprobs > 0, top_logprobs=top_logprobs,
                             shift=shift, truncate=truncate,
                             format=format, think_first=format is not None and thinking_on(think))

    return build


def image_bytes(image: bytes | str) -> bytes:
    """A message's image as the engine takes it (/api/chat sends base64, which its route has checked)."""
    return image if isinstance(image, bytes) else base64.b64decode(image)


def _no_check(prompting: ModelPrompting) -> None:
    pass


@dataclass
class ChatInputs:
    """A chat request once its route has decoded its own shape (/api/chat, /v1/chat/completions, /v1/responses,
    /v1/messages): what `open_chat` prepares the same way for all four.

    `format`, `tools`, `options` and `check` are called only when `open_chat` reaches them, after the model is
    found: the errors a route's own fields raise there keep their place among the model's checks (a missing
    model's 404 first), in the order each route has always answered a request with several faults."""

    endpoint: str
    name: str  # the model as the request names it: the errors and the answer echo it
    messages: list[Message]
    think: Any  # as asked, before the model says whether it can think
    keep_alive: Any  # as sent
    format: Callable[[], Any]
    tools: Callable[[], list[Any]]  # in the chat shape `decode_tools` reads
    options: Callable[[], dict[str, Any] | None]
    images: bool = False  # the request carries images: refused unless the model has a projector
    images_param: str | None = None  # the field OpenAI's error `param` blames an image on
    # the route's own checks against the model, which have always come after the images'
    check: Callable[[ModelPrompting], None] = _no_check
    truncate: bool = True
    shift: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    count_prompt: bool = False  # the rendered prompt's tokens, for an answer that reports them before generating
    # Ollama's /api/chat alone: no messages loads the model (keep_alive 0 unloads it) instead of rendering an
    # empty conversation, and `_debug_render_only` answers the prompt without loading anything.
    empty_loads: bool = False
    render_only: bool = False


@dataclass
class Chat:
    """A chat prepared: the model's prompting and the checked tools and think the reply is read with, and the
    generation, leased and rendered (`gen`), unless /api/chat's own cases answered without one."""

    prompting: ModelPrompting
    tools: list[Tool]
    think: Think
    opened: Generation | None = None
    prompt_tokens: int = 0  # with `count_prompt`
    done_reason: str = ""  # "load" or "unload": /api/chat without messages, nothing generated
    rendered: str | None = None  # with `render_only`: the prompt

    @property
    def gen(self) -> Generation:
        assert self.opened is not None, "no generation: an /api/chat answer without one"
        return self.opened

    def splitter(self) -> ReplySplitter:
        return ReplySplitter.for_request(self.prompting, self.gen.prompt, self.tools, self.think)


async def open_chat(request: Request, inputs: ChatInputs, t0_ns: int) -> Chat:
    """A chat request checked against its model, then its generation leased and rendered: all before any
    answer begins, so that a model that cannot load is an HTTP error rather than a stream event."""
    ctx = ctx_of(request)
    model = await anyio.to_thread.run_sync(stored_model, ctx, inputs.name)
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    fmt = check_format(inputs.format())
    think = check_think(inputs.name, inputs.think, prompting.supports_thinking)
    tools = decode_tools(inputs.name, inputs.tools(), prompting.supports_tools)
    if inputs.images and not prompting.supports_vision:
        raise ApiError(400, f'"{inputs.name}" does not support vision', inputs.images_param)
    inputs.check(prompting)
    keep_alive = parse_keep_alive(ctx, inputs.keep_alive)
    out = Chat(prompting, tools, think)
    load_only = inputs.empty_loads and not inputs.messages
    if load_only and inputs.keep_alive is not None and keep_alive == 0:
        # before the options are merged: an unload never fails on them
        await ctx.lifecycle.unload(model)
        out.done_reason = "unload"
        return out
    options = merged_options(model, inputs.options())
    messages = chat_messages(model, inputs.messages)

    if inputs.render_only:
        try:
            out.rendered = await anyio.to_thread.run_sync(lambda: prompting.chat_prompt(messages, tools, None, think))
        except PromptError as e:
            raise ApiError(e.status, str(e)) from None
        return out

    gen = Generation(ctx, request, inputs.endpoint, inputs.name, model, options, keep_alive, t0_ns)
    if load_only:
        await gen.load_only()
        out.done_reason = "load"
        return out
    build = await chat_engine_request(gen, prompting, messages, tools, options, truncate=inputs.truncate,
                                      shift=inputs.shift, logprobs=inputs.logprobs, top_logprobs=inputs.top_logprobs,
                                      format=fmt, think=think)

    async def build_and_count(lease: Lease) -> EngineRequest:
        # only the loaded model's tokenizer can count, and only the prompt as rendered (truncated or not)
        engine_req = await build(lease)
        ids = await anyio.to_thread.run_sync(lease.engine.tokenize, engine_req.prompt, engine_req.add_bos)
        out.prompt_tokens = len(ids)
        return engine_req

    await gen.open(build_and_count if inputs.count_prompt else build)
    out.opened = gen
    return out
