"""``ModelRuntime``: one loaded model (target + drafters) serving requests, as ``engine.process.worker`` drives it.

    engine = ModelRuntime.load(LoadSpec(model_path=..., draft_path=...))
    engine.facts; engine.tokenize(text, add_bos=None); engine.detokenize(ids)
    for item in engine.generate(GenerateRequest(...), should_stop=event.is_set): ...  # chunks, result
    engine.embed(EmbedRequest(inputs=[...]))  # an embedding model (bert): one pooled vector per input

Everything that belongs to the loaded model is built once (``engine.load``), not per request (the
seed's lesson): the target and its KV cache, every drafter with its own state (draft model + KV cache,
MTP head + KV cache, n-gram index); the adaptive depth controllers live here, and their learned
acceptance and per-depth cost persist across requests. A request only plans its speculation,
tokenizes, and runs ``engine.speculative.loop.DecodeLoop`` over those long-lived objects.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Callable, Iterator

import torch

from engine.batching.compute import ComputeThread
from engine.batching.policy import PROMPT_CHUNK_ROWS
from engine.batching.step_loop import BatchedModel, StepLoop
from engine.batching.step_trace import StepTrace
from engine.batching.slots import SequenceSlot, SlotPool
from engine.cache.kv import KVCache
from engine.load import LoadedParts, load_parts
from engine.ops.memory import prefault_writable
from engine.contract.protocol import (
    ContextLengthError,
    EmbedRequest,
    EmbedResult,
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    TokenChunk,
)
from engine.sampling.constrain import ReasoningFirst, TokenConstraint, TokenPieces
from engine.sampling.sampler import SamplingOptions, make_generator
from engine.speculative.copy_first import CopyFirstDrafter
from engine.speculative.suffix import SuffixDrafter
from engine.speculative.suffix_cache import SuffixCache
from engine.speculative.depth import (AdaptiveDepth, DepthController, DraftingPeers, FixedDepth, PerSourceDepth,
                                      RecentTimes, WidthCosts)
from engine.speculative.draft_model import DraftModelDrafter
from engine.speculative.drafter import Drafter, NullDrafter
from engine.speculative.loop import (
    DecodeLoop,
    DecodeSettings,
    TimeBreakdown,
    trace_from_env,
)
from engine.contract.streaming import QueueSink, Sink, fail_at_start
from engine.contract.speculation_plan import SpeculationPlan, plan_speculation
from engine.contract.json_grammar import SchemaError, compile_format


#: Open-ended generation stops after this many contexts' worth of tokens (Ollama's runner rule).
OPEN_ENDED_CONTEXTS = 10


def generation_limit(num_predict: int, num_ctx: int) -> int:
    """The ``num_predict`` the decode loop runs with: Ollama caps any negative or larger value at
    10 x num_ctx ("only allow maximum 10 context shifts"), so -1 and a huge limit cannot generate
    forever. -2 ("until the context is full") is kept: it never shifts, so it ends within num_ctx."""
    cap = OPEN_ENDED_CONTEXTS * num_ctx
    if num_predict == -2:
        return num_predict
    if num_predict < 0 or num_predict > cap:
        return cap
    return num_predict


#: An embedding batch holds at most this many padded token positions (sequences x longest).
EMBED_BATCH_TOKENS = 8192


def _embed_batches(order: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """Indices in ``order`` (shortest first) grouped so that no batch pads past EMBED_BATCH_TOKENS."""
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > EMBED_BATCH_TOKENS:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


class ModelRuntime:
    def __init__(self, parts: LoadedParts):
        # The thread every forward and the load run on (engine.batching.compute: one OpenMP team per process)
        self.compute = ComputeThread.shared()
        self.spec = parts.spec
        self.target = parts.target
        self.gguf = parts.gguf
        self.tokenizer = parts.tokenizer
        self.cache = parts.cache
        self.drafters = parts.drafters
        self.facts = parts.facts
        self.draft_kind = parts.draft_kind  # what the DRAFT layer became: "model", "mtp" (a head) or None
        # What this model generated in this process, for the suffix drafter (draft_suffix); gone with the model.
        self.outputs = SuffixCache(parts.spec.suffix_tokens)
        self.owned_files = parts.owned_files
        # What a verification of each width costs on this target, shared by all of them (AdaptiveDepth.verify_times).
        self._verify_times = WidthCosts()
        # What a draft model's catch-up costs a token, per controller key, shared by every slot (AdaptiveDepth.catchup_times).
        self._catchup_times: dict[str, RecentTimes] = {}
        # Sequences served at once (engine.batching): one slot each; slot 0 holds the load's own cache and
        # drafters. Every generation runs as a sequence of the step loop, on the compute thread; with several slots
        # the loop batches their forwards and the batch prices the widths (alone, the controller prices its own).
        self.batch_loop = StepLoop(run_batch=self._run_batch,
                                   on_step=self._verify_times.add if parts.num_parallel > 1 else None,
                                   trace=StepTrace.opened(parts.spec.step_trace_dir))
        slots = [SequenceSlot(0, parts.cache, parts.drafters)] if parts.cache is not None else []
        if parts.num_parallel > 1 and parts.cache is not None:
            for i in range(1, parts.num_parallel):
                cache = self.target.new_cache(parts.cache.capacity)
                slots.append(SequenceSlot(i, cache, {k: d.fork(cache) for k, d in parts.drafters.items()}))
        for slot in slots:
            for d in slot.drafters.values():
                if isinstance(d, DraftModelDrafter):
                    d.model = BatchedModel(d.model, self.batch_loop, draft=True)
                    # several sequences: its prompt waits for its first proposal, to share that step
                    d.lazy_prompt = parts.num_parallel > 1
        self.slots = SlotPool(slots) if slots else None
        self._queued: deque[Callable[[], None]] = deque()  # requests waiting for a slot (on the compute thread)
        self._model_peers = DraftingPeers()  # sequences in flight drafting from the draft model (AdaptiveDepth.peers)
        # Learned per drafter kind, kept for the lifetime of the loaded model (slot 0's; each slot has its own).
        self.controllers: dict[str, AdaptiveDepth] = slots[0].controllers if slots else {}
        self.clock: Callable[[], float] | None = None  # tests may inject a clock
        self.last_breakdown: TimeBreakdown | None = None
        self.pieces: TokenPieces | None = None  # token texts for constrained decoding, built lazily
        # Every slot's caches made resident now, off the compute thread: a slot's first token would otherwise
        # fault its whole cache in inside a forward that every sequence in flight waits on (prefault_writable).
        self.prefault = threading.Thread(target=prefault_writable, args=(self._cache_buffers(slots),),
                                         name="kv-prefault", daemon=True)
        self.prefault.start()

    @staticmethod
    def _cache_buffers(slots: list[SequenceSlot]) -> list[torch.Tensor]:
        """What a first token makes resident of every slot's cache and of its drafters' own caches (a draft
        model's, an MTP head's), slot by slot: the order the pool hands slots out in at first."""
        out: list[torch.Tensor] = []
        for slot in slots:
            caches = [slot.cache] + [getattr(d, "cache", None) for d in slot.drafters.values()]
            for cache in caches:
                if isinstance(cache, KVCache):
                    out += cache.first_write_views()
        return out

    def _run_batch(self, model, calls: list) -> list:
        """A step's batched forward, on the compute thread (where the step loop runs it)."""
        return self.compute.run(lambda: model.forward_batch(calls))

    @classmethod
    def load(cls, spec: LoadSpec) -> "ModelRuntime":
        compute = ComputeThread.shared()
        compute.set_threads(spec.num_thread if spec.num_thread > 0 else torch.get_num_threads())
        return cls(compute.run(lambda: load_parts(spec)))

    @property
    def num_parallel(self) -> int:
        return len(self.slots) if self.slots is not None else 1

    def _models(self) -> list:
        """The target and every draft model: what holds a GGUF mapping."""
        return [self.target] + [getattr(d.model, "unbatched", d.model) for d in self.drafters.values()
                                if isinstance(d, DraftModelDrafter)]

    def _files(self) -> list:
        files = [m.gguf for m in self._models() if getattr(m, "gguf", None) is not None] + list(self.owned_files)
        return list({id(f): f for f in files}.values())

    def finish_writes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the packed-weight caches this load is still writing in the
        background; True when none is left (an exit that killed one would lose it for the next load)."""
        deadline = time.monotonic() + timeout
        return all(f.packs is None or f.packs.wait(max(0.0, deadline - time.monotonic()))
                   for f in self._files())

    def healthy(self) -> bool:
        """Always: the native engine is this process, which the server's own pings and watchdog watch."""
        return True

    def close(self) -> None:
        """Release the GGUF mappings (unload). The engine cannot generate afterwards."""
        for m in self._models():
            if hasattr(m, "close"):
                m.close()
            elif getattr(m, "gguf", None) is not None:
                m.gguf.close()
        for f in self.owned_files:
            f.close()
        if self.batch_loop.trace is not None:
            self.batch_loop.trace.close()

    # ------------------------------------------------------------------------------------------
    # text
    # ------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # ------------------------------------------------------------------------------------------
    # embeddings (an encoder model)
    # ------------------------------------------------------------------------------------------
    def embed(self, req: EmbedRequest) -> EmbedResult:
        return self.compute.run(lambda: self._embed(req))

    def _embed(self, req: EmbedRequest) -> EmbedResult:
        """Each input's pooled vector, as the model's pooling type says. Inputs are tokenized as Ollama
        does: the text's tokens cut to ``num_ctx`` minus the two special tokens (or refused when
        ``truncate`` is off), then wrapped in [CLS] ... [SEP]; they run in batches of similar length."""
        if self.facts.pooling is None:
            raise EngineError("this model does not support embeddings", 501)
        t0 = time.perf_counter_ns()
        num_ctx = self.facts.context_length
        if req.num_ctx > 0:
            num_ctx = min(num_ctx, req.num_ctx)
        room = num_ctx - 2  # [CLS] and [SEP]
        if room <= 0:
            raise EngineError("input after truncation exceeds maximum context length", 400)
        tok = self.tokenizer
        seqs = []
        for text in req.inputs:
            ids = tok.encode(text, add_bos=False)
            if len(ids) > room:
                if not req.truncate:
                    raise ContextLengthError("the input length exceeds the context length")
                ids = ids[:room]
            seqs.append([tok.bos_id, *ids, tok.sep_id])
        vectors: list[list[float] | None] = [None] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for batch in _embed_batches(order, [len(s) for s in seqs]):
            pooled = self.target.embed([seqs[i] for i in batch]).float().cpu()
            for i, v in zip(batch, pooled):
                vectors[i] = v.tolist()
        return EmbedResult(embeddings=vectors, token_counts=[len(s) for s in seqs],
                           duration_ns=time.perf_counter_ns() - t0)

    # ------------------------------------------------------------------------------------------
    # speculation settings
    # ------------------------------------------------------------------------------------------
    def plan(self, req: GenerateRequest) -> SpeculationPlan:
        """The request's speculation, decided by the one rule with what this engine loaded."""
        return plan_speculation(req.options, has_draft_layer=self.draft_kind is not None,
                                draft_layer="mtp" if self.draft_kind == "mtp" else "model",
                                has_mtp_head="mtp" in self.drafters)

    def resolve_drafter(self, plan: SpeculationPlan, drafters: dict[str, Drafter] | None = None) -> tuple[Drafter, int]:
        """(drafter, depth cap) for a plan; cap 0 means plain decoding. The plan chose the drafter;
        this only checks that the model has it (an explicit ``model``/``mtp`` it lacks is a 400)."""
        drafters = self.drafters if drafters is None else drafters
        kind = plan.drafter
        if kind == "model" and self.draft_kind == "mtp":
            kind = "mtp"  # the DRAFT layer is an MTP head: asking for the DRAFT drafter gets the head
        if kind == "model" and "model" not in drafters:
            raise EngineError("drafter 'model' was requested but this model has no draft model (DRAFT)", 400)
        if kind == "mtp" and "mtp" not in drafters:
            raise EngineError("drafter 'mtp' was requested but this model has no MTP (NextN) head", 400)
        if kind == "none":
            return NullDrafter(), 0
        if kind == "suffix":
            return SuffixDrafter(self.outputs, drafters["ngram"]), plan.cap
        if plan.copy:  # the plan has copy rounds only for a draft model or MTP head
            deeper = plan.suffix_cap > plan.cap  # the outputs' rounds may go deeper than the model's (0 without them)
            return CopyFirstDrafter(drafters[kind], drafters["ngram"], outputs=self.outputs if plan.suffix else None,
                                    model_cap=plan.cap if deeper else None), max(plan.cap, plan.suffix_cap)
        return drafters[kind], plan.cap

    def controller(self, drafter: Drafter, schedule: str, n_min: int,
                   controllers: dict[str, AdaptiveDepth] | None = None) -> DepthController:
        """``controllers``: the slot's learned controllers (slot 0's by default)."""
        if schedule == "fixed":
            return FixedDepth(n_min=n_min)
        kept = self.controllers if controllers is None else controllers
        if drafter.sources:  # a drafter that picks its source per round: each source priced on its own
            return PerSourceDepth({src: self._adaptive(kept, f"{drafter.kind}/{src}", drafter)
                                   for src in drafter.sources},
                                  drafter.round_source, dict(drafter.fallbacks), drafter.use_source,
                                  dict(drafter.source_caps))
        return self._adaptive(kept, drafter.kind, drafter)

    def _adaptive(self, kept: dict[str, AdaptiveDepth], key: str, drafter: Drafter) -> AdaptiveDepth:
        """The adaptive controller kept for ``key`` across requests (what it learned carries over), pricing the
        catch-ups of this request's ``drafter``."""
        model = key.split("/")[-1] == "model"  # the draft model's own rounds (a source of a copy-first drafter too)
        if key not in kept:
            batched = self.num_parallel > 1
            load = (lambda: self.batch_loop.active) if batched else None
            # the draft model's rounds share their draft steps with the other slots'
            peers = self._model_peers if batched and model else None
            kept[key] = AdaptiveDepth(verify_times=self._verify_times, load=load, peers=peers,
                                      catchup_times=self._catchup_times.setdefault(key, RecentTimes()))
        # a slot's controller serves one request at a time: its drafter's backlog is this request's
        kept[key].backlog = drafter.backlog if model else None
        return kept[key]

    # ------------------------------------------------------------------------------------------
    # generate
    # ------------------------------------------------------------------------------------------
    def _prompt_tokens(self, req: GenerateRequest, num_ctx: int, num_keep: int) -> list[int]:
        prefix = [int(t) for t in (req.raw_tokens or [])]
        # `context` comes from the client: an id the embedding (or the detokenizer) has no row for is
        # a client error, not an index error deep in a forward pass.
        vocab = min(self.facts.vocab_size, self.tokenizer.vocab_size)
        bad = next((t for t in prefix if not 0 <= t < vocab), None)
        if bad is not None:
            raise EngineError(f"invalid context: token id {bad} is outside the vocabulary (0 to {vocab - 1})", 400)
        # A BOS belongs at the very start only: a `context` prefix already carries it.
        add_bos = req.add_bos if req.add_bos is not None else (None if not prefix else False)
        tokens = prefix + (self.tokenizer.encode(req.prompt, add_bos=add_bos) if req.prompt or not prefix else [])
        if len(tokens) > num_ctx:
            if not req.truncate:
                raise ContextLengthError("the input length exceeds the context length")
            # Ollama: keep the first num_keep tokens and the end, num_ctx in all.
            keep = min(num_keep, num_ctx - 1)
            tokens = tokens[:keep] + tokens[len(tokens) - (num_ctx - keep):]
        return tokens

    def settings(self, req: GenerateRequest, plan: SpeculationPlan, cap: int, num_ctx: int,
                 num_keep: int) -> DecodeSettings:
        """The loop's settings: typed options and the plan, resolved against this request's context."""
        o = req.options
        eog = set(self.tokenizer.eot_ids)
        if self.tokenizer.eos_id is not None:
            eog.add(self.tokenizer.eos_id)
        return DecodeSettings(
            sampling=SamplingOptions.from_options(o, num_ctx),
            num_ctx=num_ctx,
            num_predict=generation_limit(o.num_predict, num_ctx),
            num_keep=num_keep,
            shift=req.shift,
            cap=cap,
            schedule=plan.schedule,
            p_min=plan.p_min,
            n_min=plan.n_min,
            relaxed_top_n=plan.relaxed_top_n,
            relaxed_scope=plan.relaxed_scope,
            relaxed_within=self.tokenizer.think_tags() if plan.relaxed_scope == "thinking" else None,
            rule=plan.rule,
            logprobs=bool(req.logprobs),
            top_logprobs=int(req.top_logprobs or 0) if req.logprobs else 0,
            trace=plan.trace or trace_from_env(),
            stops=o.stop,
            eog_ids=frozenset(eog),
            prefill_chunk=max(1, min(o.num_batch, PROMPT_CHUNK_ROWS)),
        )

    def generate(self, req: GenerateRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        """The request's chunks and result, read from its sequence (``stream``) as they come. Called on the compute
        thread itself (a benchmark that runs there), it steps the loop whenever it has nothing to read."""
        sink = QueueSink()
        self.stream(req, should_stop or (lambda: False), sink)
        return sink.items(pump=self.batch_loop.step if self.compute.here else None)

    def stream(self, req: GenerateRequest, should_stop: Callable[[], bool], sink: Sink) -> None:
        """Start the request as a sequence of the step loop (on the compute thread, sharing each forward with the
        other sequences in flight); its chunks, result or error go to ``sink`` from there. The prompt is tokenized
        here, in the caller's thread."""
        try:
            prompt, node, num_ctx, num_keep = self._prepare(req)
        except BaseException as e:  # noqa: BLE001 - the request's error, reported to its reader
            fail_at_start(sink, e)
            return
        if not prompt:
            sink.put(GenerateResult(done_reason="stop", prompt_eval_count=0, prompt_cached=0,
                                    prompt_eval_duration_ns=0, eval_count=0, eval_duration_ns=0, context=[]))
            sink.end()
            return
        start = lambda: self._start(req, prompt, node, num_ctx, num_keep, should_stop, sink)  # noqa: E731
        if self.compute.here:
            start()
        else:
            self.compute.post(start)

    def _prepare(self, req: GenerateRequest) -> tuple[list[int], object, int, int]:
        """(prompt tokens, compiled format or None, num_ctx, num_keep): what the request asks, checked."""
        if req.images:
            raise EngineError(f"{self.facts.architecture} model does not support image input", 400)
        num_ctx = req.options.effective_num_ctx(self.cache.capacity)
        num_keep = req.options.num_keep  # < 0: keep everything (the whole context, then the whole prompt)
        prompt = self._prompt_tokens(req, num_ctx, num_keep if num_keep >= 0 else num_ctx)
        try:
            node = compile_format(req.format)
        except SchemaError as e:
            raise EngineError(str(e), 400) from None
        if node is not None and self.pieces is None:
            self.pieces = TokenPieces(self.tokenizer)  # built once, here rather than in the step loop's thread
        return prompt, node, num_ctx, num_keep

    def _start(self, req: GenerateRequest, prompt: list[int], node, num_ctx: int, num_keep: int,
               should_stop: Callable[[], bool], sink: Sink) -> None:
        """On the compute thread, between two steps: the request takes a slot and its sequence joins the loop."""
        if not self.slots.free():
            # Every slot is busy (a request whose reader stopped ends at its next chunk; the server admits no more
            # requests than slots): this one starts when a sequence frees its slot (``_release``), in order.
            self._queued.append(lambda: self._start(req, prompt, node, num_ctx, num_keep, should_stop, sink))
            return
        slot = self.slots.acquire(prompt)
        try:
            loop = self._decode_loop(slot, req, prompt, node, num_ctx, num_keep)
        except BaseException as e:  # noqa: BLE001 - reported to the request's reader
            self._release(slot)
            fail_at_start(sink, e)
            return

        # its controllers that price the draft model's rounds beside other sequences' (AdaptiveDepth.peers)
        chosen = getattr(loop.controller, "controllers", {"": loop.controller}).values()
        model_controllers = [c for c in chosen if getattr(c, "peers", None) is not None]

        def sequence() -> None:
            released = False
            for c in model_controllers:
                self._model_peers.join(c)
            try:
                # a prefix another slot evaluated is copied, not evaluated again (no forward is in flight here)
                self.slots.share_prefix(slot, prompt)
                items = self._decode(slot, loop, prompt, should_stop)
                for item in items:
                    if isinstance(item, GenerateResult):  # the last item: the slot is free before the answer is out
                        self._release(slot)
                        released = True
                    sink.put(item)
                    if sink.closed:  # the reader has gone: end here, between two rounds
                        items.close()
                        break
            except BaseException as e:  # noqa: BLE001 - raised to the request's reader
                sink.fail(e)
            finally:
                for c in model_controllers:
                    self._model_peers.leave(c)
                if not released:
                    self._release(slot)
                sink.end()

        self.batch_loop.start(sequence)
        self.compute.step_while_busy(self.batch_loop)

    def _release(self, slot: SequenceSlot) -> None:
        """On the compute thread: ``slot`` is free; the first request waiting for one starts."""
        self.slots.release(slot)
        if self._queued:
            self._queued.popleft()()

    def _decode_loop(self, slot: SequenceSlot, req: GenerateRequest, prompt: list[int], node, num_ctx: int,
                     num_keep: int) -> DecodeLoop:
        """The request's decode loop over ``slot``'s cache and drafters, its target the step loop's."""
        plan = self.plan(req)
        drafter, cap = self.resolve_drafter(plan, slot.drafters)
        s = self.settings(req, plan, cap, num_ctx, num_keep if num_keep >= 0 else len(prompt))
        constraint = None
        if node is not None:  # self.pieces: built by _prepare
            tags = self.tokenizer.think_tags() if req.think_first else None
            if tags is None:
                constraint = TokenConstraint(node, self.pieces, s.eog_ids)
            else:
                constraint = ReasoningFirst(node, self.pieces, s.eog_ids, tags.open_id, tags.close_id,
                                            inside=tags.inside_after(prompt, False))
        controller = self.controller(drafter, s.schedule, s.n_min, slot.controllers) if cap > 0 else FixedDepth()

        seed = req.options.seed
        if seed < 0:  # one random seed for both streams, so a request is internally consistent
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        return DecodeLoop(target=BatchedModel(self.target, self.batch_loop, draft=False), cache=slot.cache,
                          tokenizer=self.tokenizer, drafter=drafter, controller=controller, settings=s,
                          target_gen=make_generator(seed), draft_gen=make_generator(seed, stream=1),
                          constraint=constraint, **({"clock": self.clock} if self.clock is not None else {}))

    def _decode(self, slot: SequenceSlot, loop: DecodeLoop, prompt: list[int],
                should_stop: Callable[[], bool]) -> Iterator[TokenChunk | GenerateResult]:
        """The decode loop's chunks, then its result (run in the request's sequence)."""
        try:
            result = yield from loop.run(prompt, should_stop)
            if not should_stop():  # a cancelled request's text is not what the model would have ended with
                self.outputs.add(prompt, loop.generated)
        except GeneratorExit:
            # The consumer closed the stream: every round was recorded before it was streamed, so
            # the log and the caches already agree; nothing to undo.
            raise
        except BaseException:
            # An error mid-round may leave a drafter's speculative state in doubt; the target's
            # cache records its own tokens, so its prefix reuse stays safe.
            for d in slot.drafters.values():
                d.reset()
            raise
        finally:
            self.last_breakdown = loop.times
        yield result
