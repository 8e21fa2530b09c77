"""The layers of hybrid recurrent models (qwen35): Gated DeltaNet, gated full attention, their block.

Built from a ``ModelConfig`` (``recurrent``, ``attn_output_gate``) and weights that are already loaded
(``engine.models.loader`` holds the GGUF names). Each layer keeps its state in a ``HybridCache``
(``engine.cache.recurrent``): attention layers their K/V in its attention slot, recurrent layers their
(conv, ssm) state in their recurrent slot.

Gated DeltaNet, per token t and value head h (q/k heads shared by ``n_v_heads / n_k_heads`` value heads):
the fused q/k/v projection goes through a causal depthwise conv (kernel ``conv_kernel``, whose state is the
last ``kernel - 1`` inputs) and SiLU; q and k are L2-normalised (q also scaled by 1/sqrt(head_k_dim));
beta = sigmoid(b), g = A * softplus(alpha + dt_bias) with A < 0 stored as is (``ssm_a`` = -exp(A_log));
S <- S * exp(g); S <- S + k (beta (v - S^T k))^T; o = S^T q; then a gated RMSNorm (norm(o) * w * silu(z))
and the output projection. Value heads are stored tiled (llama.cpp's converter: head j*n_k + g belongs to
key head g), so q/k heads are tiled to the value heads, not interleaved.

Widths up to ``EXACT_WIDTH`` (decode and verification) run that recurrence step by step and hand the cache
the state after every position (the tensors the steps produce, kept by reference), so a rejected draft
restores exactly. Wider forwards (prefill) run the chunked parallel form (the WY/UT representation within
chunks of ``CHUNK`` positions, the state carried between chunks) over all but their last position, and the
exact step over the last one, and hand over the states at those two lengths only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.cache.recurrent import HybridCache
from engine.models.config import ModelConfig
from engine.models.layers import FeedForward, ForwardStep, RMSNorm, RotaryEmbedding
from engine.ops.linear import Linear

EXACT_WIDTH = 16  # widths up to this run the exact per-token recurrence (a verification records every position)
CHUNK = 64  # chunk length of the parallel form


@dataclass
class DeltaNetWeights:
    w_in: Linear  # rows: q, k (n_k_heads * head_k_dim each), v (value dim) | z (value dim) | beta | alpha (n_v_heads)
    conv: torch.Tensor  # [conv_dim, kernel]
    a: torch.Tensor  # [n_v_heads]: A = -exp(A_log)
    dt_bias: torch.Tensor  # [n_v_heads]
    norm: torch.Tensor  # [head_v_dim]
    out: Linear


@dataclass
class HybridBlockWeights:
    attn_norm: torch.Tensor
    post_attn_norm: torch.Tensor  # the FFN's input norm (llama.cpp: post_attention_norm)
    w13: Linear | None
    w2: Linear | None
    ffn: nn.Module | None = None  # replaces FeedForward(w13, w2) (qwen35moe: engine.models.moe.SharedExpertMoE)
    deltanet: DeltaNetWeights | None = None  # recurrent layers
    wqkv: Linear | None = None  # attention layers: rows q+gate (interleaved per head), k, v
    wo: Linear | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    kind = "global"  # the model looks up a RoPE table by kind; this layer uses none

    def __init__(self, cfg: ModelConfig, slot: int, w: DeltaNetWeights):
        super().__init__()
        r = cfg.recurrent
        self.slot = slot
        self.w_in, self.out = w.w_in, w.out
        self.conv = nn.Parameter(w.conv.float(), requires_grad=False)
        self.a = nn.Parameter(w.a.float(), requires_grad=False)
        self.dt_bias = nn.Parameter(w.dt_bias.float(), requires_grad=False)
        self.norm = RMSNorm(w.norm, cfg.rms_eps)
        self.nk, self.nv, self.dk, self.dv, self.kernel = (r.n_k_heads, r.n_v_heads, r.head_k_dim, r.head_v_dim,
                                                           r.conv_kernel)
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.eps = cfg.rms_eps
        if tuple(self.conv.shape) != (r.conv_dim, r.conv_kernel):
            raise ValueError(f"conv weight {tuple(self.conv.shape)} for {r.conv_dim} channels of kernel {r.conv_kernel}")

    def forward(self, x: torch.Tensor, cache: HybridCache, step: ForwardStep, rope=None) -> torch.Tensor:
        n = x.shape[0]
        qkv, z, b, alpha = self.w_in(x).split([2 * self.key_dim + self.value_dim, self.value_dim, self.nv, self.nv],
                                              dim=-1)
        conv_state, ssm = cache.recurrent_state(self.slot)
        sd = conv_state.dtype
        # causal depthwise conv over [state | new inputs]; the window ending at position j is the next state
        xc = torch.cat((conv_state, qkv.to(sd).t()), dim=1)  # [conv_dim, kernel - 1 + n]
        mixed = F.silu(F.conv1d(xc[None], self.conv.to(sd)[:, None, :], groups=xc.shape[0])[0]).t()  # [n, conv_dim]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.nv // self.nk
        q = _l2norm(q.reshape(n, self.nk, self.dk), 1e-6).repeat(1, rep, 1) * self.dk ** -0.5
        k = _l2norm(k.reshape(n, self.nk, self.dk), 1e-6).repeat(1, rep, 1)
        v = v.reshape(n, self.nv, self.dv)
        beta = torch.sigmoid(b.to(sd))
        g = self.a.to(sd) * F.softplus(alpha.to(sd) + self.dt_bias.to(sd))  # [n, nv], <= 0
        km1 = self.kernel - 1

        def conv_at(j: int) -> torch.Tensor:  # the conv state after j of this forward's positions
            return xc[:, j:j + km1]

        if n <= EXACT_WIDTH:
            o, states = _recurrent(q, k, v, g, beta, ssm)
            # a prefill keeps the states a resume needs (its end and one before); a verification all of them
            keep = range(1, n + 1) if step.rollback else range(max(1, n - 1), n + 1)
            per = {j: (conv_at(j), states[j - 1]) for j in keep}
        else:
            # all but the last position in chunks, the last one exactly: the state one position before the
            # end is recorded too, which is where a request repeating this prompt resumes (it re-runs the
            # last prompt token for its logits)
            o, before = _chunked(q[:-1], k[:-1], v[:-1], g[:-1], beta[:-1], ssm)
            o_last, (last,) = _recurrent(q[-1:], k[-1:], v[-1:], g[-1:], beta[-1:], before)
            o = torch.cat((o, o_last))
            per = {n - 1: (conv_at(n - 1), before), n: (conv_at(n), last)}
        cache.stage(self.slot, per)
        o = self.norm(o.to(x.dtype)) * F.silu(z.view(n, self.nv, self.dv))
        return self.out(o.reshape(n, self.value_dim))


def _recurrent(q, k, v, g, beta, state):
    """The delta rule step by step: outputs [n, H, Dv] and the state after each position."""
    outs, states = [], []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        kv_mem = torch.einsum("hkv,hk->hv", state, k[t])
        delta = (v[t].to(state.dtype) - kv_mem) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
        states.append(state)
    return torch.stack(outs), states


def _chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same recurrence in chunks: within a chunk the updates are solved at once (a unit lower-triangular
    system over the chunk's positions), between chunks the state carries. Outputs [n, H, Dv], final state."""
    n = q.shape[0]
    dtype = state.dtype
    pad = (-n) % chunk
    # [H, n, d], padded to whole chunks (padding has g = 0, beta = 0: it leaves the state alone)
    q, k, v = (F.pad(t.transpose(0, 1).to(dtype), (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t.t().to(dtype), (0, pad)) for t in (g, beta))
    H, L = q.shape[0], n + pad
    c = L // chunk
    q, k, v = (t.reshape(H, c, chunk, -1) for t in (q, k, v))
    g, beta = g.reshape(H, c, chunk), beta.reshape(H, c, chunk)
    cum = g.cumsum(-1)  # log decay from the chunk start through each position
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [H, c, i, j]
    kb, vb = k * beta[..., None], v * beta[..., None]
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    a_mat = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=dtype, device=q.device)
    t_inv = torch.linalg.solve_triangular(eye + a_mat, eye.expand_as(a_mat), upper=False, unitriangular=True)
    u = t_inv @ vb  # the chunk's updates before the old state's correction
    w = t_inv @ (kb * cum.exp()[..., None])  # what the old state predicts of them
    attn = (q @ k.transpose(-1, -2)) * decay  # intra-chunk, causal (decay is 0 above the diagonal)
    q_dec = q * cum.exp()[..., None]
    k_dec = k * (cum[..., -1:] - cum).exp()[..., None]
    total = cum[..., -1].exp()
    out = torch.empty_like(v)
    for i in range(c):
        v_new = u[:, i] - w[:, i] @ state
        out[:, i] = q_dec[:, i] @ state + attn[:, i] @ v_new
        state = state * total[:, i, None, None] + k_dec[:, i].transpose(-1, -2) @ v_new
    return out.reshape(H, L, -1)[:, :n].transpose(0, 1), state


