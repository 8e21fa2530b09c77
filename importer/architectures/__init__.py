"""The registry of the Hugging Face architectures the importer converts: one module per family, each listing its
``ArchitectureSpec``s (``spec.py``) in ``SPECS``; this is the only place they are registered.

A module owns everything about its architectures: the Hugging Face classes and model types it accepts, the
config.json -> ``ModelParams`` mapping beyond the common fields, the activations it runs and its other refusals,
its tensor names, shapes and transforms, and the GGUF metadata it writes beyond the common keys. The generic
drivers (``importer/hf_config.py``, ``importer/hf_to_gguf.py``) only read spec fields. Adding an architecture means
one module here and one entry in ``MODULES``; its GGUF name must be one the engine runs
(``engine.contract.capabilities``: tests/importer/test_architectures.py checks it).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

from . import bert, eagle3, gemma3, gemma4, llama, qwen2, qwen3, qwen35
from .spec import ArchitectureSpec

# In this order the Hugging Face classes are listed where an architecture is refused.
MODULES: tuple[ModuleType, ...] = (llama, qwen2, gemma3, qwen3, gemma4, qwen35, bert, eagle3)

SPECS: tuple[ArchitectureSpec, ...] = tuple(spec for module in MODULES for spec in module.SPECS)
BY_ARCH: Mapping[str, ArchitectureSpec] = {spec.arch: spec for spec in SPECS}

# The decoders, which the generic conversion (hf_config.read_params, hf_to_gguf.plan_conversion) converts:
# Hugging Face class -> spec, and config.json model_type -> class (for a config that names no class).
HF_CLASSES: Mapping[str, ArchitectureSpec] = {c: spec for spec in SPECS if spec.convert_folder is None
                                              for c in spec.hf_classes}
MODEL_TYPES: Mapping[str, str] = {t: c for spec in SPECS if spec.convert_folder is None
                                  for t, c in spec.model_types.items()}
# Hugging Face class -> GGUF architecture, for every decoder.
ARCHITECTURES: Mapping[str, str] = {c: spec.arch for c, spec in HF_CLASSES.items()}

# Checkpoint tensors outside the text model some architecture names (the vision and audio towers are the generic
# planner's own): skipped for every architecture, as the one list they were.
SKIPPED_PREFIXES: tuple[str, ...] = tuple(p for spec in SPECS for p in spec.skip_prefixes)


def _check() -> None:
    classes = [c for spec in SPECS for c in spec.hf_classes]
    archs = [spec.arch for spec in SPECS]
    for what, names in (("Hugging Face class", classes), ("GGUF architecture", archs)):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ImportError(f"importer/architectures registers the {what} {twice[0]} twice")


_check()


def spec_for(arch: str) -> ArchitectureSpec:
    """The spec of GGUF architecture ``arch`` (a KeyError for one the importer does not convert)."""
    return BY_ARCH[arch]


def folder_converter(files: Mapping[str, Path]) -> Callable[..., None] | None:
    """The whole-folder converter of an architecture that converts itself (bert, eagle3) when the uploaded folder's
    config.json names it; None for any other folder (a missing or bad config.json included: the decoder
    conversion reports it)."""
    if "config.json" not in files:
        return None
    try:
        config: Any = json.loads(files["config.json"].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    spec = whole_folder_spec(config)
    return spec.convert_folder if spec is not None else None


def whole_folder_spec(config: Mapping[str, Any]) -> ArchitectureSpec | None:
    """The spec of an architecture that converts itself (bert, eagle3) whose class ``config`` names, or None."""
    return next((s for s in SPECS if s.convert_folder is not None and s.accepts(config)), None)
