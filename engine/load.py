"""Building a loaded model from a ``LoadSpec``: the target, its KV cache, every drafter with its own
state, and the facts the server reports. ``engine.runtime.ModelRuntime`` serves requests over what this
builds; everything here happens once per load, never per request."""

from __future__ import annotations


from dataclasses import dataclass, field

import torch

from engine.cache.kv import KVCache
from engine.contract.capabilities import DRAFTER_ARCHITECTURES, EAGLE3, ENCODER_ARCHITECTURES, is_mtp_head_only
from engine.contract.gguf import GGUFFile
from engine.models.config import UnsupportedModelError
from engine.models.eagle3 import load_eagle3
from engine.models.encoder import Encoder
from engine.models.loader import (
    default_format,
    find_nextn_block,
    load_assistant,
    load_encoder,
    load_model,
    load_nextn_head,
    nextn_hidden_size,
)
from engine.models.pruned_head import prune_output_head
from engine.models.transformer import Model
from engine.ops.memory import model_bytes
from engine.parallel_slots import AUTO_PARALLEL, available_memory, resolve_num_parallel
from engine.contract.protocol import EngineError, LoadSpec, ModelFacts
from engine.speculative.assistant import AssistantDrafter
from engine.speculative.draft_model import DraftModelDrafter
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MtpDrafter
from engine.speculative.ngram import NgramDrafter
from engine.text.token_frequency import frequent_tokens, token_counts
from engine.text.tokenizer import Tokenizer, TokenizerError


@dataclass
class LoadedParts:
    """Everything a load builds, owned by the runtime until it closes."""

    spec: LoadSpec
    target: Model | Encoder  # an Encoder for an embedding model (which has no cache and no drafters)
    gguf: GGUFFile
    tokenizer: Tokenizer
    cache: KVCache | None
    drafters: dict[str, Drafter]
    facts: ModelFacts
    draft_kind: str | None = None  # what the DRAFT layer became: "model", "mtp" (a head) or None
    owned_files: list[GGUFFile] = field(default_factory=list)  # mappings a drafter reads from
    num_parallel: int = 1  # sequence slots to build (engine.runtime: one cache and drafter state each)


def resolve_device(device: str) -> torch.device:
    """The one place the engine asks torch about CUDA: ``cpu`` stays on the CPU whatever torch sees."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineError("a GPU was requested (num_gpu > 0) but CUDA is not available", 400)
        index = torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            raise EngineError(f"GPU {index} was requested (main_gpu) but this machine has "
                              f"{torch.cuda.device_count()}", 400)
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


def _load_drafter_arch(df, spec: LoadSpec, device: torch.device, what: str, load):
    """``load(fmt)`` of a drafter-only architecture in the DRAFT file ``df`` (``what`` names it in a refusal, which
    closes the file) and the weight format it was loaded in."""
    fmt = spec.draft_weight_format
    if fmt == "auto":
        fmt = default_format(df, device, role="drafter")
    try:
        return load(fmt), fmt
    except (UnsupportedModelError, KeyError) as e:
        df.close()
        raise EngineError(f"draft model {spec.draft_path}: {what}: {e}", 400) from None


def _assistant_drafter(target: Model, cache: KVCache, df, spec: LoadSpec,
                       device: torch.device) -> tuple[AssistantDrafter, str]:
    """An AssistantDrafter over a DRAFT file holding a Gemma 4 assistant; it must fit the target."""
    assistant, fmt = _load_drafter_arch(df, spec, device, "Gemma 4 assistant",
                                        lambda fmt: load_assistant(target, df, fmt))
    return AssistantDrafter(assistant, cache, target.norm, target.config.vocab_size), fmt


def _eagle3_drafter(target: Model, df, spec: LoadSpec, device: torch.device, capacity: int) -> tuple[MtpDrafter, str]:
    """An MtpDrafter over a DRAFT file holding an EAGLE-3 head; the target then records the layers it reads."""
    head, fmt = _load_drafter_arch(df, spec, device, "EAGLE-3 head", lambda fmt: load_eagle3(target, df, fmt))
    target.capture_at(head.target_layers)
    return MtpDrafter(head, capacity), fmt


def _unapplied_lora(f: GGUFFile) -> list[str]:
    """Adapted weights of the target file that its model loaded no linear from: a LoRA silently dropped
    otherwise. A NextN head's block is left out: it loads later, and only when no DRAFT takes its place."""
    if f.lora is None:
        return []
    head = find_nextn_block(f.tensors)
    return [n for n in f.lora.unapplied() if head is None or not n.startswith(f"blk.{head}.")]


