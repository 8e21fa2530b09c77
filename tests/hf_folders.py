"""Tiny Hugging Face model folders (config.json, safetensors, tokenizer files) for the safetensors importer.

``make_tokenizer(style)`` builds a real ``tokenizers`` tokenizer laid out as the released models lay
theirs out (the pre-tokenizer regexes are copied from Llama 3's and Qwen2's tokenizer.json; the
SentencePiece styles are byte-fallback BPEs like Llama 2's and Gemma's). ``make_folder`` saves a tiny
random llama / qwen2 / gemma3 / qwen3 / qwen3moe with transformers' ``save_pretrained`` (any dtype, optionally sharded)
next to such a tokenizer, and returns the float64 reference model loaded back from those files.
``add_nextn`` adds a random NextN (MTP) module in DeepSeek-V3 naming, inside the checkpoint or as a
folder of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tests import hf_tiny
from tests.tiny_gguf import CHATML_TEMPLATE, gpt2_vocab, spm_vocab

# Verbatim from the released tokenizer.json files.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
STYLES = ("llama3", "qwen2", "smollm", "llama2", "gemma")
DEFAULT_STYLE = {"llama": "llama3", "qwen2": "qwen2", "gemma3": "gemma", "qwen3": "qwen2", "qwen3moe": "qwen2"}
SAMPLE = ("Hello world! def fib(n): return the 12345 numbers\n\n   indented\tthe end <|im_start|>user\n"
          "ünïcödé 日本 <start_of_turn>model theer  ")


def _spm_merges(tokens: list[str], ranks: list[float], normal: list[bool]) -> list[tuple[str, str]]:
    """Every split of a vocabulary token into two vocabulary tokens, best-ranked token first."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, tok in enumerate(tokens):
        if not normal[i]:
            continue
        for k in range(1, len(tok)):
            a, b = tok[:k], tok[k:]
            if a in ids and b in ids:
                merges.append((-ranks[i], -len(a), i, a, b))
    return [(a, b) for *_, a, b in sorted(merges)]


def make_tokenizer(style: str):
    """A transformers fast tokenizer of the given style (see STYLES)."""
    import transformers as tf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if style in ("llama2", "gemma"):
        tokens, types, scores = spm_vocab()
        normal = [t == 1 for t in types]
        # gemma merges in token order, llama 2 by score (both are how their converters rank them)
        ranks = [-float(i) for i in range(len(tokens))] if style == "gemma" else scores
        merges = _spm_merges(tokens, ranks, normal)
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token="<unk>",
                         fuse_unk=True, byte_fallback=True)
        tk = Tokenizer(bpe)
        escape = normalizers.Replace(" ", "\u2581")
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), escape]) if style == "llama2" else escape
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if style == "llama2":  # Llama 2 strips the space its normalizer prepended
            steps.append(decoders.Strip(content=" ", left=1, right=0))
        tk.decoder = decoders.Sequence(steps)
        specials = [t for t, ty in zip(tokens, types) if ty in (3, 2)]
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                          special_tokens=[("<bos>", tokens.index("<bos>"))])
        return tf.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                          unk_token="<unk>", pad_token="<pad>")
    specials = ("<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
    tokens, types, merges = gpt2_vocab(extra_specials=specials)
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], ignore_merges=style == "llama3")
    tk = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if style == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        regex = LLAMA3_REGEX if style == "llama3" else QWEN2_REGEX
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    if style == "qwen2":
        tk.normalizer = normalizers.NFC()
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if style == "llama3":  # Llama 3 prepends <|begin_of_text|> through its post-processor
        bos = tokens.index("<|begin_of_text|>")
        tk.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                                          special_tokens=[("<|begin_of_text|>", bos)])
        return tf.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|begin_of_text|>", eos_token="<|im_end|>")
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>")


