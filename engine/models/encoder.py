"""The BERT-family encoder (``engine.models.bert`` describes it): a batch of token sequences in, one pooled
vector per sequence out.

Each sequence attends all of its own tokens (bidirectional); in a batch, shorter sequences are padded at
the end and their padding is masked out of the keys and out of the pooling, so a sequence's vector does
not depend on what it was batched with. Weights are plain dense tensors in the compute dtype (encoders
are small, and the vectors are compared to 1e-4 cosine with the reference); ``engine.models.loader`` reads
them from the GGUF and hands them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.bert import EncoderConfig


@dataclass
class DenseWeights:
    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor  # [out]


@dataclass
class NormWeights:
    weight: torch.Tensor
    bias: torch.Tensor


@dataclass
class EncoderLayerWeights:
    q: DenseWeights
    k: DenseWeights
    v: DenseWeights
    out: DenseWeights
    attn_norm: NormWeights  # after the attention's residual add
    up: DenseWeights
    down: DenseWeights
    ffn_norm: NormWeights  # after the FFN's residual add


@dataclass
class EncoderWeights:
    token_embd: torch.Tensor  # [vocab, D]
    position_embd: torch.Tensor  # [context, D]
    token_types: torch.Tensor  # [n_types, D]
    embd_norm: NormWeights
    layers: list[EncoderLayerWeights]


class _Dense(nn.Module):
    def __init__(self, w: DenseWeights):
        super().__init__()
        self.weight = nn.Parameter(w.weight, requires_grad=False)
        self.bias = nn.Parameter(w.bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _LayerNorm(nn.Module):
    def __init__(self, w: NormWeights, eps: float):
        super().__init__()
        self.weight = nn.Parameter(w.weight, requires_grad=False)
        self.bias = nn.Parameter(w.bias, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig, w: EncoderLayerWeights):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.q, self.k, self.v, self.out = _Dense(w.q), _Dense(w.k), _Dense(w.v), _Dense(w.out)
        self.attn_norm = _LayerNorm(w.attn_norm, cfg.norm_eps)
        self.up, self.down = _Dense(w.up), _Dense(w.down)
        self.ffn_norm = _LayerNorm(w.ffn_norm, cfg.norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, D]; ``key_mask`` [B, 1, 1, T] True where a key is a real token."""
        B, T, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), attn_mask=key_mask)
        x = self.attn_norm(x + self.out(a.transpose(1, 2).reshape(B, T, -1)))
        # BERT's "gelu" is the exact (erf) GELU, as transformers computes it.
        return self.ffn_norm(x + self.down(F.gelu(self.up(x))))


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, w: EncoderWeights):
        super().__init__()
        self.config = cfg
        self.token_embd = nn.Parameter(w.token_embd, requires_grad=False)
        self.position_embd = nn.Parameter(w.position_embd, requires_grad=False)
        self.token_types = nn.Parameter(w.token_types, requires_grad=False)
        self.embd_norm = _LayerNorm(w.embd_norm, cfg.norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg, lw) for lw in w.layers)
        self.gguf = None  # set by the loader: the file the weights came from
        self.source_path: str | None = None
        self.fmt = str(w.token_embd.dtype).removeprefix("torch.")

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embd.dtype

    @property
    def device(self) -> torch.device:
        return self.token_embd.device

    def close(self) -> None:
        if self.gguf is not None:
            self.gguf.close()

    @torch.no_grad()
    def hidden_states(self, batch: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden states [B, T, D] of token sequences (padded to the longest) and the mask
        [B, T] of their real tokens. Every sequence gets token type 0 (one segment, as Ollama sends)."""
        if not batch or any(len(s) == 0 for s in batch):
            raise ValueError("every sequence needs at least one token")
        T = max(len(s) for s in batch)
        if T > self.config.context_length:
            raise ValueError(f"a sequence of {T} tokens exceeds the {self.config.context_length} positions")
        ids = torch.zeros(len(batch), T, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(batch), T, dtype=torch.bool, device=self.device)
        for i, s in enumerate(batch):
            ids[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, :len(s)] = True
        x = self.token_embd[ids] + self.position_embd[:T] + self.token_types[0]
        x = self.embd_norm(x)
        key_mask = mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_mask)
        return x, mask

    @torch.no_grad()
    def embed(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """One pooled vector per sequence [B, D] (not normalised: the caller decides)."""
        h, mask = self.hidden_states(batch)
        pooling = self.config.pooling
        if pooling == "mean":
            m = mask.unsqueeze(-1).to(h.dtype)
            return (h * m).sum(1) / m.sum(1)
        if pooling == "cls":
            return h[:, 0]
        lengths = mask.sum(1)  # "last": each sequence's own last token
        return h[torch.arange(h.shape[0], device=h.device), lengths - 1]
