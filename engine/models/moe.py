"""A sparse mixture-of-experts FFN: a router picks k of E experts per token, and only those experts run.

Built from weights that are already loaded (like ``engine.models.layers``): the router's ``Linear`` and one
callable per expert (a ``FeedForward`` over that expert's own ``Linear`` modules, which the loader slices
out of the stacked expert tensors in their stored quantized types). It knows no file format and no
architecture: qwen3moe uses it as it is; a model that adds a dense MLP beside the experts, scales the
router's input or scales each expert's output (gemma4's 26B) composes it with those pieces.

Why per-expert modules rather than one [E, ...] tensor: a token reads the weights of its k experts only,
so a model with E experts of which k are active costs (per token) about what a dense model of k experts'
width costs, whatever E is. A batch of several tokens (prefill, a speculative verification of k+1
positions) is grouped by expert, so an expert chosen by several tokens of the batch runs once, on all of
them: its weights are read once per forward, not once per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from engine.ops.linear import Linear


@dataclass
class Routing:
    """Per token, the experts it runs through and their weights, best first."""

    experts: torch.Tensor  # long [n, k]
    weights: torch.Tensor  # [n, k], in the activations' dtype


class Router(nn.Module):
    """Expert logits (``weight``: [n_expert] outputs), softmax in f32, the top ``top_k``, renormalised to sum 1
    when ``normalize`` (what llama.cpp does for qwen3moe and transformers with ``norm_topk_prob``), times
    ``scale``."""

    def __init__(self, weight: Linear, top_k: int, *, normalize: bool = True, scale: float = 1.0):
        super().__init__()
        if not 0 < top_k <= weight.out_features:
            raise ValueError(f"top_k {top_k} for {weight.out_features} experts")
        self.weight = weight
        self.top_k = top_k
        self.normalize = normalize
        self.scale = scale

    @property
    def n_expert(self) -> int:
        return self.weight.out_features

    def forward(self, x: torch.Tensor) -> Routing:
        # logits in f32 whatever the activations' dtype: a bf16 rounding of close logits can swap experts
        probs = torch.softmax(self.weight(x.float()).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scale != 1.0:
            weights = weights * self.scale
        return Routing(experts, weights.to(x.dtype))


class SparseMoE(nn.Module):
    """y = sum over the token's routed experts e of weight_e * expert_e(x).

    ``experts``: one module per expert, each mapping [m, n_embd] -> [m, n_embd]."""

    def __init__(self, router: Router, experts: Sequence[nn.Module]):
        super().__init__()
        if len(experts) != router.n_expert:
            raise ValueError(f"{len(experts)} experts for a router over {router.n_expert}")
        self.router = router
        self.experts = nn.ModuleList(experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = self.router(x)
        return self.mix(x, routing)

    def mix(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """The experts' outputs for ``routing`` (computed by this router or any other), weighted and summed."""
        n, k = routing.experts.shape
        out = torch.zeros_like(x)
        if n == 1:  # decode: no grouping needed; experts in ascending id order, as the grouped path sums them
            chosen = routing.experts[0].tolist()
            for j in sorted(range(k), key=chosen.__getitem__):
                out += routing.weights[0, j] * self.experts[chosen[j]](x)
            return out
        # Several tokens: sort the (token, slot) pairs by expert, so that each chosen expert runs once on a
        # contiguous slice of its tokens' rows; weight and scatter back in one op each.
        flat = routing.experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // k
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        xs = x[tokens]
        ys = torch.empty_like(xs)
        start = 0
        for e, c in enumerate(counts):
            if c:
                ys[start:start + c] = self.experts[e](xs[start:start + c])
                start += c
        ys *= routing.weights.reshape(-1)[order, None]
        return out.index_add_(0, tokens, ys)


class SharedExpertMoE(nn.Module):
    """y = routed(x) + sigmoid(gate(x)) * shared(x): a sparse MoE beside one always-on expert whose share is
    a learned per-token gate (qwen35moe). ``gate``: [1 <- n_embd]."""

    def __init__(self, routed: SparseMoE, shared: nn.Module, gate: Linear):
        super().__init__()
        self.routed, self.shared, self.gate = routed, shared, gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x) + torch.sigmoid(self.gate(x)) * self.shared(x)
