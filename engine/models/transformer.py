"""Decoder-only transformer over GGUF weights: config, shared block, ``Model`` and ``load_model``.

One shared pre-norm block covers llama, qwen2 and gemma3; each architecture's file in ``engine/arch/``
reads its config from the GGUF metadata and declares its deviations as config fields (RoPE layout,
biases, q/k norms, post norms, activation, embedding scale, sliding-window layers, soft-capping).

``Model.forward(tokens, cache)`` appends ``n`` positions to the KV cache, starting at ``cache.length``, with
causal masking inside the batch: prefill, single-token decode and speculative verification (width k+1)
are the same call.

RoPE layouts. llama.cpp's converter permutes the q/k rows of llama models so that rotation pairs are
adjacent (x[2i], x[2i+1]); we keep the GGUF layout and rotate adjacent pairs ("normal"/GPT-J style) as
llama.cpp does, so loading needs no work. qwen2 and gemma3 are stored unpermuted and rotate
(x[i], x[i + d/2]) ("neox" style, HF's rotate-half).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.gguf import GGUFFile
from engine.cache.kv import ContextOverflowError, KVCache  # noqa: F401  (re-exported)

SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "gemma3"}


class UnsupportedModelError(ValueError):
    """The GGUF describes a model this engine cannot run (with a message fit for a user)."""


class UnsupportedArchitectureError(UnsupportedModelError):
    """``general.architecture`` is not one of SUPPORTED_ARCHITECTURES."""


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
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

    def is_local(self, layer: int) -> bool:
        return bool(self.local_layers) and self.local_layers[layer] and self.sliding_window is not None

    @property
    def query_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)


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


def base_config(f: GGUFFile, **overrides) -> ModelConfig:
    """The fields every architecture shares, read from ``{arch}.*`` metadata; ``overrides`` replace them."""
    arch = f.architecture
    path = f.path
    n_layer = _uniform_int(f.arch_key("block_count"), "block_count", path)
    n_embd = _uniform_int(f.arch_key("embedding_length"), "embedding_length", path)
    n_head = _uniform_int(f.arch_key("attention.head_count"), "attention.head_count", path)
    n_head_kv = _uniform_int(f.arch_key("attention.head_count_kv", n_head), "attention.head_count_kv", path)
    n_ff = _uniform_int(f.arch_key("feed_forward_length"), "feed_forward_length", path)
    head_dim = int(f.arch_key("attention.key_length", n_embd // n_head))
    v_head_dim = int(f.arch_key("attention.value_length", head_dim))
    if v_head_dim != head_dim:
        raise UnsupportedModelError(f"{path}: key_length {head_dim} != value_length {v_head_dim} is not supported")
    rope_dim = int(f.arch_key("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise UnsupportedModelError(f"{path}: partial RoPE (rope.dimension_count {rope_dim} < head_dim {head_dim}) "
                                    "is not supported")
    emb = f.tensors.get("token_embd.weight")
    if emb is None:
        raise UnsupportedModelError(f"{path}: GGUF has no token_embd.weight")
    vocab_size = emb.dims[1] if len(emb.dims) > 1 else int(f.arch_key("vocab_size", 0))

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
        arch=arch,
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
        tied_output="output.weight" not in f.tensors,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors,
    )
    return replace(cfg, **overrides) if overrides else cfg


def _opt_float(v) -> float | None:
    return float(v) if v not in (None, 0, 0.0) else None


def read_config(f: GGUFFile) -> ModelConfig:
    """The ModelConfig of an open GGUF, via its architecture's module in ``engine.models``."""
    from engine.models import get_arch

    return get_arch(f.architecture, f.path).read_config(f)


# ------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """x / rms(x) * w, computed in f32. The GGUF weight is used as stored (gemma GGUFs store 1 + w)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op on the hot path
            if ops is not None:
                return ops.block_rms_norm(x, self.weight, self.eps)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(x.dtype)


