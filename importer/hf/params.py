"""The hyper-parameters every decoder's config.json yields, and the config readers the architectures share.

Both config layouts are read: transformers 4's (``rope_theta``, ``rope_scaling``, ``rope_local_base_freq``) and
transformers 5's (``rope_parameters``, per layer type where a model has several). What one architecture reads
beyond these (gemma3's sliding layers, gemma4's per-layer shape, Qwen3.5's hybrid layout) is its module's, in
``importer/architectures/``, and travels in ``ModelParams.layout``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from engine.contract.hyperparams import Hyperparameters

from .errors import fail


@dataclass(frozen=True)
class RopeScaling:
    """``linear`` (positions divided by ``factor``) or ``llama3`` (per-frequency factors)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class ModelParams(Hyperparameters):
    """What the converter needs from config.json, already checked for what the engine can run: the hyper-parameters
    every decoder GGUF states (``Hyperparameters``, shared with the engine's ``ModelConfig``), then the rest."""

    hf_arch: str
    rope_scaling: RopeScaling | None
    tied_output: bool
    n_nextn: int  # num_nextn_predict_layers (mtp_num_hidden_layers): MTP heads as layers n_layer.. (may be absent)
    # sparse MoE (qwen3moe, qwen35moe): experts per layer, per token, one expert's FFN width; 0 = dense
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    expert_weights_norm: bool = True  # the top-k routing weights are renormalised to sum 1
    n_embd_out: int = 0  # a drafter-only architecture: the target width it reads and writes (0: not a drafter)
    layout: Any = None  # the architecture's own shape beyond these numbers (its module's dataclass), or None


def read_int(cfg: Mapping[str, Any], key: str, role: str, default: Any = None) -> int:
    v = cfg.get(key)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise fail(role, f"config.json: {key} must be a non-negative integer (got {v!r})")
    return int(v)


def rope_entry(cfg: Mapping[str, Any], layer_type: str | None) -> tuple[dict[str, Any], float | None]:
    """(scaling dict, theta) for a layer type (None = the model's one RoPE), in either config layout."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        elif any(isinstance(v, dict) for v in params.values()):
            params = params.get("full_attention") or {}
        return dict(params), params.get("rope_theta")
    if layer_type == "sliding_attention":
        return {}, cfg.get("rope_local_base_freq")
    scaling = cfg.get("rope_scaling")
    return (dict(scaling) if isinstance(scaling, dict) else {}), cfg.get("rope_theta")


def rope_scaling(entry: Mapping[str, Any], arch: str, kinds: tuple[str, ...], role: str) -> RopeScaling | None:
    """The RoPE scaling of ``entry``, refused unless its kind is among ``kinds`` (``linear``, ``llama3``)."""
    kind = str(entry.get("rope_type") or entry.get("type") or "default").lower()
    factor = float(entry.get("factor") or 1.0)
    if kind == "default" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear" and kind in kinds:
        return RopeScaling("linear", factor)
    if kind == "llama3" and kind in kinds:
        return RopeScaling("llama3", factor, float(entry.get("low_freq_factor", 1.0)),
                           float(entry.get("high_freq_factor", 4.0)),
                           int(entry.get("original_max_position_embeddings", 8192)))
    raise fail(role, f"RoPE scaling {kind!r} is not supported for {arch} (tandem runs: {', '.join(kinds)})")


def moe_params(params: ModelParams, cfg: Mapping[str, Any], role: str) -> ModelParams:
    """``params`` with the sparse MoE fields of a Qwen-style config (every layer a MoE layer)."""
    # released checkpoints say num_experts; transformers 5 saves num_local_experts
    key = "num_experts" if cfg.get("num_experts") is not None else "num_local_experts"
    n_expert = read_int(cfg, key, role)
    n_used = read_int(cfg, "num_experts_per_tok", role)
    if not 0 < n_used <= n_expert:
        raise fail(role, f"config.json: num_experts_per_tok {n_used} with {n_expert} experts")
    return replace(params, n_expert=n_expert, n_expert_used=n_used,
                   n_ff_expert=read_int(cfg, "moe_intermediate_size", role),
                   expert_weights_norm=bool(cfg.get("norm_topk_prob", False)))  # transformers default
