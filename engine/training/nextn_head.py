"""A NextN (MTP) head as trainable float32 parameters, computing what ``engine.models.nextn.NextNHead`` computes.

The engine's head runs on its own kernels under ``no_grad``; training needs autograd, so this module restates the
same arithmetic in plain torch: pair j = (h_j, t_{j+1}) becomes ``eh_proj([enorm(embed(t_{j+1})), hnorm(h_j)])``,
runs through one pre-norm attention + SwiGLU block at position j (causal over the pairs before it), and its output
g_j, through the target's final norm and output projection (both frozen, shared), predicts t_{j+2}. The head is the
DeepSeek/GLM kind (``nextn_hidden`` "prenorm": it reads the target's state before its final norm and chains on its
raw block output), which is what the engine runs for a llama, qwen2 or qwen3 target. ``tensors()`` names the
weights as a head-only GGUF stores them (``blk.N.*`` and ``blk.N.nextn.*``), so the engine loads what was trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.contract.gguf import GGUFFile
from engine.models.config import ModelConfig
from engine.models.transformer import Model
from engine.ops.dequant import load_tensor

# Target architectures whose blocks this module restates (the engine's plain Block: attention with optional q/k/v
# biases and q/k norms, a SiLU-gated FFN).
TRAINABLE_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})


class UntrainableTarget(ValueError):
    """A target whose head this trainer cannot fit, with the reason for a user."""


def check_trainable(cfg: ModelConfig) -> None:
    """Refuse, before any work, a target whose block this module does not restate."""
    if cfg.arch not in TRAINABLE_ARCHITECTURES:
        raise UntrainableTarget(f"training an MTP head supports {', '.join(sorted(TRAINABLE_ARCHITECTURES))} "
                                f"models, not {cfg.arch}")
    unsupported = [what for what, present in (
        ("a mixture-of-experts FFN", cfg.moe is not None), ("recurrent layers", cfg.recurrent is not None),
        ("sliding-window layers", bool(cfg.local_layers) and any(cfg.local_layers)),
        ("post-norms", cfg.post_norms), ("per-layer inputs", cfg.per_layer_input > 0),
        ("attention soft-capping", cfg.attn_softcap is not None), ("final soft-capping", cfg.final_softcap is not None),
        ("scaled embeddings", cfg.embed_scale is not None), ("partial RoPE", cfg.rope_dim != cfg.head_dim),
        ("an activation other than SiLU", cfg.activation != "silu"),
        ("per-layer head shapes", bool(cfg.layer_head_dim or cfg.layer_n_head_kv or cfg.kv_source)),
    ) if present]
    if unsupported:
        raise UntrainableTarget(f"training an MTP head for this {cfg.arch} model is not supported: it has "
                                f"{', '.join(unsupported)}")


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, w.shape, w, eps)


class TrainableNextN(nn.Module):
    """The head's own weights as parameters; the target's embedding, final norm and output stay frozen tensors."""

    def __init__(self, target: Model, init: dict[str, Tensor]):
        super().__init__()
        cfg = target.config
        check_trainable(cfg)
        self.config = cfg
        self.rope = target.rope_global
        self.weights = nn.ParameterDict({name.replace(".", "__"): nn.Parameter(t.float().clone())
                                         for name, t in init.items()})
        f = target.gguf
        output = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        self.embedding = load_tensor(f, "token_embd.weight")  # [V, D], frozen
        self.output = self.embedding if output == "token_embd.weight" else load_tensor(f, output)
        self.final_norm = target.norm.weight.detach().float().clone()

    def w(self, name: str) -> Tensor:
        return self.weights[name.replace(".", "__")]

    def has(self, name: str) -> bool:
        return name.replace(".", "__") in self.weights

    def forward(self, hidden: Tensor, next_tokens: Tensor) -> Tensor:
        """g [T, D] for the pairs (hidden[j], next_tokens[j]) at positions 0..T-1 (causal among them)."""
        cfg, eps = self.config, self.config.rms_eps
        T, H, Hkv, D = hidden.shape[0], cfg.n_head, cfg.n_head_kv, cfg.head_dim
        e = self.embedding[next_tokens]
        x = torch.cat([_rms(e, self.w("nextn.enorm"), eps), _rms(hidden.float(), self.w("nextn.hnorm"), eps)], dim=-1)
        x = x @ self.w("nextn.eh_proj").T
        a = _rms(x, self.w("attn_norm"), eps)
        q, k, v = (a @ self.w(f"attn_{p}").T + (self.w(f"attn_{p}.bias") if self.has(f"attn_{p}.bias") else 0)
                   for p in "qkv")
        q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
        if self.has("attn_q_norm"):
            q, k = _rms(q, self.w("attn_q_norm"), eps), _rms(k, self.w("attn_k_norm"), eps)
        cos, sin = self.rope.get(0, T, hidden.device, torch.float32)
        q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           is_causal=True, scale=cfg.query_scale, enable_gqa=H != Hkv)[0]
        x = x + o.transpose(0, 1).reshape(T, H * D) @ self.w("attn_output").T
        f = _rms(x, self.w("ffn_norm"), eps)
        return x + (F.silu(f @ self.w("ffn_gate").T) * (f @ self.w("ffn_up").T)) @ self.w("ffn_down").T

    def logits(self, g: Tensor, vocab: Tensor | None = None) -> Tensor:
        """f32 logits [T, V] (or over the rows ``vocab`` only) of head outputs g, through the target's final norm
        and output projection, as the engine's head computes them."""
        out = self.output if vocab is None else self.output[vocab]
        return _rms(g, self.final_norm, self.config.rms_eps) @ out.T

    def tensors(self, block: int) -> dict[str, Tensor]:
        """The trained weights under the names a head-only GGUF gives them (block ``block`` = the target's n_layer)."""
        named = {}
        for key, p in self.weights.items():
            name = key.replace("__", ".")
            suffix = "" if name.endswith(".bias") else ".weight"
            named[f"blk.{block}.{name}{suffix}"] = p.detach().clone()
        return named


