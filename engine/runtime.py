"""``ModelRuntime``: one loaded model (target + drafters) serving requests, as ``engine.process.worker`` drives it.

    engine = ModelRuntime.load(LoadSpec(model_path=..., draft_path=...))
    engine.facts; engine.tokenize(text, add_bos=None); engine.detokenize(ids)
    for item in engine.generate(GenerateRequest(...), should_stop=event.is_set): ...  # chunks, result

Everything that belongs to the loaded model is built once here, not per request (the seed's
lesson): the target and its KV cache, every drafter with its own state (draft model + KV cache,
MTP head + KV cache, n-gram index), and the adaptive depth controllers, whose learned acceptance and
per-depth cost persist across requests. A request only resolves its options, tokenizes, and runs
``engine.speculative.loop.DecodeLoop`` over those long-lived objects.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator

import torch

from engine.capabilities import is_mtp_head_only
from engine.ops.memory import model_bytes
from engine.process.protocol import (
    ContextLengthError,
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    ModelFacts,
    TokenChunk,
)
from engine.sampling.constrain import TokenConstraint, TokenPieces
from engine.sampling.sampler import SamplingOptions, make_generator
from engine.speculative.depth import AdaptiveDepth, DepthController, FixedDepth
from engine.speculative.draft_model import DraftModelDrafter
from engine.speculative.drafter import Drafter, NullDrafter
from engine.speculative.loop import (
    DecodeLoop,
    DecodeSettings,
    TimeBreakdown,
    trace_from_env,
)
from engine.speculative.mtp import MtpDrafter
from engine.speculative.ngram import NgramDrafter
from engine.speculative.plan import SpeculationPlan, plan_speculation
from engine.text.json_grammar import SchemaError, compile_format


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError("CUDA was requested but is not available", 400)
    return torch.device(device)


def _vocab_check(target_tokens, draft_tokens, draft_path: str) -> None:
    """A drafter must speak the target's vocabulary: token i must be the same string in both."""
    if not target_tokens or not draft_tokens:
        raise EngineError(f"draft model {draft_path}: GGUF has no vocabulary to compare", 400)
    n = min(len(target_tokens), len(draft_tokens))
    for i in range(n):
        if target_tokens[i] != draft_tokens[i]:
            raise EngineError(
                f"draft model {draft_path} does not share the target's vocabulary (token {i} is "
                f"{draft_tokens[i]!r} in the draft, {target_tokens[i]!r} in the target)", 400)
    if abs(len(target_tokens) - len(draft_tokens)) > 128:
        raise EngineError(f"draft model {draft_path}: vocabulary of {len(draft_tokens)} tokens, the target "
                          f"has {len(target_tokens)}", 400)


def _mtp_head_drafter(target, df, spec: LoadSpec, device: torch.device, capacity: int) -> tuple[MtpDrafter, str]:
    """An MtpDrafter over a DRAFT file holding only an MTP head; the head must fit the target."""
    from engine.models.config import UnsupportedModelError
    from engine.models.loader import (
        default_format,
        find_nextn_block,
        load_nextn_head,
        nextn_hidden_size,
    )

    block = find_nextn_block(df.tensors)
    hidden = nextn_hidden_size(df, block)
    arch = df.metadata.get("general.architecture")
    problem = None
    if arch != target.config.arch:
        problem = f"MTP head architecture {arch} does not match the target's {target.config.arch}"
    elif hidden != target.config.n_embd:
        problem = f"MTP head hidden size {hidden} does not match the target's {target.config.n_embd}"
    if problem is not None:
        df.close()
        raise EngineError(f"draft model {spec.draft_path}: {problem}", 400)
    fmt = spec.draft_weight_format
    if fmt == "auto":
        fmt = default_format(df, device, role="drafter")
    try:
        return MtpDrafter(load_nextn_head(target, df, block, fmt), capacity), fmt
    except (UnsupportedModelError, KeyError) as e:
        df.close()
        raise EngineError(f"draft model {spec.draft_path}: MTP head: {e}", 400) from None


