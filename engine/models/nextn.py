"""A NextN multi-token-prediction head (DeepSeek-V3 / GLM, Qwen3.5): one extra transformer block fed by a
target model.

Entry j of its KV cache is the "pair" (h_j, t_{j+1}): the target's hidden state at position j and the
embedding of the token that followed, combined as ``eh_proj([enorm(embed(t_{j+1})), hnorm(h_j)])`` and run
through the block at position j. The block's output g_j, through the head's norm and output projection,
predicts t_{j+2}. What the head leaves out (its own output norm and projection, its own embedding) it shares
with the target.

Two families differ in where the norms sit (``ModelConfig.nextn_hidden``): DeepSeek/GLM heads read the
target's state before its final norm and chain on the raw block output; Qwen3.5 heads read the target's
final-normed state and end with their own norm, whose output is both what the LM head reads and what the
next chained step takes as its hidden state. Built from weights already loaded (``engine.models.loader``
reads them from a GGUF); the drafting policy around it lives in ``engine.speculative.mtp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from engine.cache.kv import KVCache
from engine.models.layers import RMSNorm, head_step
from engine.models.transformer import Model, TokenEmbedding
from engine.ops.linear import Linear
from engine.ops.memory import model_bytes


@dataclass
class NextNWeights:
    """The head's loaded weights; a ``None`` part is the target's."""

    block: nn.Module  # a Block (or HybridBlock) built for one global-attention layer, cache layer 0
    eh_proj: Linear  # [n_embd, 2 * n_embd]: the normed token embedding and hidden state, concatenated
    enorm: Tensor
    hnorm: Tensor
    head_norm: Tensor | None = None  # None: the target's final norm
    head: Linear | None = None  # None: the target's output projection
    embed: TokenEmbedding | None = None  # None: the target's embedding (scaled as the target scales it)


class NextNHead:
    """The head over ``target``: ``forward`` appends pairs to a cache of its own, ``logits`` reads g."""

    reads = "prenorm"  # the target's state it reads (``TargetOutput.states``): the last layer's output

    def __init__(self, target: Model, w: NextNWeights):
        cfg = target.config
        device, dtype = target.device, target.dtype
        self.config = cfg
        self.block = w.block.to(device)  # one global-attention block; its cache is the head's own (layer 0)
        self.normed = cfg.nextn_hidden == "normed"
        self.target_norm = target.norm
        self.eh_proj = w.eh_proj
        self.enorm = RMSNorm(w.enorm, cfg.rms_eps).to(device)
        self.hnorm = RMSNorm(w.hnorm, cfg.rms_eps).to(device)
        self.head_norm = RMSNorm(w.head_norm, cfg.rms_eps).to(device) if w.head_norm is not None else target.norm
        self.head = w.head if w.head is not None else target.output
        if w.embed is not None:
            self.embed, self.embed_scale = w.embed, None
        else:
            self.embed, self.embed_scale = target.embed, cfg.embed_scale
        self.rope = target.rope_global
        self.block_ops = target.block_ops  # the target's fused ops (same device and dtype)
        self.device, self.dtype = device, dtype
        # The head's own output projection and norm (a separate head file has them) use memory the
        # target's do not account for.
        self._own_head = [m for m in (self.head, self.head_norm) if m is not target.output and m is not target.norm]

    def new_cache(self, capacity: int) -> KVCache:
        """An empty single-layer cache for ``capacity`` pairs, on the head's device in its compute dtype."""
        cfg = self.config
        return KVCache(1, cfg.n_head_kv, cfg.head_dim, capacity, v_head_dim=cfg.v_head_dim,
                       device=self.device, dtype=self.dtype)

    def from_target(self, prenorm_hidden: Tensor) -> Tensor:
        """The hidden state the head reads, from the target's pre-norm states [n, D]."""
        return self.target_norm(prenorm_hidden) if self.normed else prenorm_hidden

    @torch.no_grad()
    def forward(self, hidden: Tensor, next_tokens: Sequence[int], cache: KVCache, chunk: int = 512) -> Tensor:
        """Append the pairs (hidden[j], next_tokens[j]) to ``cache`` at positions ``cache.length ..``;
        return g [n, D], which ``logits`` reads and a chained step takes as its hidden state. ``hidden``:
        ``from_target``'s states, or an earlier g."""
        outs = []
        for i in range(0, len(next_tokens), chunk):
            toks = [int(t) for t in next_tokens[i:i + chunk]]
            h = hidden[i:i + chunk]
            n, pos = len(toks), cache.length
            ids = torch.tensor(toks, dtype=torch.long, device=self.device)
            e = self.embed(ids).to(self.dtype)
            if self.embed_scale is not None:
                e = e * torch.tensor(self.embed_scale, dtype=self.dtype)
            x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h.to(self.dtype))], dim=-1))
            step = head_step(pos, n, self.rope, self.device, self.dtype, self.block_ops)
            cache.check_room(n)
            x = self.block(x, cache, step, self.rope)
            cache.commit(toks)
            outs.append(self.head_norm(x) if self.normed else x)
        return torch.cat(outs)

    def logits(self, g: Tensor) -> Tensor:
        """f32 logits [1, vocab] of one head output g [D]: the prediction of the token after the pair's."""
        g = g.reshape(1, -1)
        return self.head(g if self.normed else self.head_norm(g)).float()

    def weight_bytes(self) -> int:
        """Memory of the weights the head holds beyond the target's."""
        return model_bytes(self.block) + model_bytes(self.eh_proj) + model_bytes(self.enorm) + \
            model_bytes(self.hnorm) + sum(model_bytes(m) for m in self._own_head)
