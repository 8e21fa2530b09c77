"""eagle3: an EAGLE-3 draft head (SafeAILab's EAGLE-3, as vLLM, SGLang and llama.cpp load it), run on a target's state.

Not a model of its own (``engine.models.DRAFTERS``): the head reads the target's residual stream at the input of
three of its layers (``eagle3.target_layers``; by default 2, n_layer // 2 and n_layer - 3, the low, middle and high
features EAGLE-3 is trained on), fuses them with ``fc`` [D <- 3 * D_target], and runs one decoder layer whose
attention reads the concatenation of the normed embedding of the next token and the normed fused state (q/k/v take
2 * D values); the residual around the attention is the fused state itself (or its normed form, with
``eagle3.norm_before_residual``). The layer's output before the final norm is what a chained step takes as its
hidden state; after the norm, ``output`` scores the head's own draft vocabulary, whose token d is the target's
token ``d + d2t[d]``.

Like a NextN head it caches one pair per target position: entry j is (fused h_j, t_{j+1}) at position j, predicting
t_{j+2} (``engine.speculative.mtp.MtpDrafter`` drafts with either). The GGUF layout (``importer/architectures/
eagle3.py`` writes it) follows llama.cpp's names for the layer (``blk.0.*``, ``blk.0.hidden_norm``) plus ``fc`` and
``d2t``; the head has no token embedding of its own unless the checkpoint carried one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from engine.cache.kv import KVCache
from engine.contract.capabilities import DRAFTER_TARGETS, EAGLE3, drafter_target_width
from engine.contract.gguf import GGUFFile
from engine.models.config import ModelConfig, UnsupportedModelError, WeightLayout, base_config
from engine.models.layers import Attention, FeedForward, RMSNorm, RotaryEmbedding, head_step
from engine.models.transformer import Model
from engine.ops.dequant import load_tensor
from engine.ops.linear import Embedding, Linear, load_linear
from engine.ops.memory import model_bytes

ARCH = EAGLE3
TARGET_ARCHITECTURES = DRAFTER_TARGETS[ARCH]

# tensor names (importer/architectures/eagle3.py writes them)
FC = "fc.weight"
D2T = "d2t"
HIDDEN_NORM = "blk.0.hidden_norm.weight"
ROPE_FREQS = "rope_freqs.weight"
EMBEDDING = "token_embd.weight"


def default_target_layers(n_layer: int) -> tuple[int, int, int]:
    """The target layers EAGLE-3 reads when its config names none (vLLM's and llama.cpp's default)."""
    return 2, n_layer // 2, n_layer - 3


def read_config(f: GGUFFile) -> ModelConfig:
    """The head's own layer (one decoder layer of the draft width, rotating halves as transformers does)."""
    layout = WeightLayout(vocab_size=None, tied_output=False, qkv_bias=False, qk_norm=False)
    cfg = base_config(f, layout)
    if cfg.n_layer != 1:
        raise UnsupportedModelError(f"{f.path}: an EAGLE-3 head of {cfg.n_layer} layers is not supported (one layer)")
    return replace(cfg, rope_style="neox")


@dataclass
class Eagle3Weights:
    fc: Linear  # [D <- len(target_layers) * D_target]
    attn_norm: Tensor  # input_layernorm: the token embedding's norm
    hidden_norm: Tensor
    wqkv: Linear  # [q, k, v <- 2 * D]
    wo: Linear
    ffn_norm: Tensor  # post_attention_layernorm
    w13: Linear
    w2: Linear
    norm: Tensor
    output: Linear  # [draft vocab <- D]
    d2t: Tensor  # int64 [draft vocab]: target token = draft token + d2t[draft token]
    rope_freqs: Tensor | None = None
    embed: Embedding | None = None  # None: the target's


