"""The Gemma 4 assistant (``engine.models.gemma4_assistant``) as a module: one draft step over a target's state.

A step never writes a cache: its layers only read the target's K/V for the positions the target has
committed, and its query sits at the last committed position (the token the target has sampled but not
yet evaluated), whatever the depth of the draft. So a rejected draft leaves nothing to undo. Global layers
see every committed position; sliding layers the window of a query at P, positions P - W + 1 .. P - 1
(llama.cpp's mask; transformers' own drafting loop hands its assistant whatever its target's cache kept,
which differs from this by a position or two at the window's edge). Built from
weights already loaded (``engine.models.loader.load_assistant``); the drafting policy around it lives in
``engine.speculative.assistant``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from engine.cache.kv import KVCache
from engine.models.config import ModelConfig
from engine.models.layers import (
    Block,
    BlockWeights,
    ForwardStep,
    RMSNorm,
    RotaryEmbedding,
)
from engine.models.transformer import Model
from engine.ops.linear import Linear
from engine.ops.memory import model_bytes


@dataclass
class AssistantWeights:
    blocks: list[BlockWeights]  # q-only attention, as the bound config's layers read the target's K/V
    pre_proj: Linear  # [n_embd <- 2 * target width]: the token embedding and h, concatenated
    post_proj: Linear  # [target width <- n_embd]: the next step's h
    norm: Tensor  # the final RMSNorm
    output: Linear  # the tied token embedding [vocab <- n_embd]
    rope_freqs: Tensor | None  # the global layers' frequency factors


class Gemma4Assistant(nn.Module):
    def __init__(self, config: ModelConfig, target: Model, w: AssistantWeights):
        """``config``: the assistant's config bound to ``target`` (``gemma4_assistant.bind_to_target``)."""
        super().__init__()
        if len(w.blocks) != config.n_layer:
            raise ValueError(f"{len(w.blocks)} blocks for a config of {config.n_layer}")
        self.config = cfg = config
        device, dtype = target.device, target.dtype
        self.blocks = nn.ModuleList(Block(cfg, i, b) for i, b in enumerate(w.blocks)).to(device)
        self.pre_proj, self.post_proj, self.output = w.pre_proj, w.post_proj, w.output
        self.norm = RMSNorm(w.norm, cfg.rms_eps).to(device)
        # The target's own embedding, scaled as the target scales it.
        self.embed, self.embed_scale = target.embed, target.config.embed_scale
        self.rope = {"global": RotaryEmbedding(cfg.rope_dim, cfg.rope_base, cfg.rope_style, freq_factors=w.rope_freqs),
                     "local": RotaryEmbedding(cfg.rope_dim_local or cfg.rope_dim, cfg.rope_base_local or cfg.rope_base,
                                              cfg.rope_style,
                                              freq_factors=w.rope_freqs if cfg.rope_freqs_local else None)}
        self.block_ops = target.block_ops
        self.device, self.dtype = device, dtype
        self.target_width = target.config.n_embd

    @torch.no_grad()
    def step(self, token: int, h: Tensor, cache: KVCache, position: int) -> tuple[Tensor, Tensor]:
        """One draft step at ``position`` (the last committed one; ``cache`` holds the target's K/V before
        it): f32 logits [1, vocab] for the token after ``token``, and the next step's h [target width]."""
        dev, dt = self.device, self.dtype
        e = self.embed(torch.tensor([int(token)], dtype=torch.long, device=dev)).to(dt)
        if self.embed_scale is not None:
            e = e * torch.tensor(self.embed_scale, dtype=dt)
        x = self.pre_proj(torch.cat([e, h.reshape(1, -1).to(dt)], dim=-1))
        window = self.config.sliding_window
        key_start = {"global": 0, "local": max(0, position - window + 1) if window else 0}
        rope = {kind: r.get(position, 1, dev, dt) for kind, r in self.rope.items()}
        step = ForwardStep(position, 1, rope, {"global": None, "local": None}, key_start, self.block_ops,
                           key_end=position)
        for block in self.blocks:
            x = block(x, cache, step, self.rope[block.attn.kind])
        normed = self.norm(x, self.block_ops)
        return self.output(normed).float(), self.post_proj(normed)[0]

    def weight_bytes(self) -> int:
        """Memory of the assistant's own weights (the target's embedding it reads is the target's)."""
        return model_bytes(self)