def save_tokenizer(tok, directory: Path, *, template: str | None = CHATML_TEMPLATE, jinja_file: bool = False) -> None:
    """Save ``tok``; the chat template goes into tokenizer_config.json (the common layout of released
    models) unless ``jinja_file`` (transformers 5's chat_template.jinja)."""
    tok.save_pretrained(directory)
    if template is None:
        return
    if jinja_file:
        (Path(directory) / "chat_template.jinja").write_text(template)
        return
    cfg_path = Path(directory) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2))


@dataclass
class Folder:
    arch: str
    path: Path
    reference: torch.nn.Module  # float64, the saved weights exactly
    vocab_size: int
    config: dict


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def make_folder(arch: str, directory: Path, *, dtype: str = "F32", shard_size: str | None = None,
                style: str | None = None, tied: bool = True, seed: int = 0, n_layer: int | None = None,
                config_overrides: dict | None = None, template: str | None = CHATML_TEMPLATE) -> Folder:
    """Save a tiny random ``arch`` model with its tokenizer in ``directory`` (created)."""
    import transformers as tf

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(style or DEFAULT_STYLE[arch])
    vocab_size = len(tok)
    spec = hf_tiny.tiny_spec(arch, n_layer=n_layer, tied=tied, seed=seed)
    model = hf_tiny.build_hf(spec, vocab_size)
    for key, value in (config_overrides or {}).items():
        setattr(model.config, key, value)
    model.to(_DTYPES[dtype]).save_pretrained(directory, **({"max_shard_size": shard_size} if shard_size else {}))
    save_tokenizer(tok, directory, template=template)
    cls = getattr(tf, hf_tiny._CLASSES[arch])
    extra = {"experts_implementation": "eager"} if spec.n_expert else {}  # float64 MoE: the per-expert loop
    ref = cls.from_pretrained(directory, dtype=torch.float64, attn_implementation="eager", **extra).eval()
    return Folder(arch, directory, ref, vocab_size, json.loads((directory / "config.json").read_text()))


# ------------------------------------------------------------------------------------------------
# NextN (MTP) heads in DeepSeek-V3 naming
# ------------------------------------------------------------------------------------------------
def nextn_tensors(config: dict, layer: int, *, seed: int = 5, hidden: int | None = None,
                  own_embeddings: bool = True) -> dict[str, torch.Tensor]:
    """Random weights of one NextN module at ``model.layers.{layer}`` (the block is the config's kind)."""
    g = torch.Generator().manual_seed(seed)
    D = hidden or config["hidden_size"]
    V, F = config["vocab_size"], config["intermediate_size"]
    H, Hkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or D // H

    def w(*shape, scale=0.08):
        return scale * torch.randn(shape, generator=g, dtype=torch.float32)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float32)

    p = f"model.layers.{layer}."
    t = {
        p + "eh_proj.weight": w(D, 2 * D, scale=0.1), p + "enorm.weight": norm(D), p + "hnorm.weight": norm(D),
        p + "shared_head.norm.weight": norm(D), p + "shared_head.head.weight": w(V, D, scale=0.5),
        p + "input_layernorm.weight": norm(D), p + "post_attention_layernorm.weight": norm(D),
        p + "self_attn.q_proj.weight": w(H * hd, D, scale=0.3), p + "self_attn.k_proj.weight": w(Hkv * hd, D, scale=0.3),
        p + "self_attn.v_proj.weight": w(Hkv * hd, D), p + "self_attn.o_proj.weight": w(D, H * hd),
        p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D), p + "mlp.down_proj.weight": w(D, F),
    }
    if own_embeddings:
        t[p + "embed_tokens.weight"] = w(V, D, scale=0.5)
    if config.get("model_type") == "qwen2":
        for k, n in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
            t[p + f"self_attn.{k}_proj.bias"] = w(n, scale=0.2)
    return t


def add_nextn(folder: Folder) -> None:
    """Put a NextN module in the checkpoint itself, as layer num_hidden_layers (its own shard file)."""
    from safetensors.torch import save_file

    layer = folder.config["num_hidden_layers"]
    save_file(nextn_tensors(folder.config, layer), str(folder.path / "model-mtp.safetensors"))
    index = folder.path / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].update({k: "model-mtp.safetensors" for k in nextn_tensors(folder.config, layer)})
        index.write_text(json.dumps(data))
    folder.config["num_nextn_predict_layers"] = 1
    (folder.path / "config.json").write_text(json.dumps(folder.config, indent=2))