class RotaryEmbedding:
    """cos/sin tables for one RoPE base, built in float64, cached per (device, dtype), grown on demand."""

    def __init__(self, dim: int, base: float, style: str, *, position_scale: float = 1.0,
                 freq_factors: torch.Tensor | None = None, initial_length: int = 4096):
        if style not in ("neox", "normal"):
            raise ValueError(f"unknown RoPE style {style!r}")
        self.dim = dim
        self.style = style
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        if freq_factors is not None:  # llama 3.x "rope_freqs": per-frequency divisors
            inv_freq = inv_freq / freq_factors.to(torch.float64)
        self.inv_freq = inv_freq / position_scale
        self.length = max(int(initial_length), 1)
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _build(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(torch.arange(length, dtype=torch.float64), self.inv_freq)
        return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)

    def get(self, start: int, n: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions [start, start + n), shaped [n, 1, dim/2]."""
        end = start + n
        if end > self.length:
            while self.length < end:
                self.length *= 2
            self._tables.clear()
        key = (device, dtype)
        tables = self._tables.get(key)
        if tables is None:
            tables = self._tables[key] = self._build(self.length, device, dtype)
        cos, sin = tables
        return cos[start:end, None, :], sin[start:end, None, :]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops=None) -> torch.Tensor:
        """Rotate x [n, heads, dim] by the angles of its positions (with engine.ops.kernels' fused op
        when ``ops`` is given: one call, a contiguous result)."""
        if ops is not None:
            return ops.block_rope(x, cos, sin, self.style == "neox")
        if self.style == "neox":
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        xp = x.unflatten(-1, (-1, 2))
        x1, x2 = xp[..., 0], xp[..., 1]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


@dataclass
class _Step:
    """Per-forward state shared by all layers."""

    start: int
    n: int
    rope: dict  # 'global'/'local' -> (cos, sin)
    mask: dict  # 'global'/'local' -> bool mask [n, S] or None
    key_start: dict  # 'global'/'local' -> first cached position the layer attends to
    # engine.ops.kernels' fused block ops (f32 on the CPU), or None for PyTorch's own ops
    ops: object | None = None


class Attention(nn.Module):
    def __init__(self, f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device):
        super().__init__()
        from engine.ops.dequant import load_tensor
        from engine.ops.linear import load_linear

        p = f"blk.{i}."
        names = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
        bias = [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"] if cfg.qkv_bias else None
        self.wqkv = load_linear(f, names, fmt, bias_names=bias, device=device)
        self.wo = load_linear(f, p + "attn_output.weight", fmt, device=device)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(load_tensor(f, p + "attn_q_norm.weight"), cfg.rms_eps)
            self.k_norm = RMSNorm(load_tensor(f, p + "attn_k_norm.weight"), cfg.rms_eps)
        self.layer = i
        self.n_head, self.n_head_kv, self.head_dim = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        self.scale = cfg.query_scale
        self.softcap = cfg.attn_softcap
        self.kind = "local" if cfg.is_local(i) else "global"

    def forward(self, x: torch.Tensor, cache: KVCache, step: _Step, rope: RotaryEmbedding) -> torch.Tensor:
        n, H, Hkv, D = x.shape[0], self.n_head, self.n_head_kv, self.head_dim
        ops = step.ops
        qkv = self.wqkv(x)
        v = qkv[:, (H + Hkv) * D:].view(n, Hkv, D)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qkv[:, :H * D].view(n, H, D), ops),
                            self.k_norm(qkv[:, H * D:(H + Hkv) * D].view(n, Hkv, D), ops)), dim=1)
        else:
            qk = qkv[:, :(H + Hkv) * D].view(n, H + Hkv, D)
        cos, sin = step.rope[self.kind]
        q, k = rope.apply(qk, cos, sin, ops).split([H, Hkv], dim=1)  # q and k rotated in one pass
        keys, values = cache.store(self.layer, k.transpose(0, 1), v.transpose(0, 1), step.key_start[self.kind])
        q = q.transpose(0, 1)  # [H, n, D]
        mask = step.mask[self.kind]
        if self.softcap is None:
            o = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask,
                                               scale=self.scale, enable_gqa=(H != Hkv))[0]
        else:  # gemma2-style attention logit soft-capping: no fused kernel does it
            rep = H // Hkv
            kk = keys.repeat_interleave(rep, dim=0) if rep > 1 else keys
            vv = values.repeat_interleave(rep, dim=0) if rep > 1 else values
            s = torch.matmul(q.float(), kk.float().transpose(-1, -2)) * self.scale
            s = torch.tanh(s / self.softcap) * self.softcap
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            o = torch.matmul(torch.softmax(s, dim=-1), vv.float()).to(q.dtype)
        return self.wo(o.transpose(0, 1).reshape(n, H * D))


class FeedForward(nn.Module):
    def __init__(self, f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device):
        super().__init__()
        from engine.ops.linear import load_linear

        p = f"blk.{i}."
        self.w13 = load_linear(f, [p + "ffn_gate.weight", p + "ffn_up.weight"], fmt, device=device)
        self.w2 = load_linear(f, p + "ffn_down.weight", fmt, device=device)
        if cfg.activation == "silu":
            self.act = F.silu
        elif cfg.activation == "gelu_tanh":
            self.act = lambda t: F.gelu(t, approximate="tanh")
        else:
            raise UnsupportedModelError(f"unknown activation {cfg.activation!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(self.act(gate) * up)


class Block(nn.Module):
    def __init__(self, f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device):
        super().__init__()
        from engine.ops.dequant import load_tensor

        p = f"blk.{i}."

        def norm(name: str) -> RMSNorm:
            return RMSNorm(load_tensor(f, p + name + ".weight"), cfg.rms_eps)

        self.attn_norm = norm("attn_norm")
        self.attn = Attention(f, cfg, i, fmt, device)
        self.ffn_norm = norm("ffn_norm")
        self.ffn = FeedForward(f, cfg, i, fmt, device)
        self.post_attn_norm = norm("post_attention_norm") if cfg.post_norms else None
        self.post_ffn_norm = norm("post_ffw_norm") if cfg.post_norms else None

    def forward(self, x: torch.Tensor, cache: KVCache, step: _Step, rope: RotaryEmbedding) -> torch.Tensor:
        ops = step.ops
        h = self.attn(self.attn_norm(x, ops), cache, step, rope)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h, ops)
        x = x + h
        h = self.ffn(self.ffn_norm(x, ops))
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h, ops)
        return x + h


@dataclass
class ForwardOutput:
    """``logits``: f32 [n or 1, vocab] (None with logits_for='none'); ``hidden``: post-final-norm hidden
    states [n, D]; ``prenorm_hidden``: the last layer's output before the final norm [n, D] (what an MTP
    head consumes). Hidden states cover all n positions whatever ``logits_for`` says."""

    logits: torch.Tensor | None
    hidden: torch.Tensor
    prenorm_hidden: torch.Tensor


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------
class Model(nn.Module):
    def __init__(self, f: GGUFFile, config: ModelConfig, fmt: str, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        super().__init__()
        from engine.ops.dequant import load_tensor
        from engine.ops.linear import Embedding, load_linear

        device = torch.device(device)
        self.config = cfg = config
        self.fmt = fmt
        self.dtype = dtype
        # Embedding rows are dequantized on demand from the mmap: the GGUFFile must stay open.
        self.embed = Embedding(f, "token_embd.weight", dtype, device=device)
        blocks = []
        for i in range(cfg.n_layer):
            blocks.append(Block(f, cfg, i, fmt, device))
            f.release_pages()  # this layer's source bytes are converted: keep peak memory near the result
        self.layers = nn.ModuleList(blocks)
        self.norm = RMSNorm(load_tensor(f, "output_norm.weight"), cfg.rms_eps)
        self.output = load_linear(f, "token_embd.weight" if cfg.tied_output else "output.weight", fmt,
                                  device=device)
        f.release_pages()
        freq_factors = load_tensor(f, "rope_freqs.weight") if "rope_freqs.weight" in f.tensors else None
        init_len = min(cfg.context_length, 4096)
        self.rope_global = RotaryEmbedding(cfg.rope_dim, cfg.rope_base, cfg.rope_style,
                                           position_scale=cfg.rope_scale_factor, freq_factors=freq_factors,
                                           initial_length=init_len)
        # Sliding-window layers have their own base and no linear scaling (llama.cpp: freq_scale_swa = 1).
        if any(cfg.is_local(i) for i in range(cfg.n_layer)):
            self.rope_local = RotaryEmbedding(cfg.rope_dim, cfg.rope_base_local or cfg.rope_base, cfg.rope_style,
                                              freq_factors=freq_factors, initial_length=init_len)
        else:
            self.rope_local = self.rope_global
        self._ropes = {"global": self.rope_global, "local": self.rope_local}
        self._embed_scale = cfg.embed_scale
        self.block_ops = _block_ops_for(device, dtype)

    def use_block_ops(self, enabled: bool) -> None:
        """Switch the fused block ops on (when this device and dtype can use them) or off."""
        self.block_ops = _block_ops_for(self.device, self.dtype) if enabled else None

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def close(self) -> None:
        """Release the GGUF mapping (the model cannot run afterwards: embeddings read from it)."""
        f = getattr(self, "gguf", None)
        if f is not None:
            f.close()

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache on the model's device in its compute dtype (capacity defaults to the context)."""
        return KVCache.new(self.config, capacity or self.config.context_length, self.device, self.dtype)

    def _masks(self, start: int, n: int, device: torch.device) -> tuple[dict, dict]:
        cfg = self.config
        end = start + n
        key_start = {"global": 0, "local": 0}
        masks: dict = {"global": None, "local": None}
        if cfg.sliding_window:
            key_start["local"] = max(0, start - cfg.sliding_window + 1)
        if n == 1:  # a single query sees every key it is handed (the window is applied by key_start)
            return masks, key_start
        q = torch.arange(start, end, device=device)[:, None]
        masks["global"] = torch.arange(0, end, device=device)[None, :] <= q
        if cfg.sliding_window:
            kpos = torch.arange(key_start["local"], end, device=device)[None, :]
            masks["local"] = (kpos <= q) & (kpos > q - cfg.sliding_window)
        else:
            masks["local"] = masks["global"]
        return masks, key_start

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor | Sequence[int], cache: KVCache, *, logits_for: str = "all",
                return_hidden: bool = False) -> torch.Tensor | ForwardOutput | None:
        """Append ``tokens`` (n ids) at positions ``cache.length ..`` and return f32 logits.

        ``logits_for``: 'all' -> [n, vocab]; 'last' -> [1, vocab] (prefill); 'none' -> no lm_head.
        ``return_hidden``: return a ``ForwardOutput`` with the hidden states as well.
        Raises ``ContextOverflowError`` (before touching the cache) if the positions do not fit.
        """
        device = self.device
        if isinstance(tokens, torch.Tensor):
            ids = tokens.to(device=device, dtype=torch.long).reshape(-1)
            token_list = ids.tolist()
        else:
            token_list = [int(t) for t in tokens]
            ids = torch.tensor(token_list, dtype=torch.long, device=device)
        n = len(token_list)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if logits_for not in ("all", "last", "none"):
            raise ValueError(f"logits_for must be 'all', 'last' or 'none', not {logits_for!r}")
        cache.check_room(n)
        start = cache.length

        masks, key_start = self._masks(start, n, device)
        rope = {"global": self.rope_global.get(start, n, device, self.dtype)}
        rope["local"] = rope["global"] if self.rope_local is self.rope_global else \
            self.rope_local.get(start, n, device, self.dtype)
        step = _Step(start, n, rope, masks, key_start, self.block_ops)

        x = self.embed(ids).to(self.dtype)
        if self._embed_scale is not None:
            x = x * torch.tensor(self._embed_scale, dtype=self.dtype)
        for layer in self.layers:
            x = layer(x, cache, step, self._ropes[layer.attn.kind])
        cache.commit(token_list)

        hidden = self.norm(x, self.block_ops)
        logits = None
        if logits_for != "none":
            h = hidden[-1:] if logits_for == "last" else hidden
            logits = self.output(h).float()
            if self.config.final_softcap:
                c = self.config.final_softcap
                logits = torch.tanh(logits / c) * c
        if return_hidden:
            return ForwardOutput(logits, hidden, x)
        return logits


