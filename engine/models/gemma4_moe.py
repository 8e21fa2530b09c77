"""gemma4's 26B-A4B FFN: a sparse MoE (``engine.models.moe``) beside a dense FFN, each between its own norms.

Given a block's residual stream x (after attention, before any FFN norm):

    dense   = post_norm_1(FFN(ffn_norm(x)))
    experts = post_norm_2(sum over the token's k experts e of w_e * expert_e(pre_norm_2(x)))
    out     = dense + experts        (the block then applies its post-FFN norm and the residual add)

The router reads x too, not a normed copy: its logits are those of rms(x) * router_scale / sqrt(n_embd)
(a weightless RMSNorm, then a learned per-channel scale); softmax over all experts, top k, renormalised to
sum 1, then each chosen weight times its expert's learned scale. That is transformers' ``Gemma4TextRouter``
and llama.cpp's gemma4 graph (which applies the per-expert scale to the expert's output: the same product).

The routing is computed here and handed to ``SparseMoE.mix``, so the experts run exactly as qwen3moe's do
(grouped by expert over a batch, only the chosen experts' weights read). Because the router needs the
un-normed x, the block hands this module its residual stream (``BlockWeights.ffn_norm`` is None) and the
dense branch's pre-norm lives here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import FeedForward, RMSNorm
from engine.models.moe import Routing, SparseMoE


class Gemma4MoE(nn.Module):
    """[n, n_embd] residual stream -> [n, n_embd] summed output of the dense and the expert branch."""

    def __init__(self, dense: FeedForward, experts: SparseMoE, *, dense_norm: torch.Tensor,
                 dense_post_norm: torch.Tensor, experts_norm: torch.Tensor, experts_post_norm: torch.Tensor,
                 router_scale: torch.Tensor, expert_scale: torch.Tensor, eps: float):
        """``dense_norm``/``dense_post_norm``: the dense branch's pre and post RMSNorm weights;
        ``experts_norm``/``experts_post_norm``: the expert branch's; ``router_scale`` [n_embd]: the router
        input's per-channel scale; ``expert_scale`` [n_expert]: each expert's weight multiplier."""
        super().__init__()
        n_embd = router_scale.numel()
        if expert_scale.numel() != experts.router.n_expert:
            raise ValueError(f"{expert_scale.numel()} expert scales for {experts.router.n_expert} experts")
        self.dense = dense
        self.moe = experts
        self.dense_norm = RMSNorm(dense_norm, eps)
        self.dense_post_norm = RMSNorm(dense_post_norm, eps)
        self.experts_norm = RMSNorm(experts_norm, eps)
        self.experts_post_norm = RMSNorm(experts_post_norm, eps)
        # The 1/sqrt(n_embd) folded into the per-channel scale: one multiply on the router's input.
        self.router_scale = nn.Parameter(router_scale.float().reshape(-1) / math.sqrt(n_embd), requires_grad=False)
        self.expert_scale = nn.Parameter(expert_scale.float().reshape(-1), requires_grad=False)
        self.eps = eps
        self.act = dense.act  # the block's per-layer input gate (gemma4 E models) uses the FFN's activation

    @property
    def router(self):
        return self.moe.router

    def route(self, x: torch.Tensor) -> Routing:
        """The chosen experts and their weights for the residual stream ``x``."""
        h = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps) * self.router_scale
        routing = self.moe.router(h)
        weights = routing.weights.float() * self.expert_scale[routing.experts]
        return Routing(routing.experts, weights.to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = self.dense_post_norm(self.dense(self.dense_norm(x)))
        experts = self.experts_post_norm(self.moe.mix(self.experts_norm(x), self.route(x)))
        return dense + experts
