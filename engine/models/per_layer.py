"""Per-layer embedding inputs (gemma4 E models): a small extra input for every block, computed once per forward.

Each token gets a row of a second embedding table, one slice of width P per layer, scaled by sqrt(P);
the token's scaled main embedding is projected to the same [n_layer, P] shape (scaled by 1/sqrt(D),
each slice RMS-normed); the two are summed and scaled by 1/sqrt(2). Block i then gates its slice with
its own hidden state (``engine.models.layers.Block``). Computing them up front keeps the blocks free
of token ids.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from engine.models.layers import RMSNorm
from engine.ops.linear import Linear


class PerLayerInput(nn.Module):
    def __init__(self, embed: Callable[[torch.Tensor], torch.Tensor], model_proj: Linear, proj_norm: torch.Tensor,
                 *, n_layer: int, width: int, n_embd: int, eps: float):
        """``embed``: token ids -> rows [n, n_layer * width]; ``model_proj``: [n_layer * width <- n_embd];
        ``proj_norm``: the RMSNorm weight of one slice [width]."""
        super().__init__()
        self.embed = embed
        self.model_proj = model_proj
        self.proj_norm = RMSNorm(proj_norm, eps)
        self.n_layer, self.width = n_layer, width
        self.embed_scale = math.sqrt(width)
        self.proj_scale = 1.0 / math.sqrt(n_embd)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """ids [n], x [n, D] (the scaled token embeddings) -> per-layer inputs [n, n_layer, width]."""
        n = ids.shape[0]
        dtype = x.dtype
        tok = self.embed(ids).to(dtype).view(n, self.n_layer, self.width) * torch.tensor(self.embed_scale, dtype=dtype)
        proj = (self.model_proj(x) * torch.tensor(self.proj_scale, dtype=dtype)).view(n, self.n_layer, self.width)
        return (self.proj_norm(proj) + tok) * torch.tensor(2.0 ** -0.5, dtype=dtype)