def _block_ops_for(device: torch.device, dtype: torch.dtype):
    """engine.ops.kernels' fused block ops where they apply (f32 on the CPU) and were built, else None."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    from engine.ops.kernels import load_block_ops

    return load_block_ops()


def default_format(f: GGUFFile, device: torch.device, role: str = "target") -> str:
    """'auto': engine.ops.linear's choice from the GGUF's linear weight types on CPU; bf16 elsewhere."""
    if device.type != "cpu":
        return "bf16"
    from engine.ops.linear import default_format as linear_default

    types = {t.type_name for name, t in f.tensors.items() if name.startswith("blk.") and len(t.dims) == 2}
    return linear_default(role, types)


def load_model(path_or_file: str | os.PathLike | GGUFFile, fmt: str = "auto", device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None, *, role: str = "target") -> Model:
    """Load a GGUF into a ``Model``.

    ``fmt``: weight format of the linear layers ('f32', 'bf16', 'bf16-packed', 'int8', 'int4', 'auto-int4');
    'auto' asks ``engine.ops.linear.default_format(role, weight types)`` on CPU (auto-int4 for Q4 files,
    bf16-packed otherwise, for a target) and is dense bf16 elsewhere. ``dtype``: compute dtype of activations and of the KV
    cache; default f32 on CPU (norms, RoPE and attention in f32 as llama.cpp does; the linears cast
    internally) and bf16 on CUDA unless fmt is 'f32'.
    """
    device = torch.device(device)
    if isinstance(path_or_file, GGUFFile):
        f, owned = path_or_file, False
    else:
        f, owned = GGUFFile(path_or_file), True
    try:
        config = read_config(f)
        if fmt == "auto":
            fmt = default_format(f, device, role)
        if dtype is None:
            dtype = torch.float32 if (device.type == "cpu" or fmt == "f32") else torch.bfloat16
        model = Model(f, config, fmt, dtype, device)
    except BaseException:
        if owned:
            f.close()
        raise
    model.source_path = f.path
    # Keep the file open with the model: some weight formats may stay as views of the mapping,
    # and the embedding reads its rows from it.
    model.gguf = f
    if device.type != "cpu":
        model.to(device)  # norms and the other small tensors; linears were built on the device
    return model.eval()
