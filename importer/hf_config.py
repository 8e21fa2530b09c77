"""A Hugging Face config.json read into the hyper-parameters a GGUF carries, or refused with a reason.

Both config layouts are read: transformers 4's (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``) and transformers 5's (``rope_parameters``, per layer type for gemma3).
Anything the engine would run differently from the reference (an unknown architecture, a RoPE
scaling it lacks, an activation it does not implement, an already-quantized checkpoint) is refused
here, before a byte of weights is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .gemma4_layout import Gemma4Layout, read_layout
from .qwen35_layout import Qwen35Layout
from .qwen35_layout import read_layout as read_qwen35_layout
from .request import CreateError

# Hugging Face model class -> GGUF architecture. The multimodal gemma3 / Qwen3.5 classes contribute their
# text model only (the vision tower is skipped).
ARCHITECTURES: Mapping[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Gemma4AssistantForCausalLM": "gemma4-assistant",
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5ForConditionalGeneration": "qwen35",
    "Qwen3_5MoeForCausalLM": "qwen35moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen35moe",
}
_MODEL_TYPES: Mapping[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                   "gemma3_text": "Gemma3ForCausalLM", "gemma3": "Gemma3ForConditionalGeneration",
                                   "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                                   "gemma4_text": "Gemma4ForCausalLM", "gemma4": "Gemma4ForConditionalGeneration",
                                   "gemma4_assistant": "Gemma4AssistantForCausalLM",
                                   "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration",
                                   "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                                   "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}

# transformers' Gemma3TextConfig defaults: the text_config of a multimodal gemma3 lists only what
# differs from them.
_GEMMA3_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 4096,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
}
_ACTIVATIONS: Mapping[str, frozenset[str]] = {
    "llama": frozenset({"silu", "swish"}),
    "qwen2": frozenset({"silu", "swish"}),
    "gemma3": frozenset({"gelu_pytorch_tanh", "gelu_tanh"}),
    "qwen3": frozenset({"silu", "swish"}),
    "qwen3moe": frozenset({"silu", "swish"}),
    "gemma4": frozenset({"gelu_pytorch_tanh", "gelu_tanh"}),
    "gemma4-assistant": frozenset({"gelu_pytorch_tanh", "gelu_tanh"}),
    "qwen35": frozenset({"silu", "swish"}),
    "qwen35moe": frozenset({"silu", "swish"}),
}
# transformers' Gemma4TextConfig defaults, for a nested text_config that lists only what differs.
_GEMMA4_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144, "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class RopeScaling:
    """``linear`` (positions divided by ``factor``) or ``llama3`` (per-frequency factors)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class ModelParams:
    """What the converter needs from config.json, already checked for what the engine can run."""

    hf_arch: str
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_scaling: RopeScaling | None
    tied_output: bool
    n_nextn: int  # num_nextn_predict_layers (mtp_num_hidden_layers): MTP heads as layers n_layer.. (may be absent)
    # gemma3 only
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window attention
    rope_base_local: float | None = None
    attn_scale: float | None = None  # set when query_pre_attn_scalar differs from head_dim
    final_softcap: float | None = None
    # sparse MoE (qwen3moe): experts per layer, per token, one expert's FFN width; 0 = dense
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    expert_weights_norm: bool = True  # the top-k routing weights are renormalised to sum 1
    gemma4: Gemma4Layout | None = None  # gemma4 / gemma4-assistant: the per-layer shape
    qwen35: Qwen35Layout | None = None  # qwen35 / qwen35moe: the hybrid layers' layout


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def _hf_arch(config: Mapping[str, Any], role: str) -> str:
    names = config.get("architectures") or []
    if isinstance(names, str):
        names = [names]
    if not names and isinstance(config.get("model_type"), str):
        names = [_MODEL_TYPES.get(config["model_type"], config["model_type"])]
    for name in names:
        if name in ARCHITECTURES:
            return name
    what = ", ".join(map(str, names)) or "none given"
    raise _fail(role, f"unsupported architecture {what} in config.json (tandem imports: {', '.join(ARCHITECTURES)})")


def _refuse_quantized(config: Mapping[str, Any], role: str) -> None:
    for cfg in (config, config.get("text_config") or {}):
        q = cfg.get("quantization_config")
        if q:
            method = q.get("quant_method", "unknown") if isinstance(q, dict) else q
            raise _fail(role, f"the checkpoint is already quantized (quantization_config: {method}); import its "
                              "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")


