"""The hybrid layout of a Qwen3.5 / Qwen3.6 config.json (Gated DeltaNet + gated attention), or a refusal.

What the engine's qwen35/qwen35moe read from a GGUF beyond the common fields: which layers are full attention
(every ``full_attention_interval``-th, 1-based: the engine cannot express another pattern), the DeltaNet
geometry (``ssm.*``), the partial RoPE width and the mRoPE sections, and for MoE the shared expert's width.
Both config spellings are read: transformers 5's ``rope_parameters`` and the older top-level
``partial_rotary_factor`` / ``rope_scaling.mrope_section``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .request import CreateError

_LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen35Layout:
    interval: int  # full_attention_interval: layer i is full attention when (i + 1) % interval == 0
    recurrent: tuple[bool, ...]  # per layer: True = Gated DeltaNet
    conv_kernel: int
    n_k_heads: int  # linear_num_key_heads
    n_v_heads: int  # linear_num_value_heads
    head_k_dim: int
    head_v_dim: int
    rope_dim: int  # rotated dims of each attention head (partial_rotary_factor * head_dim)
    rope_sections: tuple[int, ...]  # mrope_section + [0], or () without mRoPE
    n_ff_shared: int = 0  # MoE: the shared expert's width (0: dense)

    @property
    def conv_channels(self) -> int:
        """q, k and v of the fused projection, which the short conv runs over."""
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def _pos_int(cfg: Mapping[str, Any], key: str, role: str, default: Any = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v <= 0:
        raise _fail(role, f"config.json: {key} must be a positive integer (got {v!r})")
    return int(v)


def _interval(cfg: Mapping[str, Any], n_layer: int, role: str) -> int:
    """full_attention_interval, checked against layer_types where both are given."""
    types = cfg.get("layer_types")
    given = cfg.get("full_attention_interval")
    if not isinstance(types, list):
        return _pos_int(cfg, "full_attention_interval", role, 4)
    if len(types) != n_layer:
        raise _fail(role, f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {n_layer}")
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        raise _fail(role, f"config.json: layer type {bad[0]!r} is not supported (tandem runs: "
                          f"{', '.join(_LAYER_TYPES)})")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    interval = int(given) if isinstance(given, int) and given > 0 else (full[0] + 1 if full else n_layer + 1)
    if [i for i in range(n_layer) if (i + 1) % interval == 0] != full:
        raise _fail(role, "config.json: layer_types must put full attention on every "
                          f"{'full_attention_interval-th' if given else 'n-th'} layer (1-based), "
                          f"the only pattern tandem's qwen35 runs; got full attention on layers {full}")
    return interval


def _rope(cfg: Mapping[str, Any], head_dim: int, role: str) -> tuple[int, tuple[int, ...]]:
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    # transformers' Qwen3_5TextConfig defaults it to 0.25 (what every released model uses)
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise _fail(role, f"config.json: partial_rotary_factor must be in (0, 1] (got {factor!r})")
    rope_dim = int(head_dim * factor)
    if rope_dim % 2 or rope_dim == 0:
        raise _fail(role, f"config.json: partial_rotary_factor {factor} rotates {rope_dim} of {head_dim} dims "
                          "(an even, non-zero count is needed)")
    section = params.get("mrope_section", scaling.get("mrope_section"))
    if section is None:
        return rope_dim, ()
    if (not isinstance(section, list) or not 1 <= len(section) <= 4
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)):
        raise _fail(role, f"config.json: mrope_section {section!r} is not a list of up to 4 counts")
    if 2 * sum(section) > rope_dim:
        raise _fail(role, f"config.json: mrope_section {section} spans more than the {rope_dim} rotated dims")
    return rope_dim, tuple(section) + (0,) * (4 - len(section))


def read_layout(cfg: Mapping[str, Any], n_layer: int, head_dim: int, moe: bool, role: str) -> Qwen35Layout:
    """The layout of a Qwen3.5 text config (``cfg`` is the text_config of a multimodal checkpoint)."""
    if cfg.get("attention_bias"):
        raise _fail(role, "qwen35 with attention_bias is not supported")
    if moe and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
        raise _fail(role, "qwen35moe with dense layers (mlp_only_layers, decoder_sparse_step > 1) is not supported: "
                          "every layer must be a MoE layer, as llama.cpp's qwen35moe has it")
    interval = _interval(cfg, n_layer, role)
    n_k = _pos_int(cfg, "linear_num_key_heads", role)
    n_v = _pos_int(cfg, "linear_num_value_heads", role)
    if n_v % n_k:
        raise _fail(role, f"config.json: {n_v} linear value heads do not divide over {n_k} key heads")
    rope_dim, sections = _rope(cfg, head_dim, role)
    return Qwen35Layout(
        interval=interval,
        recurrent=tuple((i + 1) % interval != 0 for i in range(n_layer)),
        conv_kernel=_pos_int(cfg, "linear_conv_kernel_dim", role, 4),
        n_k_heads=n_k, n_v_heads=n_v,
        head_k_dim=_pos_int(cfg, "linear_key_head_dim", role),
        head_v_dim=_pos_int(cfg, "linear_value_head_dim", role),
        rope_dim=rope_dim, rope_sections=sections,
        n_ff_shared=_pos_int(cfg, "shared_expert_intermediate_size", role) if moe else 0,
    )
