"""qwen35 (Qwen3.5 / Qwen3.6 dense): a hybrid of Gated DeltaNet layers and gated full attention.

As llama.cpp's converter writes it: every ``full_attention_interval``-th layer (1-based; the released
models use 4) is full attention, the others are Gated DeltaNet (``engine.models.deltanet``) with their
geometry in ``{arch}.ssm.*``. Attention layers: q/k RMSNorm, a sigmoid output gate whose rows sit beside
q's in ``attn_q`` (per head: q then gate), NEOX RoPE over the first ``rope.dimension_count`` dims of each
head only. ``rope.dimension_sections`` (multimodal RoPE) splits those dims between the temporal, height and
width positions of image tokens; for text the three positions are equal, so the sections rotate exactly as
one plain RoPE and are only checked here. Norms are stored as 1 + w (the converter adds the 1), except the
DeltaNet output norm ``ssm_norm``, stored as is, so the weights are used as stored.
"""

from __future__ import annotations

from dataclasses import replace

from engine.contract.gguf import GGUFFile
from engine.models.config import (ModelConfig, RecurrentConfig, UnsupportedModelError, WeightLayout, base_config,
                                  per_layer_ints)


def read_config(f: GGUFFile, layout: WeightLayout, *, dense_ffn: bool = True) -> ModelConfig:
    """``dense_ffn`` False (qwen35moe): no dense FFN, so no ``feed_forward_length`` is needed."""
    path = f.path
    # the layout looks at block 0, which is recurrent here: any attention block's q/k norms will do
    if not any(name.endswith(".attn_q_norm.weight") for name in f.tensors):
        raise UnsupportedModelError(f"{path}: a {f.architecture} GGUF must have attn_q_norm/attn_k_norm tensors")
    # per_layer_arrays: Ollama's converter writes head_count_kv per layer, 0 for the recurrent ones
    cfg = base_config(f, replace(layout, qk_norm=True), per_layer_arrays=True, partial_rope=True, dense_ffn=dense_ffn,
                      rope_style="neox", activation="silu", attn_output_gate=True, nextn_hidden="normed")
    interval = int(f.arch_key("full_attention_interval", 4))
    keys = {k: f.arch_key("ssm." + k) for k in ("conv_kernel", "state_size", "group_count", "time_step_rank",
                                                   "inner_size")}
    missing = [k for k, v in keys.items() if v is None]
    if missing or interval <= 0:
        raise UnsupportedModelError(f"{path}: {f.architecture} metadata lacks ssm.{', ssm.'.join(missing)}"
                                    if missing else f"{path}: full_attention_interval {interval}")
    n_k, n_v, inner = int(keys["group_count"]), int(keys["time_step_rank"]), int(keys["inner_size"])
    if n_v % n_k or inner % n_v:
        raise UnsupportedModelError(f"{path}: {n_v} value heads over {n_k} key heads, inner size {inner}")
    sections = f.arch_key("rope.dimension_sections")
    if sections is not None and sum(int(s) for s in sections) * 2 > cfg.rope_dim:
        raise UnsupportedModelError(f"{path}: rope.dimension_sections {list(sections)} exceed "
                                    f"{cfg.rope_dim} rotated dims")
    layers = tuple((i + 1) % interval != 0 for i in range(cfg.n_layer))
    kv = f.arch_key("attention.head_count_kv")
    if isinstance(kv, (list, tuple)) or hasattr(kv, "shape"):
        per_layer = per_layer_ints(kv, cfg.n_layer, "attention.head_count_kv", path, int(f.arch_key("block_count")))
        if len({n for n in per_layer if n}) != 1:
            raise UnsupportedModelError(f"{path}: attention.head_count_kv {list(per_layer)}: the attention layers "
                                        "must share one K/V head count")
        layers = tuple(n == 0 for n in per_layer)  # no K/V heads: a recurrent layer
    rec = RecurrentConfig(layers=layers,
                          conv_kernel=int(keys["conv_kernel"]), n_k_heads=n_k, n_v_heads=n_v,
                          head_k_dim=int(keys["state_size"]), head_v_dim=inner // n_v)
    return replace(cfg, recurrent=rec)
