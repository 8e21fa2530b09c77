"""``LlamaCppRuntime``: a model served by llama.cpp's llama-server, driven by the engine process exactly as a
``ModelRuntime`` is.

The engine process keeps its role: the server talks to it over the same pipe, its watchdog and crash handling
apply unchanged, and this runtime stands where the native one would, forwarding each call to a llama-server it
started (engine.llamacpp.server) or one it attached to (``TANDEM_LLAMACPP_URL``). Faults map onto the engine
process's own, as for vLLM (engine.vllm.runtime): llama-server exiting ends this process (the server sees a crashed
engine and starts a new one for the next request); llama-server frozen turns ``healthy()`` false, which silences
the heartbeat so the watchdog replaces the engine; a cancelled stream closes its connection, which frees the slot.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator

from engine.contract.gguf import GGUFFile
from engine.contract.llamacpp_launch import LlamaCppLaunch, refusal
from engine.contract.protocol import (
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    ModelFacts,
    TokenChunk,
)
from engine.llamacpp.api import LlamaCppApi, LlamaCppUnavailableError
from engine.llamacpp.server import LlamaCppServer, speculative_type
from engine.llamacpp.translate import IMAGE_TAG, completion_body, logprobs_of, multimodal_prompt, speculation_stats
from engine.backend_process import HEALTH_TIMEOUT, BackendRuntime, CancelWatcher, HealthMonitor
from engine.parallel_slots import available_memory, resolve_num_parallel
from engine.remote_prompt import prompt_tokens

#: llama-server's --spec-type by the name tandem's statistics give its drafter
DRAFTER_OF_TYPE = {"none": "none", "draft-simple": "model", "draft-eagle3": "model", "draft-dflash": "model",
                   "ngram-simple": "ngram", "draft-mtp": "mtp"}
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash")
KV_BYTES = 2  # llama-server's default cache type, f16


class LlamaCppRuntime(BackendRuntime):
    name = "llamacpp"

    def __init__(self, spec: LoadSpec, launch: LlamaCppLaunch, api: LlamaCppApi, server: LlamaCppServer | None,
                 facts: ModelFacts):
        self.spec = spec
        self.launch = launch
        self.api = api
        self.server = server
        self.facts = facts
        self._drafter = DRAFTER_OF_TYPE[facts.speculative_method or "none"]  # the statistics' name for it
        self.monitor = HealthMonitor("llama-server", self.api.healthy, server.process if server is not None else None)
        self.cancels = CancelWatcher(self.name)
        # where an image goes in the prompt: llama-server's marker, random per server (None: it has no projector)
        props = api.props()
        vision = bool((props.get("modalities") or {}).get("vision"))
        self.media_marker: str | None = str(props["media_marker"]) if vision and props.get("media_marker") else None

    @classmethod
    def load(cls, spec: LoadSpec, timeout: float | None = None) -> "LlamaCppRuntime":
        launch = spec.llamacpp or LlamaCppLaunch()
        slot_bytes = cache_bytes(spec.model_path, spec.num_ctx)
        slots = resolve_num_parallel(spec.num_parallel, slot_bytes, available_memory())  # as the native engine
        server = None
        if launch.attached:
            api = LlamaCppApi(str(launch.url))
            if not api.healthy(HEALTH_TIMEOUT):
                raise EngineError(f"could not reach llama-server at TANDEM_LLAMACPP_URL={launch.url}", 500)
        else:
            server = LlamaCppServer(launch, spec, slots=slots)
            try:
                server.wait_ready(timeout)
            except BaseException:
                server.stop()
                raise
            api = server.api
        return cls(spec, launch, api, server, _facts(spec, launch, api, slots, slot_bytes))

    # -- the runtime's interface (engine.process.worker; the rest is BackendRuntime's) -----------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        # None: llama.cpp adds what the model's vocabulary says (its own add_bos rule, per vocabulary type)
        return self.api.tokenize(text, add_special=add_bos is not False)

    def generate(self, req: GenerateRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        why = refusal(req.options)
        if why is not None:
            raise EngineError(why, 400)
        num_ctx = req.options.effective_num_ctx(self.facts.context_length)
        if req.images:
            prompt = self._text_tokens(req)
            sent: list[int] | dict = multimodal_prompt(self._image_text(req), req.images, self.media_marker)
        else:
            prompt = sent = prompt_tokens(req, num_ctx, self.facts.vocab_size, self.tokenize)
        n_predict = max(1, num_ctx - len(prompt))
        if req.options.num_predict > 0:
            n_predict = min(n_predict, req.options.num_predict)
        stream = self.api.stream_completion(completion_body(req, sent, n_predict,
                                                            draft_n_max=self.launch.draft_n_max))
        should_stop = should_stop or (lambda: False)
        unwatch = self.cancels.watch(stream, should_stop)
        started = time.monotonic_ns()
        first = last = 0
        generated: list[int] = []
        final: dict = {}
        try:
            for event in stream:
                self.monitor.answered()
                ids = [int(t) for t in event.get("tokens") or []]
                text = event.get("content") or ""
                if ids or text:
                    last = time.monotonic_ns()
                    first = first or last
                    generated += ids
                    yield TokenChunk(text, ids, logprobs_of(event) if req.logprobs else None)
                if event.get("stop"):
                    final = event
                    break
        finally:
            unwatch()
            stream.close()
        if not final:
            if should_stop():
                return  # cancelled: the consumer stopped listening
            raise LlamaCppUnavailableError("llama-server ended the stream without its final event")
        timings = final.get("timings") or {}
        first = first or time.monotonic_ns()
        count = int(timings.get("predicted_n") or len(generated))
        evaluated = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
        yield GenerateResult(
            done_reason="length" if final.get("stop_type") == "limit" else "stop",
            prompt_eval_count=evaluated if req.images else len(prompt),  # with images: their tokens too
            prompt_cached=int(timings.get("cache_n") or 0),
            prompt_eval_duration_ns=int(float(timings.get("prompt_ms") or 0) * 1e6) or first - started,
            eval_count=count,
            eval_duration_ns=int(float(timings.get("predicted_ms") or 0) * 1e6) or max(0, (last or first) - first),
            context=prompt + generated,
            speculation=speculation_stats(timings, self._drafter if _speculates(req) else "none", count),
        )

    def _image_text(self, req: GenerateRequest) -> str:
        """The prompt text sent beside images: llama-server tokenizes it and adds BOS by the vocabulary's rule, so a
        BOS the template already wrote is taken off (as the token path adds none then)."""
        if req.raw_tokens:
            raise EngineError("context together with images is not supported by the llamacpp engine; send the "
                              "conversation as messages instead", 400)
        if self.media_marker is None:
            raise EngineError(f"{self.facts.architecture} model does not support image input", 400)
        bos = self.facts.bos_token
        if req.add_bos is False and self.facts.add_bos and bos and req.prompt.startswith(bos):
            return req.prompt[len(bos):]
        return req.prompt

    def _text_tokens(self, req: GenerateRequest) -> list[int]:
        """The prompt's text tokens without its images (what ``context`` carries back for an image prompt)."""
        return self.tokenize(IMAGE_TAG.sub("", req.prompt), req.add_bos)


