"""``VllmRuntime``: a model served by vLLM, driven by the engine process exactly as a ``ModelRuntime`` is.

The engine process (engine.process.worker) keeps its role: the server talks to it over the same pipe, its
watchdog and crash handling apply unchanged, and this runtime stands where the native one would, forwarding each
call to a vLLM server it started (engine.vllm.server) or one it attached to (``TANDEM_VLLM_URL``).

Faults map onto the engine process's own, so that the server's supervision replaces a broken vLLM as it replaces
a broken native engine:

* vLLM exits (crash, killed): the monitor thread ends this process, after the requests in flight got their error;
  the server sees a crashed engine, and the next request starts a new one (and a new vLLM).
* vLLM stops answering (frozen): ``healthy()`` turns false once its /health has failed for ``HEALTH_GRACE``
  seconds; the worker's heartbeat stops and its health answer fails, so the server's watchdog kills this process
  (and the reaper, vLLM's whole tree), as for a frozen native engine.
* A cancelled request closes its stream; vLLM aborts a request whose client went away.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from engine.contract.gguf import GGUFFile
from engine.text.tokenizer import Tokenizer
from engine.contract.protocol import (
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    ModelFacts,
    TokenChunk,
)
from engine.backend_process import BackendRuntime, CancelWatcher, HealthMonitor
from engine.remote_prompt import prompt_tokens
from engine.vllm.api import VllmApi, VllmUnavailableError
from engine.contract.vllm_launch import VllmLaunch
from engine.vllm.server import VllmServer
from engine.vllm.translate import completion_body, logprobs_of, refusal, speculation_stats

AUTO_PARALLEL = 16  # sequences vLLM batches when TANDEM_NUM_PARALLEL does not say


class VllmRuntime(BackendRuntime):
    name = "vllm"

    def __init__(self, spec: LoadSpec, launch: VllmLaunch, api: VllmApi, server: VllmServer | None,
                 facts: ModelFacts, method: str | None):
        self.spec = spec
        self.launch = launch
        self.api = api
        self.server = server
        self.facts = facts
        self.method = method  # vLLM's speculative method, None without speculation
        self.monitor = HealthMonitor("vLLM", self.api.healthy, server.process if server is not None else None)
        self.cancels = CancelWatcher(self.name)

    @classmethod
    def load(cls, spec: LoadSpec, timeout: float | None = None) -> "VllmRuntime":
        launch = spec.vllm or VllmLaunch()
        slots = spec.num_parallel if spec.num_parallel > 0 else AUTO_PARALLEL
        server = None
        if launch.attached:
            api = VllmApi(launch.url)
            try:
                models = api.models()
            except VllmUnavailableError:
                raise EngineError(f"could not reach vLLM at TANDEM_VLLM_URL={launch.url}", 500) from None
            name = launch.served_model or (models[0] if models else "")
            if name not in models:
                raise EngineError(f"vLLM at {launch.url} does not serve model {name!r} (it serves "
                                  f"{', '.join(models) or 'none'})", 500)
            api.model = name
            device, method = "remote", launch.drafter if launch.drafter != "none" else None
        else:
            server = VllmServer(launch, num_ctx=spec.num_ctx, num_parallel=slots)
            try:
                server.wait_ready(timeout)
            except BaseException:
                server.stop()
                raise
            api, device = server.api, server.device()
            method = server.speculative["method"] if server.speculative else None
        facts = _facts(spec, launch, api.base_url, device, slots, method)
        return cls(spec, launch, api, server, facts, method)

    # -- the runtime's interface (engine.process.worker; the rest is BackendRuntime's) -----------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.api.tokenize(text, add_special_tokens=add_bos is not False)

    def generate(self, req: GenerateRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        if req.images:
            raise EngineError(f"{self.facts.architecture} model does not support image input", 400)
        why = refusal(req.options, self.launch)
        if why is not None:
            raise EngineError(why, 400)
        num_ctx = req.options.effective_num_ctx(self.facts.context_length)
        prompt = prompt_tokens(req, num_ctx, self.facts.vocab_size, self.tokenize)
        max_tokens = num_ctx - len(prompt)
        if req.options.num_predict > 0:
            max_tokens = min(max_tokens, req.options.num_predict)
        body = completion_body(req, prompt, max_tokens)
        if os.environ.get("TANDEM_DEBUG"):
            print(f"tandem: vLLM request {json.dumps({**body, 'prompt': f'<{len(prompt)} tokens>'})}", file=sys.stderr,
                  flush=True)
        stream = self.api.stream_completion(body)
        should_stop = should_stop or (lambda: False)
        unwatch = self.cancels.watch(stream, should_stop)
        started = time.monotonic_ns()
        first = last = 0
        generated: list[int] = []
        finish, usage, metrics = None, {}, None
        try:
            for event in stream:
                self.monitor.answered()
                for choice in event.get("choices") or []:
                    ids = [int(t) for t in choice.get("token_ids") or []]
                    text = choice.get("text") or ""
                    if ids or text:
                        last = time.monotonic_ns()
                        first = first or last
                        generated += ids
                        yield TokenChunk(text, ids, logprobs_of(choice) if req.logprobs else None)
                    finish = choice.get("finish_reason") or finish
                if event.get("usage"):
                    usage, metrics = event["usage"], event.get("metrics")
        finally:
            unwatch()
            stream.close()
        first = first or time.monotonic_ns()
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) if usage else 0
        count = int(usage.get("completion_tokens") or len(generated)) if usage else len(generated)
        yield GenerateResult(
            done_reason="length" if finish == "length" else "stop",
            prompt_eval_count=len(prompt),
            prompt_cached=int(cached),
            prompt_eval_duration_ns=first - started,
            eval_count=count,
            eval_duration_ns=max(0, (last or first) - first),
            context=prompt + generated,
            speculation=speculation_stats(metrics, self.method, count),
        )


def _facts(spec: LoadSpec, launch: VllmLaunch, endpoint: str, device: str, slots: int,
           method: str | None) -> ModelFacts:
    """What the server needs to know: the model's tokens as the native engine reads them from the GGUF (the
    server's tokenizer and template stay its own), and the launch."""
    with GGUFFile(spec.model_path) as f:
        tokenizer, architecture = Tokenizer.from_gguf_metadata(f.metadata), f.architecture
    tokens = tokenizer.token_strings()
    name = lambda i: tokens[i] if i is not None else ""  # noqa: E731
    weights = sum(Path(p).stat().st_size for name_, p in launch.files if name_.endswith(".safetensors"))
    return ModelFacts(architecture=architecture, context_length=spec.num_ctx, vocab_size=len(tokens), device=device,
                      weight_format="vllm", draft_architecture=method, draft_weight_format=None,
                      memory_bytes=weights, bos_token=name(tokenizer.bos_id), eos_token=name(tokenizer.eos_id),
                      add_bos=bool(tokenizer.add_bos), num_parallel=slots, backend="vllm",
                      speculative_method=method, endpoint=endpoint, attached=launch.attached)
