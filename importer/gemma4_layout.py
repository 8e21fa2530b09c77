"""A Gemma 4 text config.json (``Gemma4ForCausalLM``, the text model of ``Gemma4ForConditionalGeneration``, or the
text model of a ``Gemma4AssistantForCausalLM``) read into its per-layer shape, or refused with a reason.

Gemma 4's layers are not all alike, so one set of numbers (``ModelParams``) cannot describe it: sliding and
global layers have their own head size and K/V head count (transformers keeps the global ones in
``per_layer_config``, or derives them from ``global_head_dim`` / ``num_global_key_value_heads`` when a config
predates it), global layers of a K = V model have no ``v_proj``, the last ``num_kv_shared_layers`` layers
have no K/V projections of their own and, with ``use_double_wide_mlp``, a doubled FFN; with ``enable_moe_block``
(the 26B-A4B) every layer also runs a sparse mixture of experts beside its dense FFN. This module resolves all of
that the way transformers' ``Gemma4TextConfig`` does, so the converter only checks tensors against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .request import CreateError

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma4Layer:
    sliding: bool
    head_dim: int
    n_head_kv: int
    n_ff: int
    kv_shared: bool  # reuses an earlier layer's K/V: no k/v projections, no k_norm
    k_eq_v: bool  # global layer of a K = V model: no v_proj


@dataclass(frozen=True)
class Gemma4Layout:
    layers: tuple[Gemma4Layer, ...]
    sliding_window: int
    n_kv_shared: int
    rope_base: float
    rope_base_swa: float
    head_dim_full: int  # the global layers' head size (rope dimension count, key_length)
    head_dim_swa: int
    rotary_fraction: float  # of the global head that RoPE rotates ("proportional" RoPE)
    rope_factor: float  # proportional RoPE's ``factor``: the rotated frequencies are divided by it
    final_softcap: float | None
    n_embd_per_layer: int  # per-layer embedding width (E models), 0 = none
    vocab_per_layer: int
    embd_out: int = 0  # assistant: the target's width it reads and writes (backbone_hidden_size); 0 = a model
    # the 26B-A4B's experts beside every layer's dense FFN (enable_moe_block); 0 experts = a dense model
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def refuse_unsupported(cfg: Mapping[str, Any], role: str) -> None:
    """What tandem's gemma4 model does not run: bidirectional attention, attention biases."""
    if cfg.get("use_bidirectional_attention"):
        raise _fail(role, "gemma4 with use_bidirectional_attention is not supported")
    if cfg.get("attention_bias"):
        raise _fail(role, "gemma4 with attention_bias is not supported")


def _positive(cfg: Mapping[str, Any], key: str, role: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _fail(role, f"config.json: {key} must be a positive integer with enable_moe_block (got {v!r})")
    return v


def _experts(cfg: Mapping[str, Any], role: str, assistant: bool) -> tuple[int, int, int]:
    """(experts, experts per token, one expert's FFN width), all 0 for a dense model. As in transformers, only
    ``enable_moe_block`` builds the experts: ``num_experts`` alone leaves the model dense."""
    if not cfg.get("enable_moe_block"):
        return 0, 0, 0
    if assistant:
        raise _fail(role, "a Gemma 4 assistant with mixture-of-experts layers (enable_moe_block) is not supported")
    n_expert, n_used = _positive(cfg, "num_experts", role), _positive(cfg, "top_k_experts", role)
    if n_used > n_expert:
        raise _fail(role, f"config.json: top_k_experts {n_used} with {n_expert} experts")
    return n_expert, n_used, _positive(cfg, "moe_intermediate_size", role)


def _rope(cfg: Mapping[str, Any], layer_type: str, role: str) -> tuple[float, float, float]:
    """(theta, rotated fraction of the head, frequency divisor) for one layer type."""
    params = cfg.get("rope_parameters") or {}
    entry = params.get(layer_type) if isinstance(params.get(layer_type), dict) else {}
    defaults = {SLIDING: ("default", 10_000.0, 1.0), FULL: ("proportional", 1_000_000.0, 0.25)}[layer_type]
    if not entry:
        entry = {"rope_type": defaults[0], "rope_theta": defaults[1], "partial_rotary_factor": defaults[2]}
    kind = str(entry.get("rope_type") or "default")
    theta = float(entry.get("rope_theta") or defaults[1])
    if layer_type == SLIDING and kind != "default":
        raise _fail(role, f"RoPE {kind!r} on gemma4's sliding layers is not supported")
    if layer_type == FULL and kind not in ("default", "proportional"):
        raise _fail(role, f"RoPE {kind!r} on gemma4's global layers is not supported (tandem runs: proportional)")
    factor = float(entry.get("factor") or 1.0)
    if factor != 1.0 and kind != "proportional":
        raise _fail(role, f"RoPE scaling factors on gemma4's {'sliding' if layer_type == SLIDING else 'global'} "
                          "layers are only supported with proportional RoPE")
    fraction = float(entry.get("partial_rotary_factor", 1.0)) if kind == "proportional" else 1.0
    return theta, fraction, factor


def _layer_types(cfg: Mapping[str, Any], n_layer: int, role: str) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(n_layer)]
    if len(types) != n_layer or any(t not in (SLIDING, FULL) for t in types):
        raise _fail(role, f"config.json: layer_types must list {n_layer} sliding_attention/full_attention entries")
    types = list(types)
    types[-1] = FULL  # as transformers forces it
    return types