def _speculates(req: GenerateRequest) -> bool:
    return req.options.drafter != "none" and req.options.draft_num_predict > 0


def cache_bytes(model_path: str, num_ctx: int) -> int:
    """What one slot's KV cache of ``num_ctx`` positions costs llama-server (f16 keys and values in every layer;
    a sliding-window layer's smaller cache is not counted: an upper bound, as a budget should be)."""
    with GGUFFile(model_path) as f:
        md, arch = f.metadata, f.architecture
    layers = int(md.get(f"{arch}.block_count") or 0)
    heads = md.get(f"{arch}.attention.head_count") or 1
    heads = max(heads) if hasattr(heads, "__len__") else heads
    kv_heads = md.get(f"{arch}.attention.head_count_kv", heads)
    kv_per_layer = list(kv_heads) if hasattr(kv_heads, "__len__") else [kv_heads] * layers
    width = int(md.get(f"{arch}.embedding_length") or 0)
    k = int(md.get(f"{arch}.attention.key_length") or (width // max(int(heads), 1)))
    v = int(md.get(f"{arch}.attention.value_length") or k)
    return int(sum(int(n) for n in kv_per_layer) * (k + v) * num_ctx * KV_BYTES)


def _facts(spec: LoadSpec, launch: LlamaCppLaunch, api: LlamaCppApi, slots: int, slot_bytes: int) -> ModelFacts:
    """What the server needs to know, from the GGUF's metadata (the server's tokenizer and template stay its own)."""
    with GGUFFile(spec.model_path) as f:
        md, architecture = f.metadata, f.architecture
    tokens = md.get("tokenizer.ggml.tokens") or []
    name = lambda key: str(tokens[int(md[key])]) if key in md and int(md[key]) < len(tokens) else ""  # noqa: E731
    kind = "none" if launch.attached else speculative_type(launch, spec)
    draft = None
    if kind in DRAFT_MODEL_TYPES:
        with GGUFFile(str(spec.draft_path)) as d:
            draft = d.architecture
    weights = os.path.getsize(spec.model_path) + (os.path.getsize(spec.draft_path) if draft else 0)
    weights += slots * slot_bytes  # what /api/ps reports: the caches too, as for the native engine
    device = "remote" if launch.attached else ("gpu" if launch.n_gpu_layers > 0 else "cpu")
    return ModelFacts(architecture=architecture, context_length=spec.num_ctx, vocab_size=len(tokens), device=device,
                      weight_format="llama.cpp", draft_architecture=draft, draft_weight_format=None,
                      memory_bytes=weights, bos_token=name("tokenizer.ggml.bos_token_id"),
                      eos_token=name("tokenizer.ggml.eos_token_id"),
                      add_bos=len(api.tokenize("a", True)) > len(api.tokenize("a", False)), num_parallel=slots,
                      backend="llamacpp", speculative_method=None if kind == "none" else kind,
                      endpoint=api.base_url, attached=launch.attached)
