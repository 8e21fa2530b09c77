"""``ModelConfig``: what the shared transformer needs to know about one model, read from GGUF metadata.

Torch-free (GGUF metadata only). The fields every architecture shares are read here (``base_config``); each
architecture's module overrides the ones it deviates in.

Which weights a file holds (biases, q/k norms, a separate output head) also shapes the config; only
``engine.models.loader`` knows the tensor names, so it hands those facts in as a ``WeightLayout``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from engine.contract.gguf import GGUFFile
from engine.contract.hyperparams import Hyperparameters


class UnsupportedModelError(ValueError):
    """The GGUF describes a model this engine cannot run (with a message fit for a user)."""


class UnsupportedArchitectureError(UnsupportedModelError):
    """``general.architecture`` is not one of the architectures registered in ``engine.models``."""


@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture-of-experts FFN: each token runs through ``n_expert_used`` of ``n_expert`` SwiGLU/GeGLU
    experts of width ``n_ff_expert``, picked and weighted by a router (softmax over the experts' logits,
    top-k, optionally renormalised to sum 1, then scaled)."""

    n_expert: int
    n_expert_used: int
    n_ff_expert: int
    normalize_weights: bool = True  # renormalise the top-k probabilities (qwen3moe: always, as llama.cpp does)
    weights_scale: float = 1.0  # multiplies the routing weights after the renormalisation
    # gemma4 (26B-A4B): the experts run beside a dense FFN, each branch between its own pre and post norms,
    # and the two outputs are summed; the router reads a weightless RMSNorm of the block's residual stream
    # times a learned per-channel scale, and each chosen expert's weight is multiplied by its learned scale.
    dense_branch: bool = False
    # qwen35moe: a shared expert of this width runs on every token beside the routed ones, its output scaled
    # by sigmoid of a learned per-token gate; 0 = none.
    n_ff_shared: int = 0


@dataclass(frozen=True)
class RecurrentConfig:
    """Gated DeltaNet token mixers (qwen35): a causal depthwise conv over the fused q/k/v channels and a
    delta-rule state per value head. ``layers``: per layer, True = recurrent, False = full attention."""

    layers: tuple[bool, ...]
    conv_kernel: int  # ssm.conv_kernel
    n_k_heads: int  # ssm.group_count: q/k heads
    n_v_heads: int  # ssm.time_step_rank: value heads (a multiple of n_k_heads)
    head_k_dim: int  # ssm.state_size
    head_v_dim: int  # ssm.inner_size / n_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim


@dataclass(frozen=True)
class ModelConfig(Hyperparameters):
    """One model as the engine runs it: the hyper-parameters its GGUF states (``Hyperparameters``, shared with the
    importer, which writes them), then how its layers differ from the plain llama block."""

    v_head_dim: int
    rope_dim: int
    rope_style: str = "neox"  # 'neox' (rotate halves) | 'normal' (rotate adjacent pairs; llama GGUF layout)
    rope_base_local: float | None = None  # RoPE base of sliding-window layers (gemma3), None = rope_base
    rope_scaling: str = "none"  # 'none' | 'linear'
    rope_scale_factor: float = 1.0  # linear: positions are divided by this (global layers only)
    sliding_window: int | None = None
    local_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window (local) attention
    attn_scale: float = 0.0  # query scale; 0 = 1/sqrt(head_dim)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    tied_output: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # gemma: norms after attention and after the FFN, before the residual add
    embed_scale: float | None = None  # gemma: multiply embeddings by sqrt(n_embd)
    activation: str = "silu"  # 'silu' (SwiGLU) | 'gelu_tanh' (GeGLU)
    moe: MoEConfig | None = None  # every layer's FFN is this sparse MoE (instead of, or beside, the dense one)
    # Per-layer geometry and KV sharing (gemma4). Empty tuples: every layer uses the uniform fields above.
    layer_head_dim: tuple[int, ...] = ()  # per layer: head size of q, k and v
    layer_n_head_kv: tuple[int, ...] = ()  # per layer: K/V heads
    kv_source: tuple[int, ...] = ()  # per layer: the layer whose cached K/V it attends (itself unless shared)
    rope_dim_local: int | None = None  # RoPE dims of sliding-window layers; None = rope_dim
    rope_freqs_local: bool = True  # False: the rope_freqs factors apply to global layers only
    v_norm: bool = False  # a weightless RMSNorm over each V head (gemma4)
    per_layer_input: int = 0  # width of each layer's per-layer embedding input; 0 = none (gemma4 E models)
    # Every layer reads its K/V from another model's cache (``kv_source`` indexes that cache) and stores
    # none: the Gemma 4 assistant attends its target's K/V.
    kv_external: bool = False
    # Hybrid recurrent models (qwen35): which layers are Gated DeltaNet and their geometry; the attention
    # layers' output is gated by sigmoid(gate), the gate's rows interleaved per head with q's (attn_q).
    recurrent: RecurrentConfig | None = None
    attn_output_gate: bool = False
    # What a NextN (MTP) head reads from the target and chains on: "prenorm" (DeepSeek-V3/GLM: the target's
    # hidden state before its final norm; the head's block output chains, its shared_head_norm applies
    # only before the LM head) or "normed" (Qwen3.5/Qwen3-Next: the target's final-normed state; the head
    # ends with its own norm, whose output both feeds the LM head and chains).
    nextn_hidden: str = "prenorm"

    def is_local(self, layer: int) -> bool:
        return bool(self.local_layers) and self.local_layers[layer] and self.sliding_window is not None

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dim[layer] if self.layer_head_dim else self.head_dim

    def n_head_kv_of(self, layer: int) -> int:
        return self.layer_n_head_kv[layer] if self.layer_n_head_kv else self.n_head_kv

    def kv_layer(self, layer: int) -> int:
        """The layer whose cache entries ``layer`` reads: itself, unless it reuses an earlier layer's K/V."""
        return self.kv_source[layer] if self.kv_source else layer

    def owns_kv(self, layer: int) -> bool:
        """Whether ``layer`` computes and stores its own K/V."""
        return not self.kv_external and self.kv_layer(layer) == layer

    @property
    def uniform_kv(self) -> bool:
        """Every layer stores its own K/V of one shape (one preallocated tensor serves them all)."""
        return not (self.layer_head_dim or self.layer_n_head_kv or self.kv_source)

    @property
    def query_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)


