"""Tiny random GGUFs of architectures the native engine does not run, written by llama.cpp's own converter
(convert_hf_to_gguf.py, which scripts/install_llama_server.sh keeps beside llama-server) from tiny transformers
models with SmolLM2's tokenizer (read from its GGUF by transformers; the converter knows its pre-tokenizer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from engine.contract.llamacpp_launch import find_llama_server


def converter() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py from the install, or None."""
    server = find_llama_server()
    if server is None:
        return None
    script = Path(server).resolve().parent.parent / "convert_hf_to_gguf.py"
    return script if script.exists() else None


def _configs(vocab: int) -> dict[str, Callable]:
    import transformers

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=512)
    return {
        "phi2": lambda: transformers.PhiConfig(**common),
        "starcoder2": lambda: transformers.Starcoder2Config(**common, num_key_value_heads=2),
        "granite": lambda: transformers.GraniteConfig(**common, num_key_value_heads=2),
        "olmo2": lambda: transformers.Olmo2Config(**common, num_key_value_heads=2),
        "gpt-oss": lambda: transformers.GptOssConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=512,
            layer_types=["sliding_attention", "full_attention"], sliding_window=32),
        "mistral3": lambda: transformers.Mistral3Config(
            text_config=transformers.MistralConfig(**common, num_key_value_heads=2, head_dim=16),
            vision_config=transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                           num_attention_heads=2, image_size=32, patch_size=16)),
    }


ARCHITECTURES = ("phi2", "starcoder2", "granite", "olmo2", "gpt-oss", "mistral3")


def write_models(out: Path, smollm2: Path, names=ARCHITECTURES) -> dict[str, Path]:
    """``{name: gguf}``, each a 2-layer random model converted by llama.cpp's converter (f32)."""
    import torch
    import transformers

    script = converter()
    assert script is not None
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    configs = _configs(len(tok))
    paths = {}
    for name in names:
        cfg = configs[name]()
        text = getattr(cfg, "text_config", cfg)
        for c in {id(cfg): cfg, id(text): text}.values():
            c.bos_token_id, c.eos_token_id, c.pad_token_id = tok.bos_token_id, tok.eos_token_id, None
        torch.manual_seed(0)
        auto = transformers.AutoModelForImageTextToText if name == "mistral3" else transformers.AutoModelForCausalLM
        model = auto.from_config(cfg).to(torch.float32)
        folder = out / name
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        gguf = out / f"{name}.gguf"
        subprocess.run([sys.executable, str(script), str(folder), "--outfile", str(gguf), "--outtype", "f32"],
                       check=True, capture_output=True)
        paths[name] = gguf
    return paths


def write_copy(folder: Path, out: Path, model_name: str) -> Path:
    """The converted model of ``folder`` again under another general.name: the same weights in another file (a
    DRAFT that is the target itself, which the store would otherwise take for the same blob)."""
    script = converter()
    assert script is not None
    subprocess.run([sys.executable, str(script), str(folder), "--outfile", str(out), "--outtype", "f32",
                    "--model-name", model_name], check=True, capture_output=True)
    return out


def write_vision_model(out: Path, smollm2: Path) -> tuple[Path, Path]:
    """A tiny random Qwen2-VL (2 text layers, 3 vision blocks) as llama.cpp's converter writes it: the text model's
    GGUF and, with ``--mmproj``, its projector's (general.type ``mmproj``)."""
    import json

    import torch
    import transformers

    script = converter()
    assert script is not None
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        # three blocks: the converter names the merger's layers by block index, so it needs at least as many
        vision_config=dict(depth=3, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2))
    for c in (cfg, cfg.text_config):
        c.bos_token_id, c.eos_token_id, c.pad_token_id = tok.bos_token_id, tok.eos_token_id, None
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(cfg).to(torch.float32)
    folder = out / "qwen2vl"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    # the converter reads the image normalisation from the processor's config (CLIP's values, as Qwen2-VL's)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 200704}))
    text, projector = out / "qwen2vl.gguf", out / "qwen2vl-mmproj.gguf"
    for extra, path in (([], text), (["--mmproj"], projector)):
        subprocess.run([sys.executable, str(script), str(folder), "--outfile", str(path), "--outtype", "f32", *extra],
                       check=True, capture_output=True)
    return text, projector