class Eagle3Head(nn.Module):
    """The head over ``target``; the same interface as ``engine.models.nextn.NextNHead`` (``from_target``,
    ``forward``, ``logits``, ``new_cache``, ``weight_bytes``), so ``MtpDrafter`` drafts with it."""

    reads = "captured"  # the target's state it reads: ``ForwardOutput.captured`` at ``target_layers``

    def __init__(self, target: Model, cfg: ModelConfig, w: Eagle3Weights, target_layers: Sequence[int],
                 norm_before_residual: bool):
        super().__init__()
        self.config = replace(cfg, vocab_size=target.config.vocab_size)  # drafts are the target's token ids
        self.own = cfg
        self.target_layers = tuple(target_layers)
        self.fc = w.fc
        self.attn_norm = RMSNorm(w.attn_norm, cfg.rms_eps)
        self.hidden_norm = RMSNorm(w.hidden_norm, cfg.rms_eps)
        self.attn = Attention(cfg, 0, w.wqkv, w.wo)
        self.ffn_norm = RMSNorm(w.ffn_norm, cfg.rms_eps)
        self.ffn = FeedForward(cfg, w.w13, w.w2)
        self.norm = RMSNorm(w.norm, cfg.rms_eps)
        self.output = w.output
        self.norm_before_residual = norm_before_residual
        self.register_buffer("targets", torch.arange(w.d2t.shape[0], dtype=torch.long) + w.d2t.long(),
                             persistent=False)
        self.rope = RotaryEmbedding(cfg.rope_dim, cfg.rope_base, cfg.rope_style, freq_factors=w.rope_freqs,
                                    initial_length=min(cfg.context_length, 4096))
        if w.embed is not None:
            self.embed, self.embed_scale = w.embed, None
        else:
            self.embed, self.embed_scale = target.embed, target.config.embed_scale
        self._own_embed = w.embed
        self.block_ops = target.block_ops
        self.device, self.dtype = target.device, target.dtype

    def new_cache(self, capacity: int) -> KVCache:
        cfg = self.own
        return KVCache(1, cfg.n_head_kv, cfg.head_dim, capacity, device=self.device, dtype=self.dtype)

    def from_target(self, captured: Tensor) -> Tensor:
        """The fused state [n, D] of the target's captured residual streams [n, 3 * D_target]."""
        return self.fc(captured.to(self.dtype))

    def _embed(self, tokens: Sequence[int]) -> Tensor:
        e = self.embed(torch.tensor([int(t) for t in tokens], dtype=torch.long, device=self.device)).to(self.dtype)
        if self.embed_scale is not None:
            e = e * torch.tensor(self.embed_scale, dtype=self.dtype)
        return e

    @torch.no_grad()
    def forward(self, hidden: Tensor, next_tokens: Sequence[int], cache: KVCache, chunk: int = 512) -> Tensor:
        """Append the pairs (hidden[j], next_tokens[j]) at positions ``cache.length ..``; return the layer's
        outputs before the final norm [n, D] (what ``logits`` reads and a chained step takes as its hidden)."""
        outs = []
        ops = self.block_ops
        for i in range(0, len(next_tokens), chunk):
            toks = [int(t) for t in next_tokens[i:i + chunk]]
            h = hidden[i:i + chunk].to(self.dtype)
            n, pos = len(toks), cache.length
            normed = self.hidden_norm(h, ops)
            x = torch.cat([self.attn_norm(self._embed(toks), ops), normed], dim=-1)
            step = head_step(pos, n, self.rope, self.device, self.dtype, ops)
            cache.check_room(n)
            a = self.attn(x, cache, step, self.rope)
            cache.commit(toks)
            r = (normed if self.norm_before_residual else h) + a
            outs.append(r + self.ffn(self.ffn_norm(r, ops), ops))
        return torch.cat(outs)

    def logits(self, g: Tensor) -> Tensor:
        """f32 logits [1, target vocab] of one output g [D]: the draft vocabulary's scores at their target ids,
        -inf at every token the head cannot draft."""
        scores = self.output(self.norm(g.reshape(1, -1), self.block_ops)).float()
        out = torch.full((1, self.config.vocab_size), float("-inf"), dtype=torch.float32, device=scores.device)
        out[0, self.targets] = scores[0]
        return out

    def weight_bytes(self) -> int:
        own = [self.fc, self.attn, self.ffn, self.output, self.attn_norm, self.hidden_norm, self.ffn_norm, self.norm]
        return sum(model_bytes(m) for m in own) + (model_bytes(self._own_embed) if self._own_embed is not None else 0)


