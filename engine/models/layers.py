"""The shared pre-norm transformer layers, built from a ``ModelConfig`` and weights that are already loaded.

One block covers llama, qwen2, gemma3 and gemma4: the architectures' deviations (RoPE layout, biases, q/k/v
norms, post norms, activation, sliding-window layers, soft-capping, per-layer head sizes, layers that read
another layer's K/V, per-layer embedding inputs) are config fields. The layers take
``engine.ops.linear.Linear`` modules and plain tensors, never a file or a tensor name, so that any source
of weights (``engine.models.loader`` for GGUF, or tensors in memory) builds the same modules.

RoPE layouts. llama.cpp's converter permutes the q/k rows of llama models so that rotation pairs are
adjacent (x[2i], x[2i+1]); we keep the GGUF layout and rotate adjacent pairs ("normal"/GPT-J style) as
llama.cpp does, so loading needs no work. qwen2 and gemma3 are stored unpermuted and rotate
(x[i], x[i + d/2]) ("neox" style, HF's rotate-half).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.cache.kv import KVCache
from engine.models.config import ModelConfig, UnsupportedModelError
from engine.ops.linear import Linear


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
class ForwardStep:
    """Per-forward state shared by all layers: computed once per call by whoever runs the blocks (the
    model, or an MTP head), so each layer only looks up its attention kind's entry."""

    start: int
    n: int
    rope: dict  # 'global'/'local' -> (cos, sin)
    mask: dict  # 'global'/'local' -> bool mask [n, S] or None
    key_start: dict  # 'global'/'local' -> first cached position the layer attends to
    # engine.ops.kernels' fused block ops (f32 on the CPU), or None for PyTorch's own ops
    ops: object | None = None
    # per-layer embedding inputs [n, n_layer, per_layer_input] (gemma4 E models), or None
    per_layer: torch.Tensor | None = None
    # where the keys a reading layer attends end (exclusive); None: start + n (the Gemma 4 assistant's
    # query at the last committed position sees only the positions before it)
    key_end: int | None = None
    # Whether the caller may roll back to a position inside this forward (a verification, which asks for
    # every position's logits); a prefill chunk is only ever kept whole or resumed at its last two
    # positions, so recurrent layers need not keep their states at the others.
    rollback: bool = True


def head_step(pos: int, n: int, rope: "RotaryEmbedding", device: torch.device, dtype: torch.dtype,
              ops=None) -> ForwardStep:
    """The step of a one-layer draft head (NextN, EAGLE-3) appending ``n`` positions at ``pos`` to its own
    cache: global attention, causal from position 0."""
    cos_sin = rope.get(pos, n, device, dtype)
    mask = None
    if n > 1:
        q = torch.arange(pos, pos + n, device=device)[:, None]
        mask = torch.arange(0, pos + n, device=device)[None, :] <= q
    return ForwardStep(pos, n, {"global": cos_sin, "local": cos_sin}, {"global": mask, "local": mask},
                       {"global": 0, "local": 0}, ops)


@dataclass
class Segment:
    """One sequence's rows in a forward over several: ``rows`` of the batch, its own cache and step."""

    rows: slice
    cache: KVCache
    step: ForwardStep


@dataclass
class BatchStep:
    """A forward over several sequences' rows (``Model.forward_batch``): the linears run over all rows at
    once, each attention per segment over that sequence's cache. ``ops`` and ``per_layer`` are the
    batch's, as ForwardStep's are one sequence's."""

    segments: list[Segment]
    ops: object | None = None
    per_layer: torch.Tensor | None = None