def _overrides(cfg: Mapping[str, Any], types: list[str]) -> dict[int, Mapping[str, Any]]:
    """Per-layer overrides of head_dim / num_key_value_heads, as transformers' __post_init__ derives them."""
    given = cfg.get("per_layer_config")
    if isinstance(given, dict):
        return {int(k): v for k, v in given.items() if isinstance(v, dict)}
    over: dict[str, Any] = {"head_dim": cfg.get("global_head_dim", 512)}
    if cfg.get("attention_k_eq_v", True) and cfg.get("num_global_key_value_heads") is not None:
        over["num_key_value_heads"] = cfg["num_global_key_value_heads"]
    return {i: over for i, t in enumerate(types) if t == FULL}


def read_layout(cfg: Mapping[str, Any], n_layer: int, role: str, embd_out: int = 0) -> Gemma4Layout:
    """The per-layer shape of a Gemma 4 text config (already merged with its defaults)."""
    refuse_unsupported(cfg, role)
    types = _layer_types(cfg, n_layer, role)
    over = _overrides(cfg, types)
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    if not 0 <= shared <= n_layer:
        raise _fail(role, f"config.json: num_kv_shared_layers {shared} with {n_layer} layers")
    if shared and shared < n_layer and set(types[:n_layer - shared]) != set(types):
        raise _fail(role, "config.json: a KV-shared layer type has no earlier layer of its type to share from")
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    base_ff = int(cfg["intermediate_size"])
    layers = []
    for i, t in enumerate(types):
        o = over.get(i, {})
        is_shared = i >= n_layer - shared
        ff = int(o.get("intermediate_size", base_ff * (2 if cfg.get("use_double_wide_mlp") and is_shared else 1)))
        layers.append(Gemma4Layer(sliding=t == SLIDING, head_dim=int(o.get("head_dim", cfg["head_dim"])),
                                  n_head_kv=int(o.get("num_key_value_heads", cfg["num_key_value_heads"])),
                                  n_ff=ff, kv_shared=is_shared, k_eq_v=k_eq_v and t == FULL))
    dims = {t: {layer.head_dim for layer in layers if layer.sliding == (t == SLIDING)} for t in set(types)}
    if any(len(d) != 1 for d in dims.values()):
        raise _fail(role, "config.json: layers of one attention type with different head sizes are not supported")
    theta, _, _ = _rope(cfg, SLIDING, role)
    theta_full, fraction, factor = _rope(cfg, FULL, role)
    head_full = dims.get(FULL, dims.get(SLIDING)).copy().pop()
    head_swa = dims.get(SLIDING, dims.get(FULL)).copy().pop()
    softcap = cfg.get("final_logit_softcapping")
    ple = int(cfg.get("hidden_size_per_layer_input") or 0)
    n_expert, n_used, ff_expert = _experts(cfg, role, assistant=embd_out > 0)
    return Gemma4Layout(
        layers=tuple(layers), sliding_window=int(cfg.get("sliding_window") or 512), n_kv_shared=shared,
        rope_base=theta_full, rope_base_swa=theta, head_dim_full=head_full, head_dim_swa=head_swa,
        rotary_fraction=fraction, rope_factor=factor, final_softcap=float(softcap) if softcap else None, n_embd_per_layer=ple,
        vocab_per_layer=int(cfg.get("vocab_size_per_layer_input") or 0) if ple else 0, embd_out=embd_out,
        n_expert=n_expert, n_expert_used=n_used, n_ff_expert=ff_expert)
