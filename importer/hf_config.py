"""A Hugging Face config.json read into the hyper-parameters a GGUF carries, or refused with a reason.

The common fields are read here, the same way for every decoder; what one architecture reads beyond them, and
what it refuses, is its module's (``importer/architectures/``), through the fields of its ``ArchitectureSpec``.
Anything the engine would run differently from the reference (an unknown architecture, a RoPE scaling it lacks,
an activation it does not implement, an already-quantized checkpoint) is refused here, before a byte of weights
is read.
"""

from __future__ import annotations

from typing import Any, Mapping

from .architectures import ARCHITECTURES, HF_CLASSES, MODEL_TYPES
from .architectures.spec import ArchitectureSpec
from .hf.errors import fail
from .hf.params import ModelParams, RopeScaling, read_int, rope_entry, rope_scaling

__all__ = ["ARCHITECTURES", "ModelParams", "RopeScaling", "read_params"]


def _hf_arch(config: Mapping[str, Any], role: str) -> str:
    names = config.get("architectures") or []
    if isinstance(names, str):
        names = [names]
    if not names and isinstance(config.get("model_type"), str):
        names = [MODEL_TYPES.get(config["model_type"], config["model_type"])]
    for name in names:
        if name in HF_CLASSES:
            return name
    what = ", ".join(map(str, names)) or "none given"
    raise fail(role, f"unsupported architecture {what} in config.json (tandem imports: {', '.join(ARCHITECTURES)})")


def _refuse_quantized(config: Mapping[str, Any], role: str) -> None:
    for cfg in (config, config.get("text_config") or {}):
        q = cfg.get("quantization_config")
        if q:
            method = q.get("quant_method", "unknown") if isinstance(q, dict) else q
            raise fail(role, f"the checkpoint is already quantized (quantization_config: {method}); import its "
                             "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")


def _check_supported(cfg: Mapping[str, Any], spec: ArchitectureSpec, role: str) -> None:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or spec.default_activation
    if act not in spec.activations:
        raise fail(role, f"activation {act!r} is not supported for {spec.arch} (tandem runs: "
                         f"{', '.join(sorted(spec.activations))})")
    spec.refuse(cfg, role)
    if cfg.get("mlp_bias"):
        raise fail(role, "MLP biases (mlp_bias) are not supported")


def read_params(config: Mapping[str, Any], role: str) -> ModelParams:
    """The validated hyper-parameters of ``config`` (a parsed config.json)."""
    _refuse_quantized(config, role)
    hf_arch = _hf_arch(config, role)
    spec = HF_CLASSES[hf_arch]
    cfg = spec.text_config(config, hf_arch)
    _check_supported(cfg, spec, role)
    n_embd = read_int(cfg, "hidden_size", role)
    n_head = read_int(cfg, "num_attention_heads", role)
    if n_head == 0:
        raise fail(role, "config.json: num_attention_heads is 0")
    n_layer = read_int(cfg, "num_hidden_layers", role)
    head_dim = read_int(cfg, "head_dim", role, n_embd // n_head)
    entry, theta = rope_entry(cfg, spec.rope_layer_type)
    # Tied unless said otherwise, as transformers' PretrainedConfig defaults (a multimodal model keeps the flag on
    # its outer config), or as the architecture's config class defaults.
    tied = config.get("tie_word_embeddings", cfg.get("tie_word_embeddings", spec.tied_default))
    params = ModelParams(
        hf_arch=hf_arch,
        arch=spec.arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=read_int(cfg, "intermediate_size", role, spec.n_ff_default),
        n_head=n_head,
        n_head_kv=read_int(cfg, "num_key_value_heads", role, n_head),
        head_dim=head_dim,
        vocab_size=read_int(cfg, "vocab_size", role),
        context_length=read_int(cfg, "max_position_embeddings", role, 4096),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_base=float(theta if theta is not None else 10_000.0),
        rope_scaling=None if spec.rope_kinds is None else rope_scaling(entry, spec.arch, spec.rope_kinds, role),
        tied_output=bool(tied),
        n_nextn=read_int(cfg, "num_nextn_predict_layers", role, read_int(cfg, "mtp_num_hidden_layers", role, 0)),
    )
    return spec.finish(params, config, cfg, role)
