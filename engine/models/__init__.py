"""The registry of supported architectures: GGUF ``general.architecture`` -> the module that reads its config.

Each module exposes ``read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig`` and declares its
deviations from the plain llama block as ``ModelConfig`` fields; the layers (``engine.models.layers``),
the model (``engine.models.transformer``) and the loader (``engine.models.loader``) are shared. Adding an
architecture means one module here and one entry below (``ENCODERS`` for embedding models). The names are also
the contract's (``engine.contract.capabilities``, which the server and the importer read without torch): the check
below fails the engine's import when the two lists part.
"""

from __future__ import annotations

from types import ModuleType

from engine.models import bert, eagle3, gemma3, gemma4, gemma4_assistant, llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe
from engine.contract.capabilities import DECODER_ARCHITECTURES, DRAFTER_ARCHITECTURES, ENCODER_ARCHITECTURES
from engine.models.config import UnsupportedArchitectureError

ARCHITECTURES: dict[str, ModuleType] = {"llama": llama, "qwen2": qwen2, "gemma3": gemma3, "gemma4": gemma4,
                                        "qwen3": qwen3, "qwen3moe": qwen3moe,
                                        "qwen35": qwen35, "qwen35moe": qwen35moe}

# Architectures that only draft for a target (a DRAFT layer, never a FROM): each module also exposes
# ``TARGET_ARCHITECTURES``.
DRAFTERS: dict[str, ModuleType] = {gemma4_assistant.ARCH: gemma4_assistant, eagle3.ARCH: eagle3}

# Encoders: architectures that embed text rather than generate it (``/api/embed``). Each module exposes
# ``read_config(f: GGUFFile) -> EncoderConfig``; ``engine.models.encoder`` is their model.
ENCODERS: dict[str, ModuleType] = {bert.ARCH: bert}



def _check_contract() -> None:
    for registry, declared in ((ARCHITECTURES, DECODER_ARCHITECTURES), (DRAFTERS, DRAFTER_ARCHITECTURES),
                               (ENCODERS, ENCODER_ARCHITECTURES)):
        if set(registry) != declared:
            raise ImportError(f"engine/models registers {sorted(registry)} but engine/contract/capabilities.py "
                              f"declares {sorted(declared)}: add the name to both")


_check_contract()


def get_arch(name: str, path: str = "") -> ModuleType:
    """The module of architecture ``name``; ``UnsupportedArchitectureError`` (naming ``path``) if none."""
    module = ARCHITECTURES.get(name)
    if module is None:
        where = f"{path}: " if path else ""
        raise UnsupportedArchitectureError(
            f"{where}model architecture {name!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})")
    return module