def initial_weights(target: Model, generator: torch.Generator, hidden_scale: float = 1.0) -> dict[str, Tensor]:
    """A starting point: the block is a copy of the target's last block (the closest thing to what the head must
    compute), and eh_proj passes the hidden state through while the token embedding enters with small random
    weights. ``hidden_scale``: the typical RMS of the target's pre-norm states, which ``hnorm`` gives back, so that
    the copied block first sees a residual stream of the size it was trained on (with ``hnorm`` at one it saw a
    stream tens of times too small, and the head began far worse than uniform)."""
    cfg, f = target.config, target.gguf
    last = f"blk.{cfg.n_layer - 1}."
    names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    if cfg.qkv_bias:
        names += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    if cfg.qk_norm:
        names += ["attn_q_norm", "attn_k_norm"]
    init = {n: _read(f, last + n if n.endswith(".bias") else last + n + ".weight") for n in names}
    D = cfg.n_embd
    eh = torch.zeros(D, 2 * D)
    eh[:, :D] = torch.randn(D, D, generator=generator) * (0.02 / D ** 0.5 * 8)
    eh[:, D:] = torch.eye(D)
    init["nextn.eh_proj"] = eh
    init["nextn.enorm"] = torch.ones(D)
    init["nextn.hnorm"] = torch.full((D,), float(hidden_scale))
    return init


def _read(f: GGUFFile, name: str) -> Tensor:
    if name not in f.tensors:
        raise UntrainableTarget(f"{f.path}: the target has no {name}")
    return load_tensor(f, name)


def weights_from_head_gguf(path: str, n_layer: int) -> dict[str, Tensor]:
    """A written head's weights (``head_gguf.write_head_gguf``: block ``n_layer``) under the names ``TrainableNextN``
    takes: what ``initial_weights`` gives, trained."""
    prefix = f"blk.{n_layer}."
    init = {}
    with GGUFFile(path) as f:
        for name in f.tensors:
            if not name.startswith(prefix):
                continue
            short = name[len(prefix):]
            init[short[:-len(".weight")] if short.endswith(".weight") else short] = load_tensor(f, name)
    if not init:
        raise ValueError(f"{path}: no head block {n_layer} (a head for another target?)")
    return init