def _int(cfg: Mapping[str, Any], key: str, role: str, default: Any = None) -> int:
    v = cfg.get(key)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise _fail(role, f"config.json: {key} must be a non-negative integer (got {v!r})")
    return int(v)


def _rope_entry(cfg: Mapping[str, Any], layer_type: str | None) -> tuple[dict[str, Any], float | None]:
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


def _rope_scaling(entry: Mapping[str, Any], arch: str, role: str) -> RopeScaling | None:
    kind = str(entry.get("rope_type") or entry.get("type") or "default").lower()
    factor = float(entry.get("factor") or 1.0)
    if kind == "default" or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor)
    if kind == "llama3" and arch == "llama":
        return RopeScaling("llama3", factor, float(entry.get("low_freq_factor", 1.0)),
                           float(entry.get("high_freq_factor", 4.0)),
                           int(entry.get("original_max_position_embeddings", 8192)))
    raise _fail(role, f"RoPE scaling {kind!r} is not supported for {arch} (tandem runs: linear"
                      f"{', llama3' if arch == 'llama' else ''})")


def _text_config(config: Mapping[str, Any], hf_arch: str) -> dict[str, Any]:
    if hf_arch == "Gemma3ForConditionalGeneration":
        return {**_GEMMA3_DEFAULTS, **(config.get("text_config") or {})}
    if hf_arch == "Gemma3ForCausalLM":
        return {**_GEMMA3_DEFAULTS, **config}
    if hf_arch in ("Gemma4ForConditionalGeneration", "Gemma4AssistantForCausalLM"):
        return {**_GEMMA4_DEFAULTS, **(config.get("text_config") or {})}
    if hf_arch == "Gemma4ForCausalLM":
        return {**_GEMMA4_DEFAULTS, **config}
    if hf_arch.startswith("Qwen3_5") and hf_arch.endswith("ForConditionalGeneration"):
        return dict(config.get("text_config") or {})
    return dict(config)


def _check_supported(cfg: Mapping[str, Any], arch: str, role: str) -> None:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or \
        ("gelu_pytorch_tanh" if arch.startswith("gemma") else "silu")
    if act not in _ACTIVATIONS[arch]:
        raise _fail(role, f"activation {act!r} is not supported for {arch} (tandem runs: "
                          f"{', '.join(sorted(_ACTIVATIONS[arch]))})")
    if arch in ("qwen2", "qwen3", "qwen3moe") and cfg.get("use_sliding_window"):
        raise _fail(role, f"{arch} with use_sliding_window is not supported")
    if arch in ("qwen3", "qwen3moe") and cfg.get("attention_bias"):
        raise _fail(role, f"{arch} with attention_bias is not supported")
    if arch == "qwen3moe" and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
        raise _fail(role, "qwen3moe with dense layers (mlp_only_layers, decoder_sparse_step > 1) is not supported: "
                          "every layer must be a MoE layer, as llama.cpp's qwen3moe has it")
    if cfg.get("mlp_bias"):
        raise _fail(role, "MLP biases (mlp_bias) are not supported")


