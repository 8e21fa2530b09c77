"""What the engine can run, as plain constants, so the server and the importer can validate without torch.

The engine's registry (``engine/models/__init__.py``) has one module per name below and checks, when it is
imported, that the two lists agree: adding an architecture means its module there and its name here.
"""

from __future__ import annotations

from typing import Any, Mapping

# GGUF `general.architecture` values the engine generates with (engine/models/<arch>.py).
DECODER_ARCHITECTURES: frozenset[str] = frozenset(
    {"llama", "qwen2", "gemma3", "gemma4", "qwen3", "qwen3moe", "qwen35", "qwen35moe"})

# Architectures that embed text (/api/embed) and cannot generate.
ENCODER_ARCHITECTURES: frozenset[str] = frozenset({"bert"})

# Architectures that only draft for a target (a DRAFT layer, never a FROM), with the targets each drafts for:
# the Gemma 4 assistant, and EAGLE-3 heads (trained for llama-family targets; they read three of the target's
# layers, which the engine records for the dense decoders below).
GEMMA4_ASSISTANT = "gemma4-assistant"
EAGLE3 = "eagle3"
DRAFTER_TARGETS: Mapping[str, frozenset[str]] = {GEMMA4_ASSISTANT: frozenset({"gemma4"}),
                                                 EAGLE3: frozenset({"llama", "qwen2", "qwen3"})}
DRAFTER_ARCHITECTURES: frozenset[str] = frozenset(DRAFTER_TARGETS)

# Everything a FROM may name (decoders and encoders).
SUPPORTED_ARCHITECTURES: frozenset[str] = DECODER_ARCHITECTURES | ENCODER_ARCHITECTURES

# An embedding GGUF's `{arch}.pooling_type` codes (llama.cpp's enum llama_pooling_type).
POOLING_NAMES: Mapping[int, str] = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def embedding_pooling(metadata: Mapping[str, Any]) -> str | None:
    """The pooling an embedding GGUF declares (``{arch}.pooling_type``), or None for a model without one.

    Ollama's rule: a model whose GGUF carries a pooling type is an embedding model (capability
    ``embedding``, no ``completion``); any other is a completion model."""
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.pooling_type")
    if value is None:
        return None
    return POOLING_NAMES.get(int(value), f"unknown ({int(value)})")


def embedding_normalizes(metadata: Mapping[str, Any]) -> bool:
    """Whether the model's own pipeline L2-normalises its vectors (``{arch}.normalize_embeddings``; llama.cpp
    and Ollama read a bert without the key as normalising)."""
    arch = metadata.get("general.architecture")
    return bool(metadata.get(f"{arch}.normalize_embeddings", True))


def drafter_target_width(draft_arch: str, draft_metadata: Mapping[str, Any]) -> int | None:
    """The target hidden size a drafter-only GGUF was built for (``{arch}.embedding_length_out``; None: not a
    drafter, or not said)."""
    if draft_arch not in DRAFTER_TARGETS:
        return None
    value = draft_metadata.get(f"{draft_arch}.embedding_length_out")
    return int(value) if value is not None else None


def draft_layer_kind(architecture: str | None, tensor_names) -> str:
    """What a DRAFT GGUF drafts as: ``mtp`` for an MTP head or a drafter-only architecture (both draft
    from the target's state), ``model`` for an independent model."""
    if architecture in DRAFTER_TARGETS or is_mtp_head_only(tensor_names):
        return "mtp"
    return "model"


def drafter_problem(draft_arch: str, width: int | None, target_arch: str, target_width: int | None) -> str | None:
    """Why a drafter-only DRAFT (built for targets of hidden size ``width``) cannot draft for a target,
    or None when it fits: the target's architecture must be one it was made for, and its width the
    one it was built against."""
    targets = DRAFTER_TARGETS[draft_arch]
    if target_arch not in targets:
        return (f"a {draft_arch} drafts for {', '.join(sorted(targets))} models, "
                f"not {target_arch}")
    if width is None:
        return f"the {draft_arch} GGUF lacks {draft_arch}.embedding_length_out (the target width it was built for)"
    if target_width is not None and width != target_width:
        return (f"the {draft_arch} was built for a target of hidden size {width} (embedding_length_out), "
                f"but the target's hidden size is {target_width}")
    return None

# Tensor types the engine's dequantizers read (engine/ops/dequant.py).
SUPPORTED_TENSOR_TYPES: frozenset[str] = frozenset(
    {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
     "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "MXFP4"}
)

# Integer tensors a drafter-only architecture keeps as they are (an EAGLE-3 head's d2t vocabulary map).
DRAFTER_INDEX_TENSOR_TYPES: frozenset[str] = frozenset({"I32"})


def has_mtp_head(tensor_names) -> bool:
    """Whether a GGUF carries a DeepSeek/GLM NextN (MTP) head: its tensors are `blk.N.nextn.*`."""
    return any(".nextn." in name for name in tensor_names)


def is_mtp_head_only(tensor_names) -> bool:
    """Whether a GGUF is an MTP head alone (NextN tensors, no model of its own: no token embeddings),
    which drafts for a target as a DRAFT layer."""
    names = list(tensor_names)
    return has_mtp_head(names) and "token_embd.weight" not in names