def load_parts(spec: LoadSpec) -> LoadedParts:
    """Open, check and build everything ``spec`` names; a refusal is an ``EngineError`` with status 400."""
    device = resolve_device(spec.device)
    try:
        f = GGUFFile(spec.model_path)
    except ValueError as e:
        raise EngineError(str(e), 400) from None
    if f.architecture in ENCODER_ARCHITECTURES:
        return _load_encoder_parts(spec, f, device)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
        target = load_model(f, spec.weight_format, device, role="target", pack_dir=spec.pack_dir,
                            adapters=spec.adapter_paths)
        fmt = target.fmt  # 'auto' resolved by the model loader (per role and file)
    except (UnsupportedModelError, TokenizerError) as e:
        f.close()
        raise EngineError(str(e), 400) from None
    unapplied = _unapplied_lora(f)
    if unapplied:
        f.close()
        raise EngineError(f"adapter: {unapplied[0]} is not run as a linear layer by tandem's {target.config.arch} "
                          "model, so its LoRA cannot be applied", 400)
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
        if df.metadata.get("general.architecture") in DRAFTER_ARCHITECTURES:
            # A drafter architecture (the Gemma 4 assistant, an EAGLE-3 head) drafts from the target's hidden
            # states; like an MTP head, it takes the place of any head the target carries.
            if df.metadata["general.architecture"] == EAGLE3:
                drafters["mtp"], draft_fmt = _eagle3_drafter(target, df, spec, device, num_ctx)
            else:
                drafters["mtp"], draft_fmt = _assistant_drafter(target, cache, df, spec, device)
            owned.append(df)
            draft_arch, draft_kind = df.metadata["general.architecture"], "mtp"
        elif is_mtp_head_only(df.tensors):
            # A DRAFT that is an MTP head drafts from the target's hidden states; it takes the
            # place of any head the target carries itself.
            drafters["mtp"], draft_fmt = _mtp_head_drafter(target, df, spec, device, num_ctx)
            owned.append(df)
            draft_arch, draft_kind = target.config.arch, "mtp"
        else:
            try:
                draft = load_model(df, spec.draft_weight_format, device, role="drafter", pack_dir=spec.pack_dir)
            except UnsupportedModelError as e:
                raise EngineError(f"draft model: {e}", 400) from None
            draft_fmt = draft.fmt
            draft_arch = draft.config.arch
            if 0 < spec.draft_vocab < draft.config.vocab_size and device.type == "cpu":
                counts = token_counts(tokenizer, spec.pack_dir)
                prune_output_head(draft, torch.from_numpy(frequent_tokens(tokenizer, spec.draft_vocab, counts)))
                if df.packs is not None:
                    df.packs.save(background=True)  # the pruned head's packed rows join the drafter's
            drafters["model"] = DraftModelDrafter(draft, num_ctx, vocab)
            draft_kind = "model"
    nextn = find_nextn_block(f.tensors)
    if nextn is not None and "mtp" not in drafters:
        drafters["mtp"] = MtpDrafter(load_nextn_head(target, f, nextn, fmt), num_ctx)
        if f.packs is not None:
            f.packs.save(background=True)  # the head's packed weights join the target's

    # What one more sequence slot costs: a target cache and each drafter's own cache (weights are shared).
    slot_bytes = cache.nbytes() + sum(d.cache.nbytes() for d in drafters.values()
                                      if isinstance(getattr(d, "cache", None), KVCache) and d.cache is not cache)
    num_parallel = resolve_num_parallel(spec.num_parallel, slot_bytes, available_memory())
    memory = model_bytes(target) + cache.nbytes() + sum(d.memory_bytes() for d in drafters.values()) + \
        (num_parallel - 1) * slot_bytes
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
        num_parallel=num_parallel,
    )
    return LoadedParts(spec=spec, target=target, gguf=f, tokenizer=tokenizer, cache=cache, drafters=drafters,
                       facts=facts, draft_kind=draft_kind, owned_files=owned, num_parallel=num_parallel)


def _load_encoder_parts(spec: LoadSpec, f: GGUFFile, device: torch.device) -> LoadedParts:
    """An embedding model: the encoder and its tokenizer; no KV cache (each input is encoded whole) and no
    drafters (it never generates). Its context is the load's num_ctx within the positions it learned."""
    if spec.draft_path:
        f.close()
        raise EngineError("an embedding model cannot have a draft model", 400)
    if spec.adapter_paths:
        f.close()
        raise EngineError("an embedding model cannot have an adapter", 400)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
        encoder = load_encoder(f, device)
    except (UnsupportedModelError, TokenizerError) as e:
        f.close()
        raise EngineError(str(e), 400) from None
    if tokenizer.bos_id is None or tokenizer.sep_id is None:
        f.close()
        raise EngineError(f"{spec.model_path}: the vocabulary has no [CLS]/[SEP] tokens", 400)
    cfg = encoder.config
    num_ctx = min(int(spec.num_ctx), cfg.context_length) if spec.num_ctx and spec.num_ctx > 0 else cfg.context_length
    toks = tokenizer.token_strings()
    facts = ModelFacts(
        architecture=cfg.arch, context_length=num_ctx, vocab_size=cfg.vocab_size, device=str(device),
        weight_format=encoder.fmt, draft_architecture=None, draft_weight_format=None,
        memory_bytes=int(model_bytes(encoder)), bos_token=toks[tokenizer.bos_id], eos_token=toks[tokenizer.sep_id],
        add_bos=True, pooling=cfg.pooling, embedding_length=cfg.n_embd,
        # requests at once: an encoder keeps no per-sequence state, and the engine client merges the calls of
        # requests served together into one (server.engine_process.embed_batcher)
        num_parallel=spec.num_parallel if spec.num_parallel > 0 else AUTO_PARALLEL)
    return LoadedParts(spec=spec, target=encoder, gguf=f, tokenizer=tokenizer, cache=None, drafters={}, facts=facts)