@dataclass(frozen=True)
class WeightLayout:
    """The config's facts that come from which tensors a file holds rather than from its metadata."""

    vocab_size: int | None  # rows of the token embedding; None: take ``{arch}.vocab_size`` from the metadata
    tied_output: bool  # no separate output head: the logits reuse the token embedding
    qkv_bias: bool  # q/k/v projections carry biases
    qk_norm: bool  # per-head RMSNorm of q and k


def _uniform_int(value, what: str, path: str) -> int:
    """A per-model integer that some GGUFs store per layer as an array."""
    if value is None:
        raise UnsupportedModelError(f"{path}: GGUF metadata lacks {what}")
    if isinstance(value, (list, tuple)) or hasattr(value, "shape"):
        vals = {int(v) for v in value}
        if len(vals) != 1:
            raise UnsupportedModelError(f"{path}: per-layer {what} values {sorted(vals)} are not supported")
        return vals.pop()
    return int(value)


def per_layer_ints(value, n_layer: int, what: str, path: str, n_blocks: int | None = None) -> tuple[int, ...]:
    """A per-layer integer that a GGUF stores either once or as one entry per layer. ``n_blocks``: the
    file's block count when it also counts NextN head blocks after the layers; an array may then have
    an entry for those too, which is dropped (a head's geometry is its own block's tensors)."""
    if value is None:
        raise UnsupportedModelError(f"{path}: GGUF metadata lacks {what}")
    if isinstance(value, (list, tuple)) or hasattr(value, "shape"):
        vals = tuple(int(v) for v in value)
        if n_blocks is not None and len(vals) == n_blocks:
            vals = vals[:n_layer]
        if len(vals) != n_layer:
            raise UnsupportedModelError(f"{path}: {what} has {len(vals)} entries for {n_layer} layers")
        return vals
    return (int(value),) * n_layer


def nextn_blocks(f: GGUFFile, n_blocks: int) -> int:
    """How many of the file's ``block_count`` blocks are NextN (MTP) heads rather than layers.

    llama.cpp's converters count the heads in ``block_count`` and say how many with
    ``{arch}.nextn_predict_layers``; tandem's own importer (for DeepSeek/GLM-style heads) keeps
    ``block_count`` at the layers. The head's tensors at the last blocks tell the two apart."""
    n = int(f.arch_key("nextn_predict_layers", 0) or 0)
    if 0 < n < n_blocks and f"blk.{n_blocks - n}.nextn.eh_proj.weight" in f.tensors:
        return n
    return 0