def target_layers_of(f: GGUFFile, target_n_layer: int) -> tuple[int, ...]:
    layers = f.arch_key("target_layers")
    return tuple(int(i) for i in layers) if layers is not None else default_target_layers(target_n_layer)


def fit_problem(f: GGUFFile, target: ModelConfig) -> str | None:
    """Why the head in ``f`` cannot draft for ``target``, or None."""
    if target.arch not in TARGET_ARCHITECTURES:
        return f"an EAGLE-3 head drafts for {', '.join(sorted(TARGET_ARCHITECTURES))} models here, not {target.arch}"
    width = drafter_target_width(ARCH, f.metadata)
    if width is not None and width != target.n_embd:
        return (f"the EAGLE-3 head was built for a target of hidden size {width}, but the target's hidden size is "
                f"{target.n_embd}")
    layers = target_layers_of(f, target.n_layer)
    bad = [i for i in layers if not 0 <= i <= target.n_layer]
    if bad:
        return f"the EAGLE-3 head reads target layer {bad[0]}, but the target has {target.n_layer} layers"
    fc_in = f.tensors[FC].shape[1] if FC in f.tensors else None
    if fc_in is not None and fc_in != len(layers) * target.n_embd:
        return (f"the EAGLE-3 head's fc takes {fc_in} values, not {len(layers)} target layers of "
                f"{target.n_embd}")
    return None


def load_eagle3(target: Model, f: GGUFFile, fmt: str) -> Eagle3Head:
    """The EAGLE-3 head in ``f`` over ``target``; ``UnsupportedModelError`` says what does not fit."""
    problem = fit_problem(f, target.config)
    if problem is not None:
        raise UnsupportedModelError(problem)
    cfg = read_config(f)
    device = target.device

    def linear(names) -> Linear:
        return load_linear(f, names, fmt, device=device)

    d2t = torch.from_numpy(np.frombuffer(f.tensor_data(D2T), dtype=np.int32).astype(np.int64)) if D2T in f.tensors \
        else torch.zeros(cfg.vocab_size, dtype=torch.long)
    if d2t.shape[0] != cfg.vocab_size:
        raise UnsupportedModelError(f"{f.path}: d2t maps {d2t.shape[0]} draft tokens, the head scores {cfg.vocab_size}")
    ids = torch.arange(cfg.vocab_size) + d2t
    if int(ids.min()) < 0 or int(ids.max()) >= target.config.vocab_size:
        raise UnsupportedModelError(f"{f.path}: d2t maps a draft token outside the target's {target.config.vocab_size} "
                                    "tokens")
    w = Eagle3Weights(
        fc=linear(FC),
        attn_norm=load_tensor(f, "blk.0.attn_norm.weight"),
        hidden_norm=load_tensor(f, HIDDEN_NORM),
        wqkv=linear(["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]),
        wo=linear("blk.0.attn_output.weight"),
        ffn_norm=load_tensor(f, "blk.0.ffn_norm.weight"),
        w13=linear(["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
        w2=linear("blk.0.ffn_down.weight"),
        norm=load_tensor(f, "output_norm.weight"),
        output=linear("output.weight"),
        d2t=d2t,
        rope_freqs=load_tensor(f, ROPE_FREQS) if ROPE_FREQS in f.tensors else None,
        embed=Embedding(f, EMBEDDING, target.dtype, device=device) if EMBEDDING in f.tensors else None,
    )
    f.release_pages()
    if w.wqkv.in_features != 2 * cfg.n_embd:
        raise UnsupportedModelError(f"{f.path}: the EAGLE-3 layer's q/k/v take {w.wqkv.in_features} values, not "
                                    f"twice its width {cfg.n_embd}")
    return Eagle3Head(target, cfg, w, target_layers_of(f, target.config.n_layer),
                      bool(f.arch_key("norm_before_residual", False))).to(device).eval()