def head_folder(target: Folder, directory: Path, *, hidden: int | None = None, with_tokenizer: bool = False,
                seed: int = 5) -> Path:
    """An MTP head alone in a folder: the target's config.json and one layer of NextN weights."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(target.config, num_nextn_predict_layers=1)
    if hidden:
        config["hidden_size"] = hidden
        config["head_dim"] = hidden // config["num_attention_heads"]
    save_file(nextn_tensors(config, config["num_hidden_layers"], seed=seed), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if with_tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (directory / name).write_bytes((target.path / name).read_bytes())
    return directory


# ------------------------------------------------------------------------------------------------
# EAGLE-3 heads (LlamaForCausalLMEagle3, the layout SpecForge and EAGLE's trainer write)
# ------------------------------------------------------------------------------------------------
@dataclass
class Eagle3Folder:
    path: Path
    config: dict
    tensors: dict  # the saved weights, float32


def eagle3_folder(target: Folder, directory: Path, *, draft_vocab: int | None = None, layers: list[int] | None = None,
                  seed: int = 7, own_embeddings: bool = False, norm_before_residual: bool = False,
                  target_width: int | None = None, prefix: str = "midlayer.") -> Eagle3Folder:
    """A random EAGLE-3 head for ``target``: config.json and model.safetensors (no tokenizer: it drafts in the
    target's). ``draft_vocab``: a pruned draft vocabulary (every third token of the target's, with d2t/t2d)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tc = target.config
    D, V, F = tc["hidden_size"], tc["vocab_size"], tc["intermediate_size"]
    H, Hkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    hd = tc.get("head_dim") or D // H
    Dt = target_width or D
    n_aux = len(layers) if layers else 3
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.1):
        return scale * torch.randn(shape, generator=g, dtype=torch.float32)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float32)

    dv = draft_vocab or V
    p = prefix
    t = {
        p + "input_layernorm.weight": norm(D), p + "hidden_norm.weight": norm(D),
        p + "post_attention_layernorm.weight": norm(D),
        p + "self_attn.q_proj.weight": w(H * hd, 2 * D, scale=0.3), p + "self_attn.k_proj.weight": w(Hkv * hd, 2 * D, scale=0.3),
        p + "self_attn.v_proj.weight": w(Hkv * hd, 2 * D), p + "self_attn.o_proj.weight": w(D, H * hd),
        p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D), p + "mlp.down_proj.weight": w(D, F),
        "fc.weight": w(D, n_aux * Dt, scale=0.15), "norm.weight": norm(D), "lm_head.weight": w(dv, D, scale=0.5),
    }
    if draft_vocab:
        kept = torch.arange(0, V, 3)[:dv]
        t["d2t"] = (kept - torch.arange(dv)).to(torch.int64)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[kept] = True
        t["t2d"] = t2d
    if own_embeddings:
        t["embed_tokens.weight"] = w(V, D, scale=0.5)
    save_file(t, str(directory / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": D,
              "intermediate_size": F, "num_attention_heads": H, "num_key_value_heads": Hkv, "head_dim": hd,
              "num_hidden_layers": 1, "rms_norm_eps": tc.get("rms_norm_eps", 1e-6), "hidden_act": "silu",
              "max_position_embeddings": tc.get("max_position_embeddings", 256), "vocab_size": V,
              "draft_vocab_size": dv, "rope_theta": (tc.get("rope_parameters") or {}).get("rope_theta", 10000.0),
              "tie_word_embeddings": False, "norm_before_residual": norm_before_residual}
    if target_width:
        config["target_hidden_size"] = target_width
    if layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return Eagle3Folder(directory, config, {k: v.clone() for k, v in t.items()})


def random_ids(vocab_size: int, n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, n).tolist()