class GatedAttention(nn.Module):
    """Full attention with q/k RMSNorm, NEOX RoPE over the first ``rope_dim`` dims of each head, and a sigmoid
    gate on its output (per head and dim, rows interleaved with q's per head)."""

    kind = "global"

    def __init__(self, cfg: ModelConfig, slot: int, wqkv: Linear, wo: Linear, q_norm: torch.Tensor,
                 k_norm: torch.Tensor):
        super().__init__()
        self.slot = slot
        self.wqkv, self.wo = wqkv, wo
        self.q_norm, self.k_norm = RMSNorm(q_norm, cfg.rms_eps), RMSNorm(k_norm, cfg.rms_eps)
        self.n_head, self.n_head_kv, self.head_dim, self.rope_dim = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rope_dim
        self.scale = cfg.query_scale

    def _rope(self, x, rope: RotaryEmbedding, cos, sin):
        if self.rope_dim == self.head_dim:
            return rope.apply(x, cos, sin)
        return torch.cat((rope.apply(x[..., :self.rope_dim], cos, sin), x[..., self.rope_dim:]), dim=-1)

    def forward(self, x: torch.Tensor, cache: HybridCache, step: ForwardStep, rope: RotaryEmbedding) -> torch.Tensor:
        n, H, Hkv, D = x.shape[0], self.n_head, self.n_head_kv, self.head_dim
        qg, k, v = self.wqkv(x).split([2 * H * D, Hkv * D, Hkv * D], dim=-1)
        q, gate = qg.view(n, H, 2 * D).split([D, D], dim=-1)
        cos, sin = step.rope["global"]
        q = self._rope(self.q_norm(q.contiguous(), step.ops), rope, cos, sin)
        k = self._rope(self.k_norm(k.reshape(n, Hkv, D), step.ops), rope, cos, sin)
        keys, values = cache.store(self.slot, k.transpose(0, 1), v.reshape(n, Hkv, D).transpose(0, 1), 0)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None],
                                           attn_mask=step.mask["global"], scale=self.scale,
                                           enable_gqa=(H != Hkv))[0]
        o = o.transpose(0, 1).reshape(n, H * D) * torch.sigmoid(gate.reshape(n, H * D))
        return self.wo(o)


class HybridBlock(nn.Module):
    """Pre-norm token mixer (Gated DeltaNet or gated attention) and SwiGLU FFN, residual adds."""

    def __init__(self, cfg: ModelConfig, layer: int, w: HybridBlockWeights):
        super().__init__()
        rec = cfg.recurrent.layers
        self.layer = layer
        self.attn_norm = RMSNorm(w.attn_norm, cfg.rms_eps)
        self.ffn_norm = RMSNorm(w.post_attn_norm, cfg.rms_eps)
        if rec[layer]:
            self.attn = GatedDeltaNet(cfg, sum(rec[:layer]), w.deltanet)
        else:
            self.attn = GatedAttention(cfg, layer - sum(rec[:layer]), w.wqkv, w.wo, w.q_norm, w.k_norm)
        self.ffn = w.ffn if w.ffn is not None else FeedForward(cfg, w.w13, w.w2)

    def forward(self, x: torch.Tensor, cache: HybridCache, step: ForwardStep, rope: RotaryEmbedding) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x, step.ops), cache, step, rope)
        return x + self.ffn(self.ffn_norm(x, step.ops))