def _gemma3_layers(cfg: Mapping[str, Any], n_layer: int, role: str) -> tuple[bool, ...]:
    types = cfg.get("layer_types")
    if isinstance(types, list):
        if len(types) != n_layer:
            raise _fail(role, f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {n_layer}")
        return tuple(t == "sliding_attention" for t in types)
    period = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    return tuple((i + 1) % period != 0 for i in range(n_layer))


def read_params(config: Mapping[str, Any], role: str) -> ModelParams:
    """The validated hyper-parameters of ``config`` (a parsed config.json)."""
    _refuse_quantized(config, role)
    hf_arch = _hf_arch(config, role)
    arch = ARCHITECTURES[hf_arch]
    cfg = _text_config(config, hf_arch)
    _check_supported(cfg, arch, role)
    n_embd = _int(cfg, "hidden_size", role)
    n_head = _int(cfg, "num_attention_heads", role)
    if n_head == 0:
        raise _fail(role, "config.json: num_attention_heads is 0")
    n_layer = _int(cfg, "num_hidden_layers", role)
    head_dim = _int(cfg, "head_dim", role, n_embd // n_head)
    rope_entry, theta = _rope_entry(cfg, "full_attention" if arch.startswith("gemma") else None)
    # Tied unless said otherwise, as transformers' PretrainedConfig defaults (a multimodal gemma3 keeps
    # the flag on its outer config).
    # Qwen3.5's configs default to untied (transformers' Qwen3_5*Config).
    tied = config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", not arch.startswith("qwen35")))
    params = ModelParams(
        hf_arch=hf_arch,
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=_int(cfg, "intermediate_size", role, 0 if arch == "qwen35moe" else None),  # no dense FFN
        n_head=n_head,
        n_head_kv=_int(cfg, "num_key_value_heads", role, n_head),
        head_dim=head_dim,
        vocab_size=_int(cfg, "vocab_size", role),
        context_length=_int(cfg, "max_position_embeddings", role, 4096),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_base=float(theta if theta is not None else 10_000.0),
        # gemma4's "proportional" RoPE is its layout's (a rope_freqs tensor), not a scaling
        rope_scaling=None if arch.startswith("gemma4") else _rope_scaling(rope_entry, arch, role),
        tied_output=bool(tied),
        n_nextn=_int(cfg, "num_nextn_predict_layers", role, _int(cfg, "mtp_num_hidden_layers", role, 0)),
    )
    if arch == "qwen3moe":
        return _moe_params(params, cfg, role)
    if arch in ("qwen35", "qwen35moe"):
        from dataclasses import replace

        layout = read_qwen35_layout(cfg, n_layer, head_dim, arch == "qwen35moe", role)
        params = replace(params, qwen35=layout)
        return replace(_moe_params(params, cfg, role), expert_weights_norm=True) if arch == "qwen35moe" else params
    if arch in ("gemma4", "gemma4-assistant"):
        return _gemma4_params(params, config, cfg, role)
    if arch != "gemma3":
        return params
    return _gemma3_params(params, cfg, role)


def _moe_params(params: ModelParams, cfg: Mapping[str, Any], role: str) -> ModelParams:
    from dataclasses import replace

    # released checkpoints say num_experts; transformers 5 saves num_local_experts
    key = "num_experts" if cfg.get("num_experts") is not None else "num_local_experts"
    n_expert = _int(cfg, key, role)
    n_used = _int(cfg, "num_experts_per_tok", role)
    if not 0 < n_used <= n_expert:
        raise _fail(role, f"config.json: num_experts_per_tok {n_used} with {n_expert} experts")
    return replace(params, n_expert=n_expert, n_expert_used=n_used,
                   n_ff_expert=_int(cfg, "moe_intermediate_size", role),
                   expert_weights_norm=bool(cfg.get("norm_topk_prob", False)))  # transformers default


def _gemma3_params(params: ModelParams, cfg: Mapping[str, Any], role: str) -> ModelParams:
    from dataclasses import replace

    local_entry, local_theta = _rope_entry(cfg, "sliding_attention")
    if _rope_scaling(local_entry, "gemma3", role) is not None:
        raise _fail(role, "RoPE scaling on gemma3's sliding-window layers is not supported")
    scalar = cfg.get("query_pre_attn_scalar")
    attn_scale = None
    if scalar and float(scalar) != params.head_dim:
        attn_scale = 1.0 / math.sqrt(float(scalar))
    window = cfg.get("sliding_window")
    softcap = cfg.get("final_logit_softcapping")
    return replace(
        params,
        sliding_window=int(window) if window else None,
        sliding_layers=_gemma3_layers(cfg, params.n_layer, role) if window else (),
        rope_base_local=float(local_theta if local_theta is not None else 10_000.0),
        attn_scale=attn_scale,
        final_softcap=float(softcap) if softcap else None,
    )


def _gemma4_params(params: ModelParams, config: Mapping[str, Any], cfg: Mapping[str, Any], role: str) -> ModelParams:
    """gemma4's per-layer shape; an assistant also names the target width it works in
    (``backbone_hidden_size``, written as ``embedding_length_out``)."""
    from dataclasses import replace

    embd_out = 0
    if params.arch == "gemma4-assistant":
        embd_out = _int(config, "backbone_hidden_size", role)
        if embd_out == 0:
            raise _fail(role, "config.json: the assistant's backbone_hidden_size (its target's width) is missing")
        if not params.tied_output:
            # llama.cpp's gemma4-assistant, like tandem's, scores through the tied token_embd: an lm_head of its
            # own would be ignored, not run
            raise _fail(role, "a Gemma 4 assistant with its own lm_head (tie_word_embeddings false) is not supported")
    layout = read_layout(cfg, params.n_layer, role, embd_out)
    return replace(params, gemma4=layout, n_ff=layout.layers[0].n_ff if layout.layers else params.n_ff,
                   sliding_window=layout.sliding_window, final_softcap=layout.final_softcap)