@dataclass
class BlockWeights:
    """One block's loaded weights. The q/k/v projections are fused along the output dim (one matmul),
    and so are the FFN's gate and up projections. Optional entries are present iff the config asks for
    them (``qk_norm``, ``post_norms``, ``per_layer_input``) or the file has them (``out_scale``). A block
    whose FFN is not the dense one (a sparse MoE, ``engine.models.moe``) passes it built as ``ffn`` and no
    ``w13``/``w2``; one whose FFN norms its own input (gemma4's MoE, whose router reads the un-normed
    residual stream: ``engine.models.gemma4_moe``) passes no ``ffn_norm`` either."""

    attn_norm: torch.Tensor
    wqkv: Linear  # rows: q (n_head * head_dim), k, v (n_head_kv * head_dim each); biases if qkv_bias
    wo: Linear
    ffn_norm: torch.Tensor | None  # None: ``ffn`` takes the residual stream itself
    w13: Linear | None  # rows: gate (n_ff), up (n_ff)
    w2: Linear | None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_ffn_norm: torch.Tensor | None = None
    ffn: nn.Module | None = None  # replaces FeedForward(w13, w2): [n, n_embd] -> [n, n_embd]
    # wqkv holds q and k rows only: V is the un-normed K projection (gemma4 global layers). A layer that
    # reads another layer's K/V (``ModelConfig.owns_kv`` false) has q rows only.
    v_from_k: bool = False
    # per-layer embedding input (gemma4 E models): gate [P <- D], projection [D <- P], its norm
    ple_gate: Linear | None = None
    ple_proj: Linear | None = None
    ple_norm: torch.Tensor | None = None
    out_scale: torch.Tensor | None = None  # [1]: the block's output is multiplied by it


