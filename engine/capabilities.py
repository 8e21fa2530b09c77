"""What the engine can run, as plain constants, so the importer can validate without loading torch."""

from engine.models import ARCHITECTURES

# GGUF `general.architecture` values with a module in the registry of engine/models/.
SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset(ARCHITECTURES)

# Tensor types the engine's dequantizers read (engine/ops/dequant.py).
SUPPORTED_TENSOR_TYPES: frozenset[str] = frozenset(
    {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}
)


def has_mtp_head(tensor_names) -> bool:
    """Whether a GGUF carries a DeepSeek/GLM NextN (MTP) head: its tensors are `blk.N.nextn.*`."""
    return any(".nextn." in name for name in tensor_names)


def is_mtp_head_only(tensor_names) -> bool:
    """Whether a GGUF is an MTP head alone (NextN tensors, no model of its own: no token embeddings),
    which drafts for a target as a DRAFT layer."""
    names = list(tensor_names)
    return has_mtp_head(names) and "token_embd.weight" not in names
