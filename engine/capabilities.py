"""What the engine can run, as plain constants, so the importer can validate without loading torch."""

from engine.models import ARCHITECTURES, DRAFTERS, ENCODERS
from engine.models.bert import normalizes as embedding_normalizes  # noqa: F401  (re-exported for the server)
from engine.models.bert import pooling_of as embedding_pooling  # noqa: F401  (re-exported for the server)

# GGUF `general.architecture` values with a module in the registry of engine/models/ (decoders and encoders).
SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset(ARCHITECTURES) | frozenset(ENCODERS)

# Architectures that embed text (/api/embed) and cannot generate.
ENCODER_ARCHITECTURES: frozenset[str] = frozenset(ENCODERS)

# Architectures that only draft for a target (a DRAFT layer): the Gemma 4 assistant.
DRAFTER_ARCHITECTURES: frozenset[str] = frozenset(DRAFTERS)


def draft_layer_kind(architecture: str | None, tensor_names) -> str:
    """What a DRAFT GGUF drafts as: ``mtp`` for an MTP head or a drafter-only architecture (both draft
    from the target's state), ``model`` for an independent model."""
    if architecture in DRAFTERS or is_mtp_head_only(tensor_names):
        return "mtp"
    return "model"


def drafter_target_width(draft_arch: str, draft_metadata) -> int | None:
    """The target hidden size a drafter-only GGUF was built for (None: not a drafter, or not said)."""
    module = DRAFTERS.get(draft_arch)
    return module.target_width(draft_metadata) if module is not None else None


def drafter_problem(draft_arch: str, width: int | None, target_arch: str, target_width: int | None) -> str | None:
    """Why a drafter-only DRAFT (built for targets of hidden size ``width``) cannot draft for a target,
    or None when it fits: the target's architecture must be one it was made for, and its width the
    one it was built against."""
    module = DRAFTERS[draft_arch]
    if target_arch not in module.TARGET_ARCHITECTURES:
        return (f"a {draft_arch} drafts for {', '.join(sorted(module.TARGET_ARCHITECTURES))} models, "
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


def has_mtp_head(tensor_names) -> bool:
    """Whether a GGUF carries a DeepSeek/GLM NextN (MTP) head: its tensors are `blk.N.nextn.*`."""
    return any(".nextn." in name for name in tensor_names)


def is_mtp_head_only(tensor_names) -> bool:
    """Whether a GGUF is an MTP head alone (NextN tensors, no model of its own: no token embeddings),
    which drafts for a target as a DRAFT layer."""
    names = list(tensor_names)
    return has_mtp_head(names) and "token_embd.weight" not in names