def _required(weight: torch.Tensor | None, what: str) -> torch.Tensor:
    if weight is None:
        raise UnsupportedModelError(f"the config asks for {what} but the weights have none")
    return weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, wqkv: Linear, wo: Linear,
                 q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, *, v_from_k: bool = False):
        super().__init__()
        self.wqkv = wqkv
        self.wo = wo
        self.layer = layer  # the cache layer this attention stores its keys and values in
        self.kv_layer = cfg.kv_layer(layer)  # the cache layer it reads them from
        self.owns_kv = cfg.owns_kv(layer)
        self.v_from_k = v_from_k
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(_required(q_norm, "a q norm"), cfg.rms_eps)
            if self.owns_kv:
                self.k_norm = RMSNorm(_required(k_norm, "a k norm"), cfg.rms_eps)
        self.v_norm_eps = cfg.rms_eps if cfg.v_norm else None
        self.n_head, self.n_head_kv, self.head_dim = cfg.n_head, cfg.n_head_kv_of(layer), cfg.head_dim_of(layer)
        self.scale = cfg.query_scale
        self.softcap = cfg.attn_softcap
        self.kind = "local" if cfg.is_local(layer) else "global"

    def forward(self, x: torch.Tensor, cache: KVCache, step: ForwardStep | BatchStep,
                rope: RotaryEmbedding) -> torch.Tensor:
        qkv = self.wqkv(x)
        if isinstance(step, BatchStep):  # several sequences' rows: one projection, attention per sequence
            o = torch.cat([self._attention(qkv[seg.rows], seg.cache, seg.step, rope) for seg in step.segments])
        else:
            o = self._attention(qkv, cache, step, rope)
        return self.wo(o)

    def _attention(self, qkv: torch.Tensor, cache: KVCache, step: ForwardStep, rope: RotaryEmbedding) -> torch.Tensor:
        """One sequence's attention over its own cache: the projected rows ``qkv`` [n, ...] in, the heads'
        outputs [n, H * D] out (before the output projection)."""
        n, H, Hkv, D = qkv.shape[0], self.n_head, self.n_head_kv, self.head_dim
        ops = step.ops
        cos, sin = step.rope[self.kind]
        if not self.owns_kv:  # K/V of an earlier layer, already written in this forward
            q = qkv.view(n, H, D)
            if self.q_norm is not None:
                q = self.q_norm(q, ops)
            q = rope.apply(q, cos, sin, ops)
            end = step.start + n if step.key_end is None else step.key_end
            keys, values = cache.read(self.kv_layer, step.key_start[self.kind], end)
            return self._attend(q, keys, values, step, n)
        v = (qkv[:, H * D:(H + Hkv) * D] if self.v_from_k else qkv[:, (H + Hkv) * D:]).view(n, Hkv, D)
        if self.v_norm_eps is not None:
            v = F.rms_norm(v.float(), (D,), None, self.v_norm_eps).to(v.dtype)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qkv[:, :H * D].view(n, H, D), ops),
                            self.k_norm(qkv[:, H * D:(H + Hkv) * D].view(n, Hkv, D), ops)), dim=1)
        else:
            qk = qkv[:, :(H + Hkv) * D].view(n, H + Hkv, D)
        q, k = rope.apply(qk, cos, sin, ops).split([H, Hkv], dim=1)  # q and k rotated in one pass
        keys, values = cache.store(self.layer, k.transpose(0, 1), v.transpose(0, 1), step.key_start[self.kind])
        return self._attend(q, keys, values, step, n)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: ForwardStep,
                n: int) -> torch.Tensor:
        """Attention of queries q [n, H, D] over keys/values [Hkv, S, D] under the step's mask: [n, H * D]."""
        H, Hkv, D = self.n_head, self.n_head_kv, self.head_dim
        mask = step.mask[self.kind]
        if step.ops is not None and self.softcap is None and step.key_end is None and \
                (mask is None or (self.kind == "global" and step.key_start["global"] == 0)):
            # one query, or causal from position 0: the queries are the last n keys, the fused op's case
            return step.ops.block_attention(q, keys, values, self.scale).view(n, H * D)
        q = q.transpose(0, 1)  # [H, n, D]
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
        return o.transpose(0, 1).reshape(n, H * D)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, w13: Linear, w2: Linear):
        super().__init__()
        self.w13 = w13
        self.w2 = w2
        if cfg.activation == "silu":
            self.act = F.silu
        elif cfg.activation == "gelu_tanh":
            self.act = lambda t: F.gelu(t, approximate="tanh")
        else:
            raise UnsupportedModelError(f"unknown activation {cfg.activation!r}")

    def forward(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """``ops``: the fused block ops (f32 on the CPU), whose ``block_silu_mul`` takes SiLU's two ops
        and their temporaries in one pass, as the native decoder stack does (the same bits)."""
        gate_up = self.w13(x)
        if ops is not None and self.act is F.silu:
            return self.w2(ops.block_silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.w2(self.act(gate) * up)


class Block(nn.Module):
    """Pre-norm attention and FFN with residual adds; ``layer`` is its index in the cache it writes."""

    def __init__(self, cfg: ModelConfig, layer: int, w: BlockWeights):
        super().__init__()
        eps = cfg.rms_eps
        self.attn_norm = RMSNorm(w.attn_norm, eps)
        self.attn = Attention(cfg, layer, w.wqkv, w.wo, w.q_norm, w.k_norm, v_from_k=w.v_from_k)
        self.ffn_norm = None if w.ffn_norm is None else RMSNorm(w.ffn_norm, eps)
        if self.ffn_norm is None and w.ffn is None:
            raise UnsupportedModelError("a dense FFN needs its norm")
        self.ffn = w.ffn if w.ffn is not None else FeedForward(cfg, _required(w.w13, "FFN weights"),
                                                                _required(w.w2, "FFN weights"))
        self.post_attn_norm = self.post_ffn_norm = None
        if cfg.post_norms:
            self.post_attn_norm = RMSNorm(_required(w.post_attn_norm, "a post-attention norm"), eps)
            self.post_ffn_norm = RMSNorm(_required(w.post_ffn_norm, "a post-FFN norm"), eps)
        self.layer = layer
        self.ple_gate = self.ple_proj = self.ple_norm = None
        if cfg.per_layer_input:
            self.ple_gate = _required(w.ple_gate, "a per-layer input gate")
            self.ple_proj = _required(w.ple_proj, "a per-layer input projection")
            self.ple_norm = RMSNorm(_required(w.ple_norm, "a per-layer input norm"), eps)
        self.out_scale = None if w.out_scale is None else nn.Parameter(w.out_scale.float(), requires_grad=False)

    def forward(self, x: torch.Tensor, cache: KVCache, step: ForwardStep, rope: RotaryEmbedding) -> torch.Tensor:
        ops = step.ops
        h = self.attn(self.attn_norm(x, ops), cache, step, rope)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h, ops)
        x = x + h
        x_ffn = x if self.ffn_norm is None else self.ffn_norm(x, ops)
        h = self.ffn(x_ffn, ops) if isinstance(self.ffn, FeedForward) else self.ffn(x_ffn)
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h, ops)
        x = x + h
        if self.ple_gate is not None:  # the layer's own slice of the per-layer embedding input, gated by x
            g = self.ffn.act(self.ple_gate(x)) * step.per_layer[:, self.layer].to(x.dtype)
            x = x + self.ple_norm(self.ple_proj(g), ops)
        if self.out_scale is not None:
            x = x * self.out_scale.to(x.dtype)
        return x