class ModelRuntime:
    def __init__(self, *, spec: LoadSpec, target, gguf, tokenizer, cache, drafters: dict[str, Drafter],
                 facts: ModelFacts, draft_kind: str | None = None, owned_files=()):
        self.spec = spec
        self.target = target
        self.gguf = gguf
        self.tokenizer = tokenizer
        self.cache = cache
        self.drafters = drafters
        self.facts = facts
        self.draft_kind = draft_kind  # what the DRAFT layer became: "model", "mtp" (a head) or None
        self.owned_files = list(owned_files)
        # Learned per drafter kind, kept for the lifetime of the loaded model.
        self.controllers: dict[str, AdaptiveDepth] = {}
        self.clock: Callable[[], float] | None = None  # tests may inject a clock
        self.last_breakdown: TimeBreakdown | None = None
        self.pieces: TokenPieces | None = None  # token texts for constrained decoding, built lazily

    # ------------------------------------------------------------------------------------------
    # load
    # ------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, spec: LoadSpec) -> "ModelRuntime":
        from engine.gguf import GGUFFile
        from engine.models.config import UnsupportedModelError
        from engine.models.loader import find_nextn_block, load_model, load_nextn_head
        from engine.text.tokenizer import Tokenizer, TokenizerError

        device = resolve_device(spec.device)
        try:
            f = GGUFFile(spec.model_path)
        except ValueError as e:
            raise EngineError(str(e), 400) from None
        try:
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
            target = load_model(f, spec.weight_format, device, role="target")
            fmt = target.fmt  # 'auto' resolved by the model loader (per role and file)
        except (UnsupportedModelError, TokenizerError) as e:
            f.close()
            raise EngineError(str(e), 400) from None
        num_ctx = int(spec.num_ctx) if spec.num_ctx and spec.num_ctx > 0 else target.config.context_length
        cache = target.new_cache(num_ctx)
        vocab = target.config.vocab_size

        drafters: dict[str, Drafter] = {"ngram": NgramDrafter()}
        draft_arch = draft_fmt = draft_kind = None
        owned = []  # GGUF mappings a drafter reads from, closed with the engine
        if spec.draft_path:
            df = GGUFFile(spec.draft_path)
            try:
                _vocab_check(f.metadata.get("tokenizer.ggml.tokens"), df.metadata.get("tokenizer.ggml.tokens"),
                             spec.draft_path)
            except EngineError:
                df.close()
                raise
            if is_mtp_head_only(df.tensors):
                # A DRAFT that is an MTP head drafts from the target's hidden states; it takes the
                # place of any head the target carries itself.
                drafters["mtp"], draft_fmt = _mtp_head_drafter(target, df, spec, device, num_ctx)
                owned.append(df)
                draft_arch, draft_kind = target.config.arch, "mtp"
            else:
                try:
                    draft = load_model(df, spec.draft_weight_format, device, role="drafter")
                except UnsupportedModelError as e:
                    raise EngineError(f"draft model: {e}", 400) from None
                draft_fmt = draft.fmt
                draft_arch = draft.config.arch
                drafters["model"] = DraftModelDrafter(draft, num_ctx, vocab)
                draft_kind = "model"
        nextn = find_nextn_block(f.tensors)
        if nextn is not None and "mtp" not in drafters:
            drafters["mtp"] = MtpDrafter(load_nextn_head(target, f, nextn, fmt), num_ctx)

        memory = model_bytes(target) + cache.nbytes() + sum(d.memory_bytes() for d in drafters.values())
        toks = tokenizer.token_strings()

        def name(i):
            return toks[i] if i is not None and 0 <= i < len(toks) else ""

        facts = ModelFacts(
            architecture=target.config.arch,
            context_length=num_ctx,
            vocab_size=vocab,
            device=str(device),
            weight_format=fmt,
            draft_architecture=draft_arch,
            draft_weight_format=draft_fmt,
            memory_bytes=int(memory),
            bos_token=name(tokenizer.bos_id),
            eos_token=name(tokenizer.eos_id),
            add_bos=bool(tokenizer.add_bos),
        )
        return cls(spec=spec, target=target, gguf=f, tokenizer=tokenizer, cache=cache, drafters=drafters,
                   facts=facts, draft_kind=draft_kind, owned_files=owned)

    def close(self) -> None:
        """Release the GGUF mappings (unload). The engine cannot generate afterwards."""
        models = [self.target] + [d.model for d in self.drafters.values() if isinstance(d, DraftModelDrafter)]
        for m in models:
            if hasattr(m, "close"):
                m.close()
            elif getattr(m, "gguf", None) is not None:
                m.gguf.close()
        for f in self.owned_files:
            f.close()

    # ------------------------------------------------------------------------------------------
    # text
    # ------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # ------------------------------------------------------------------------------------------
    # speculation settings
    # ------------------------------------------------------------------------------------------
    def plan(self, req: GenerateRequest) -> SpeculationPlan:
        """The request's speculation, decided by the one rule with what this engine loaded."""
        return plan_speculation(req.options, has_draft_layer=self.draft_kind is not None,
                                has_mtp_head="mtp" in self.drafters)

    def resolve_drafter(self, plan: SpeculationPlan) -> tuple[Drafter, int]:
        """(drafter, depth cap) for a plan; cap 0 means plain decoding. The plan chose the drafter;
        this only checks that the model has it (an explicit ``model``/``mtp`` it lacks is a 400)."""
        kind = plan.drafter
        if kind == "model" and self.draft_kind == "mtp":
            kind = "mtp"  # the DRAFT layer is an MTP head: asking for the DRAFT drafter gets the head
        if kind == "model" and "model" not in self.drafters:
            raise EngineError("drafter 'model' was requested but this model has no draft model (DRAFT)", 400)
        if kind == "mtp" and "mtp" not in self.drafters:
            raise EngineError("drafter 'mtp' was requested but this model has no MTP (NextN) head", 400)
        if kind == "none":
            return NullDrafter(), 0
        return self.drafters[kind], plan.cap

    def controller(self, kind: str, schedule: str, n_min: int) -> DepthController:
        if schedule == "fixed":
            return FixedDepth(n_min=n_min)
        if kind not in self.controllers:
            self.controllers[kind] = AdaptiveDepth()
        return self.controllers[kind]

    # ------------------------------------------------------------------------------------------
    # generate
    # ------------------------------------------------------------------------------------------
    def _prompt_tokens(self, req: GenerateRequest, num_ctx: int, num_keep: int) -> list[int]:
        prefix = [int(t) for t in (req.raw_tokens or [])]
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
            num_predict=o.num_predict,
            num_keep=num_keep,
            shift=req.shift,
            cap=cap,
            schedule=plan.schedule,
            p_min=plan.p_min,
            n_min=plan.n_min,
            relaxed_top_n=plan.relaxed_top_n,
            rule=plan.rule,
            logprobs=bool(req.logprobs),
            top_logprobs=int(req.top_logprobs or 0) if req.logprobs else 0,
            trace=plan.trace or trace_from_env(),
            stops=o.stop,
            eog_ids=frozenset(eog),
            prefill_chunk=max(1, o.num_batch),
        )

    def generate(self, req: GenerateRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        if req.images:
            raise EngineError(f"{self.facts.architecture} model does not support image input", 400)
        should_stop = should_stop or (lambda: False)
        num_ctx = min(req.options.num_ctx, self.cache.capacity)
        num_keep = req.options.num_keep  # < 0: keep everything (the whole context, then the whole prompt)
        prompt = self._prompt_tokens(req, num_ctx, num_keep if num_keep >= 0 else num_ctx)
        try:
            node = compile_format(req.format)
        except SchemaError as e:
            raise EngineError(str(e), 400) from None
        plan = self.plan(req)
        drafter, cap = self.resolve_drafter(plan)
        if node is not None:
            # Drafts are not constrained: verifying them would be correct but mostly wasted (any
            # draft that breaks the JSON is rejected), and only the plain step carries the filter.
            drafter, cap = NullDrafter(), 0
        s = self.settings(req, plan, cap, num_ctx, num_keep if num_keep >= 0 else len(prompt))
        constraint = None
        if node is not None:
            if self.pieces is None:
                self.pieces = TokenPieces(self.tokenizer)
            constraint = TokenConstraint(node, self.pieces, s.eog_ids)
        controller = self.controller(drafter.kind, s.schedule, s.n_min) if cap > 0 else FixedDepth()

        seed = req.options.seed
        if seed < 0:  # one random seed for both streams, so a request is internally consistent
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        loop = DecodeLoop(target=self.target, cache=self.cache, tokenizer=self.tokenizer, drafter=drafter,
                          controller=controller, settings=s, target_gen=make_generator(seed),
                          draft_gen=make_generator(seed, stream=1), constraint=constraint,
                          **({"clock": self.clock} if self.clock is not None else {}))
        if not prompt:
            yield GenerateResult(done_reason="stop", prompt_eval_count=0, prompt_cached=0,
                                 prompt_eval_duration_ns=0, eval_count=0, eval_duration_ns=0, context=[])
            return
        try:
            result = yield from loop.run(prompt, should_stop)
        except GeneratorExit:
            # The consumer closed the stream: every round was recorded before it was streamed, so
            # the log and the caches already agree; nothing to undo.
            raise
        except BaseException:
            # An error mid-round may leave a drafter's speculative state in doubt; the target's
            # cache records its own tokens, so its prefix reuse stays safe.
            for d in self.drafters.values():
                d.reset()
            raise
        finally:
            self.last_breakdown = loop.times
        yield result