def base_config(f: GGUFFile, layout: WeightLayout, *, per_layer_arrays: bool = False, partial_rope: bool = False,
                dense_ffn: bool = True, **overrides) -> ModelConfig:
    """The fields every architecture shares, read from ``{arch}.*`` metadata and ``layout``; ``overrides``
    replace them. ``per_layer_arrays``: the architecture reads per-layer ``head_count_kv`` and
    ``feed_forward_length`` arrays itself, so they are not refused here (the uniform fields get the
    largest entry). ``partial_rope``: the architecture rotates only the first ``rope.dimension_count`` dims
    of each head (and says so), so a smaller count is not refused. ``dense_ffn`` False: every FFN is a MoE and
    the file may have no ``feed_forward_length`` (n_ff 0 then)."""
    path = f.path
    n_blocks = _uniform_int(f.arch_key("block_count"), "block_count", path)
    n_layer = n_blocks - nextn_blocks(f, n_blocks)
    n_embd = _uniform_int(f.arch_key("embedding_length"), "embedding_length", path)
    n_head = _uniform_int(f.arch_key("attention.head_count"), "attention.head_count", path)
    if per_layer_arrays:
        n_head_kv = max(per_layer_ints(f.arch_key("attention.head_count_kv", n_head), n_layer,
                                       "attention.head_count_kv", path, n_blocks))
        n_ff = max(per_layer_ints(f.arch_key("feed_forward_length", None if dense_ffn else 0), n_layer,
                                  "feed_forward_length", path, n_blocks))
    else:
        n_head_kv = _uniform_int(f.arch_key("attention.head_count_kv", n_head), "attention.head_count_kv", path)
        n_ff = _uniform_int(f.arch_key("feed_forward_length", None if dense_ffn else 0), "feed_forward_length", path)
    head_dim = int(f.arch_key("attention.key_length", n_embd // n_head))
    v_head_dim = int(f.arch_key("attention.value_length", head_dim))
    if v_head_dim != head_dim:
        raise UnsupportedModelError(f"{path}: key_length {head_dim} != value_length {v_head_dim} is not supported")
    rope_dim = int(f.arch_key("rope.dimension_count", head_dim))
    if rope_dim != head_dim and not (partial_rope and 0 < rope_dim < head_dim and rope_dim % 2 == 0):
        raise UnsupportedModelError(f"{path}: partial RoPE (rope.dimension_count {rope_dim} < head_dim {head_dim}) "
                                    "is not supported")
    vocab_size = layout.vocab_size if layout.vocab_size is not None else int(f.arch_key("vocab_size", 0))

    # RoPE scaling: linear is a plain position divisor; anything else is refused rather than run wrong.
    scaling = f.arch_key("rope.scaling.type")
    factor = f.arch_key("rope.scaling.factor")
    if scaling is None and f.arch_key("rope.scale_linear") is not None:  # older key
        scaling, factor = "linear", f.arch_key("rope.scale_linear")
    scaling = str(scaling or "none").lower()
    factor = float(factor) if factor else 1.0
    if scaling in ("none", "") or factor == 1.0:
        scaling, factor = "none", 1.0
    elif scaling != "linear":
        raise UnsupportedModelError(f"{path}: RoPE scaling type {scaling!r} (factor {factor}) is not supported "
                                    "(supported: none, linear)")

    cfg = ModelConfig(
        arch=f.architecture,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        vocab_size=int(vocab_size),
        context_length=int(f.arch_key("context_length", 4096)),
        rms_eps=float(f.arch_key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(f.arch_key("rope.freq_base", 10000.0)),
        rope_dim=rope_dim,
        rope_scaling=scaling,
        rope_scale_factor=factor,
        attn_scale=float(f.arch_key("attention.scale", 0.0) or 0.0),
        attn_softcap=_opt_float(f.arch_key("attn_logit_softcapping")),
        final_softcap=_opt_float(f.arch_key("final_logit_softcapping")),
        tied_output=layout.tied_output,
        qkv_bias=layout.qkv_bias,
        qk_norm=layout.qk_norm,
    )
    return replace(cfg, **overrides) if overrides else cfg


def moe_config(f: GGUFFile, *, normalize_weights: bool = True) -> MoEConfig:
    """The ``{arch}.expert_*`` metadata llama.cpp's converter writes for a MoE model. ``normalize_weights``:
    the architecture's rule, which ``expert_weights_norm`` overrides when a file carries it."""
    path = f.path
    n_expert = _uniform_int(f.arch_key("expert_count"), "expert_count", path)
    n_used = _uniform_int(f.arch_key("expert_used_count"), "expert_used_count", path)
    n_ff = _uniform_int(f.arch_key("expert_feed_forward_length"), "expert_feed_forward_length", path)
    if not 0 < n_used <= n_expert:
        raise UnsupportedModelError(f"{path}: expert_used_count {n_used} with expert_count {n_expert}")
    norm = f.arch_key("expert_weights_norm")
    scale = f.arch_key("expert_weights_scale")
    return MoEConfig(n_expert=n_expert, n_expert_used=n_used, n_ff_expert=n_ff,
                     normalize_weights=normalize_weights if norm is None else bool(norm),
                     weights_scale=float(scale) if scale else 1.0)


def _opt_float(v) -> float | None:
    return float(v) if v not in (None, 0, 0.0) else None
