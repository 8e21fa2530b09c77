"""Reading what the importer needs to know about a GGUF, and refusing files the engine cannot run."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from engine.contract.capabilities import (
    DRAFTER_ARCHITECTURES,
    DRAFTER_INDEX_TENSOR_TYPES,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_TENSOR_TYPES,
    drafter_problem,
    drafter_target_width,
    has_mtp_head,
    is_mtp_head_only,
)
from engine.contract.gguf import GGUFError, GGUFFile, format_parameter_count
from engine.contract.llamacpp_launch import llamacpp_available

from .request import CreateError


@dataclass(frozen=True)
class GGUFSummary:
    """The facts about one GGUF that end up in the config blob or decide whether it may be paired."""

    architecture: str
    parameter_count: int
    file_type: str
    context_length: int | None
    embedding_length: int | None
    vocab_size: int
    vocab_digest: str  # sha256 over the token strings: equal digests = identical vocabularies
    tensor_types: frozenset[str]
    has_nextn: bool  # carries an MTP (NextN) head
    is_mtp_head: bool = False  # nothing but an MTP head (a DRAFT that drafts from the target's hidden states)
    drafter_target_width: int | None = None  # a drafter-only architecture: the target width it was built for

    @property
    def parameter_size(self) -> str:
        return format_parameter_count(self.parameter_count)


def summarize_gguf(path: str | os.PathLike) -> GGUFSummary:
    """Parse and validate a GGUF; every refusal is a CreateError whose text names the problem."""
    try:
        f = GGUFFile(path)
    except GGUFError as e:
        raise CreateError(str(e)) from None
    with f:
        arch = f.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise CreateError(f"{os.path.basename(path)}: GGUF has no general.architecture")
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise CreateError(
                f"{os.path.basename(path)}: GGUF has no tokenizer (tokenizer.ggml.tokens is missing); "
                "tandem needs the vocabulary inside the GGUF"
            )
        h = hashlib.sha256()
        for tok in tokens:
            h.update(tok.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        ctx = f.metadata.get(f"{arch}.context_length")
        emb = f.metadata.get(f"{arch}.embedding_length")
        return GGUFSummary(
            architecture=arch,
            parameter_count=f.parameter_count,
            file_type=f.file_type,
            context_length=int(ctx) if ctx is not None else None,
            embedding_length=int(emb) if emb is not None else None,
            vocab_size=len(tokens),
            vocab_digest=h.hexdigest(),
            tensor_types=frozenset(t.type_name for t in f.tensors.values()),
            has_nextn=has_mtp_head(f.tensors),
            is_mtp_head=is_mtp_head_only(f.tensors),
            drafter_target_width=drafter_target_width(arch, f.metadata),
        )


def check_runnable(summary: GGUFSummary, role: str) -> None:
    """Refuse an architecture or tensor type the engine has no code for (at create time, not at load)."""
    if summary.architecture in DRAFTER_ARCHITECTURES:
        if role == "model":
            raise CreateError(f'the model is a {summary.architecture}, which only drafts for a target: name it in '
                              "DRAFT, with its target in FROM")
    elif summary.architecture not in SUPPORTED_ARCHITECTURES:
        if llamacpp_available():  # engine auto serves it through llama.cpp (engine.contract.llamacpp_launch)
            return
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise CreateError(f'unsupported {role} architecture "{summary.architecture}" (tandem runs: {supported}; '
                          "llama.cpp runs it once llama-server is installed: scripts/install_llama_server.sh)")
    if summary.is_mtp_head and role == "model":
        raise CreateError("the model is only an MTP (NextN) head, which drafts for a target: name it in DRAFT, "
                          "with its target in FROM")
    kept = DRAFTER_INDEX_TENSOR_TYPES if summary.architecture in DRAFTER_ARCHITECTURES else frozenset()
    unknown = sorted(summary.tensor_types - SUPPORTED_TENSOR_TYPES - kept)
    if unknown:
        raise CreateError(f"unsupported tensor type(s) in {role}: {', '.join(unknown)}")


def check_draft_pair(target: GGUFSummary, draft: GGUFSummary) -> None:
    """A drafter proposes token ids the target verifies, so both must use one vocabulary; an MTP head
    also runs on the target's hidden states, so it must be built for the target's width and kind."""
    if draft.architecture in DRAFTER_ARCHITECTURES:
        problem = drafter_problem(draft.architecture, draft.drafter_target_width, target.architecture,
                                  target.embedding_length)
        if problem is not None:
            raise CreateError(problem)
    if draft.is_mtp_head:
        if draft.embedding_length != target.embedding_length:
            raise CreateError(f"MTP head hidden size {draft.embedding_length} does not match the target's "
                              f"{target.embedding_length}")
        if draft.architecture != target.architecture:
            raise CreateError(f"MTP head architecture {draft.architecture} does not match the target's "
                              f"{target.architecture}")
    if draft.vocab_size != target.vocab_size:
        raise CreateError(
            f"draft model vocabulary ({draft.vocab_size} tokens) does not match the target's "
            f"({target.vocab_size} tokens); a drafter must share the target's tokenizer"
        )
    if draft.vocab_digest != target.vocab_digest:
        raise CreateError(
            f"draft model vocabulary differs from the target's (both have {target.vocab_size} tokens, "
            "but the token strings differ); a drafter must share the target's tokenizer"
        )
