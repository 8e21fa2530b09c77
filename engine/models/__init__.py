"""One module per supported architecture; each exposes ``read_config(f: GGUFFile) -> ModelConfig``.

The transformer block is shared (``engine.models.transformer``); an architecture module only reads its metadata and
declares its deviations from the plain llama block as ``ModelConfig`` fields.
"""

from __future__ import annotations

from types import ModuleType

from engine.models import gemma3, llama, qwen2

ARCHITECTURES: dict[str, ModuleType] = {"llama": llama, "qwen2": qwen2, "gemma3": gemma3}


def get_arch(name: str, path: str = "") -> ModuleType:
    from engine.models.transformer import SUPPORTED_ARCHITECTURES, UnsupportedArchitectureError

    module = ARCHITECTURES.get(name)
    if module is None or name not in SUPPORTED_ARCHITECTURES:
        where = f"{path}: " if path else ""
        raise UnsupportedArchitectureError(
            f"{where}model architecture {name!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})")
    return module
