"""Tiny Gemma 4 Hugging Face folders for the importer: ``Gemma4ForCausalLM`` (the ``e2b`` / ``31b`` / ``26b``
variants of ``tests.hf_tiny_gemma4``), the text model inside a ``Gemma4ForConditionalGeneration``, and a
``Gemma4AssistantForCausalLM`` for such a target, each saved with ``save_pretrained`` beside a Gemma 4 style
tokenizer.json (byte-fallback BPE with merges, spaces as ``▁``, newline runs kept apart), and the float64
reference loaded back from the saved files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tests import hf_tiny_gemma4 as g4

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}
SAMPLE = "the define and return of a thing\n\nre tu rn  x? <|turn>model\nünï 日 <turn|>\n"


def make_tokenizer():
    """The tiny gemma4 vocabulary as a transformers fast tokenizer, laid out like Gemma 4's tokenizer.json."""
    import transformers as tf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokens, types, _, merges = g4.gemma4_vocab()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges],
                     unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tk = Tokenizer(bpe)
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty in (2, 3)])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("\n", "\n\n")])
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", 2)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                      pad_token="<pad>")


def _save(model: torch.nn.Module, directory: Path, dtype: str, shard_size: str | None, tokenizer: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.to(_DTYPES[dtype]).save_pretrained(directory, **({"max_shard_size": shard_size} if shard_size else {}))
    if tokenizer:
        make_tokenizer().save_pretrained(directory)
        cfg_path = directory / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = g4.CHAT_TEMPLATE
        cfg_path.write_text(json.dumps(cfg, indent=2))


@dataclass
class Gemma4Folder:
    path: Path
    reference: torch.nn.Module  # float64, from the saved files
    config: object  # the Gemma4TextConfig
    vocab_size: int


def make_gemma4_folder(variant: str, directory: Path, *, dtype: str = "F32", shard_size: str | None = None,
                       seed: int = 0, multimodal: bool = False, rope_factor: float | None = None,
                       **overrides) -> Gemma4Folder:
    """A tiny ``Gemma4ForCausalLM`` (or, ``multimodal``, a ``Gemma4ForConditionalGeneration`` with a tiny vision
    tower) saved in ``directory``; ``reference`` is the text model loaded back as ``Gemma4ForCausalLM``.
    ``rope_factor``: the global layers' proportional RoPE scaled by that factor."""
    import transformers as tf

    directory = Path(directory)
    vocab_size = len(g4.gemma4_vocab()[0])
    cfg = g4.hf_text_config(variant, vocab_size, **overrides)
    if rope_factor is not None:
        cfg.rope_parameters["full_attention"]["factor"] = rope_factor
    torch.manual_seed(seed)
    extra = {"experts_implementation": "eager"} if cfg.enable_moe_block else {}  # grouped_mm takes no float64
    hf = tf.Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64, **extra)
    g4.randomize(hf, seed + 1)
    if multimodal:
        vision = tf.Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=2, head_dim=8)
        mm = tf.Gemma4ForConditionalGeneration._from_config(
            tf.Gemma4Config(text_config=cfg, vision_config=vision, audio_config=None), dtype=torch.float64)
        mm.model.language_model.load_state_dict(hf.model.state_dict())
        _save(mm, directory, dtype, shard_size, tokenizer=True)
    else:
        _save(hf, directory, dtype, shard_size, tokenizer=True)
    ref = tf.Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64, **extra)
    ref.model.load_state_dict(hf.model.to(_DTYPES[dtype]).double().state_dict())
    return Gemma4Folder(directory, ref.double().eval(), cfg, vocab_size)


def make_assistant_folder(target: Gemma4Folder, directory: Path, *, seed: int = 5, backbone: int | None = None,
                          dtype: str = "F32", tokenizer: bool = False, ordered: bool = False
                          ) -> tuple[Path, torch.nn.Module]:
    """A tiny ``Gemma4AssistantForCausalLM`` for ``target`` (its K/V heads and head sizes), saved in ``directory``
    (without tokenizer files unless ``tokenizer``: it speaks its target's vocabulary), and its float64 reference
    loaded back; ``backbone`` claims another target width. ``ordered``: the centroid "ordered embeddings" head
    (107 centroids of 3 tokens, the top 4 scored), as the E2B/E4B assistants ship it."""
    import transformers as tf

    tcfg = target.config
    kv = {t: tcfg.per_layer_config[tcfg.layer_types.index(t)].num_key_value_heads for t in set(tcfg.layer_types)}
    extra = {}
    if kv["full_attention"] != kv["sliding_attention"]:
        extra = dict(attention_k_eq_v=True, num_global_key_value_heads=kv["full_attention"])
    text = tf.Gemma4TextConfig(
        vocab_size=target.vocab_size, hidden_size=g4.ASSISTANT_EMBD, intermediate_size=48,
        num_hidden_layers=len(g4.ASSISTANT_LAYER_TYPES), num_attention_heads=2,
        num_key_value_heads=kv["sliding_attention"], head_dim=g4.HEAD_SWA, global_head_dim=g4.HEAD_FULL,
        layer_types=list(g4.ASSISTANT_LAYER_TYPES), sliding_window=g4.WINDOW, max_position_embeddings=g4.CONTEXT,
        rms_norm_eps=1e-6, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        num_kv_shared_layers=len(g4.ASSISTANT_LAYER_TYPES), tie_word_embeddings=True,
        rope_parameters=tcfg.rope_parameters, pad_token_id=0, bos_token_id=2, eos_token_id=1, **extra)
    cfg = tf.Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone or g4.N_EMBD,
                                   use_ordered_embeddings=ordered, num_centroids=107, centroid_intermediate_top_k=4)
    torch.manual_seed(seed)
    hf = tf.Gemma4AssistantForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64)
    g4.randomize(hf, seed + 1)
    if ordered:
        with torch.no_grad():
            hf.masked_embedding.token_ordering.copy_(torch.randperm(target.vocab_size))
    _save(hf, Path(directory), dtype, None, tokenizer=tokenizer)
    ref = tf.Gemma4AssistantForCausalLM.from_pretrained(directory, dtype=torch.float64, attn_implementation="eager")
    return Path(directory), ref.eval()
