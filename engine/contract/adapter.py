"""LoRA adapters in llama.cpp's GGUF layout: what one holds, and whether it fits a base model.

An adapter GGUF (llama.cpp's ``convert_lora_to_gguf.py``) says ``general.type`` = ``adapter``,
``adapter.type`` = ``lora`` and ``adapter.lora.alpha``, and holds for each adapted base weight ``W`` [out, in]
(torch order) the pair ``W.lora_a`` [rank, in] and ``W.lora_b`` [out, rank]. Applied, ``W x`` becomes
``W x + scale * B (A x)`` with llama.cpp's scale: ``alpha / rank`` (1 when alpha is 0 or absent).

Torch-free (numpy only, through ``engine.contract.gguf``): the importer checks an adapter at create with the same
rules the engine applies at load, so a create that succeeds never yields a model that will not load.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.contract.gguf import GGUFFile, TensorInfo

LORA_A, LORA_B = ".lora_a", ".lora_b"
# Base weights that are not linear layers: an embedding is a table lookup and a depthwise conv is not a
# matmul, so a LoRA on them cannot be applied as ``W x + B A x`` (llama.cpp's tok_embd LoRA is a different op).
_NOT_LINEAR = ("token_embd.weight", "per_layer_token_embd.weight", "embed_tokens.weight", "ssm_conv1d.weight")


class AdapterError(ValueError):
    """An adapter that is not a LoRA in llama.cpp's layout or does not fit the base model."""


@dataclass(frozen=True)
class LoraPair:
    """One adapted base weight: its name, the adapter's two tensors for it and their rank."""

    base: str
    a: str  # [rank, in]
    b: str  # [out, rank]
    rank: int


@dataclass(frozen=True)
class LoraAdapter:
    path: str
    alpha: float  # 0: no alpha, the scale is the user's alone (llama.cpp's rule)
    pairs: tuple[LoraPair, ...]

    def scale(self, pair: LoraPair, user_scale: float = 1.0) -> float:
        return user_scale * self.alpha / pair.rank if self.alpha else user_scale


def _shape(t: TensorInfo) -> list[int]:
    return list(t.shape)


def read_lora(adapter: GGUFFile, base: GGUFFile) -> LoraAdapter:
    """The LoRA pairs of ``adapter``, each checked against ``base``'s tensor directory; ``AdapterError`` names
    the first tensor or key that does not fit."""
    meta = adapter.metadata
    kind = meta.get("general.type")
    if kind != "adapter":
        raise AdapterError(f"not a LoRA adapter: general.type is {kind!r}, expected 'adapter' (llama.cpp's "
                           "convert_lora_to_gguf.py layout)")
    if meta.get("adapter.type") != "lora":
        raise AdapterError(f"adapter type {meta.get('adapter.type')!r} is not supported; only 'lora' is")
    arch = meta.get("general.architecture")
    if arch != base.architecture:
        raise AdapterError(f"the adapter is for architecture {arch!r}, the model is {base.architecture!r}")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise AdapterError(f"adapter.lora.alpha is {alpha!r}, not a number")

    bases: dict[str, dict[str, TensorInfo]] = {}
    for name, info in adapter.tensors.items():
        if not name.endswith((LORA_A, LORA_B)):
            raise AdapterError(f"tensor {name!r} is not a LoRA tensor (names end in {LORA_A} or {LORA_B})")
        bases.setdefault(name[:-len(LORA_A)], {})[name[-len(LORA_A):]] = info
    if not bases:
        raise AdapterError("the adapter holds no tensors")
    pairs = []
    for name, parts in sorted(bases.items()):
        missing = next((s for s in (LORA_A, LORA_B) if s not in parts), None)
        if missing is not None:
            raise AdapterError(f"tensor {name + missing!r} is missing (every {name}{LORA_A} needs its {LORA_B})")
        pairs.append(_checked_pair(name, parts[LORA_A], parts[LORA_B], base))
    return LoraAdapter(adapter.path, float(alpha), tuple(pairs))


def _checked_pair(name: str, a: TensorInfo, b: TensorInfo, base: GGUFFile) -> LoraPair:
    w = base.tensors.get(name)
    if w is None:
        raise AdapterError(f"tensor {a.name!r} adapts {name!r}, which the model does not have")
    if len(w.shape) != 2 or name.endswith(_NOT_LINEAR):
        raise AdapterError(f"tensor {a.name!r} adapts {name!r} {_shape(w)}, which is not a linear layer's weight")
    out, inp = w.shape
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != inp or b.shape[0] != out or a.shape[0] != b.shape[1] \
            or a.shape[0] == 0:
        raise AdapterError(f"tensors {a.name!r} {_shape(a)} and {b.name!r} {_shape(b)} do not fit {name!r} "
                           f"{_shape(w)} (expected [rank, {inp}] and [{out}, rank])")
    return LoraPair(name, a.name, b.name, a.shape[0])
