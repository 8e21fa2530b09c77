"""A Model built from a hand-written ModelConfig and weights in memory (no GGUF file, no tensor names)
equals the model ``engine.models.loader`` loads from a GGUF holding the same weights: the layers and the
model depend on weights only, and the GGUF naming lives in the loader alone."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from engine.models.config import ModelConfig
from engine.models.layers import Block, BlockWeights
from engine.models.loader import load_model
from engine.models.transformer import Model
from engine.ops.linear import DenseLinear
from tests.tiny_gguf import TinySpec, vocab_for, write_tiny_gguf

N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 2, 64, 128, 4, 2, 16
RMS_EPS = float(np.float32(1e-6))  # as the GGUF stores it


@dataclass
class LayerTensors:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # q, k, v
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None
    post_norms: tuple[torch.Tensor, torch.Tensor] | None = None  # after attention, after the FFN


@dataclass
class Tensors:
    embed: torch.Tensor
    layers: list[LayerTensors]
    norm: torch.Tensor
    output: torch.Tensor | None  # None: tied to the embedding


def config_for(arch: str, vocab: int) -> ModelConfig:
    """What the GGUF written by ``gguf_for`` describes, spelt out by hand."""
    common = dict(arch=arch, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                  head_dim=HEAD_DIM, v_head_dim=HEAD_DIM, vocab_size=vocab, context_length=256, rms_eps=RMS_EPS,
                  rope_base=10000.0, rope_dim=HEAD_DIM)
    if arch == "llama":
        return ModelConfig(**common, rope_style="normal")
    if arch == "qwen2":
        return ModelConfig(**common, rope_style="neox", tied_output=False, qkv_bias=True)
    return ModelConfig(**common, rope_style="neox", activation="gelu_tanh", embed_scale=math.sqrt(N_EMBD),
                       post_norms=True, qk_norm=True, sliding_window=8, local_layers=(True, False),
                       rope_base_local=10000.0)


def random_tensors(cfg: ModelConfig, seed: int = 3) -> Tensors:
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    layers = []
    for _ in range(cfg.n_layer):
        layers.append(LayerTensors(
            attn_norm=norm(cfg.n_embd), wq=w(q_rows, cfg.n_embd), wk=w(kv_rows, cfg.n_embd),
            wv=w(kv_rows, cfg.n_embd), wo=w(cfg.n_embd, q_rows), ffn_norm=norm(cfg.n_embd),
            gate=w(cfg.n_ff, cfg.n_embd), up=w(cfg.n_ff, cfg.n_embd), down=w(cfg.n_embd, cfg.n_ff),
            bias=(w(q_rows, scale=0.2), w(kv_rows, scale=0.2), w(kv_rows, scale=0.2)) if cfg.qkv_bias else None,
            qk_norm=(norm(cfg.head_dim), norm(cfg.head_dim)) if cfg.qk_norm else None,
            post_norms=(norm(cfg.n_embd), norm(cfg.n_embd)) if cfg.post_norms else None,
        ))
    return Tensors(embed=w(cfg.vocab_size, cfg.n_embd, scale=0.5), layers=layers, norm=norm(cfg.n_embd),
                   output=None if cfg.tied_output else w(cfg.vocab_size, cfg.n_embd))


def model_from_tensors(cfg: ModelConfig, t: Tensors) -> Model:
    """The model straight from memory: dense f32 linears, q/k/v and gate/up concatenated as the layers want."""
    blocks = []
    for i, lt in enumerate(t.layers):
        weights = BlockWeights(
            attn_norm=lt.attn_norm,
            wqkv=DenseLinear(torch.cat([lt.wq, lt.wk, lt.wv]), torch.cat(lt.bias) if lt.bias else None),
            wo=DenseLinear(lt.wo, None),
            ffn_norm=lt.ffn_norm,
            w13=DenseLinear(torch.cat([lt.gate, lt.up]), None),
            w2=DenseLinear(lt.down, None),
            q_norm=lt.qk_norm[0] if lt.qk_norm else None,
            k_norm=lt.qk_norm[1] if lt.qk_norm else None,
            post_attn_norm=lt.post_norms[0] if lt.post_norms else None,
            post_ffn_norm=lt.post_norms[1] if lt.post_norms else None,
        )
        blocks.append(Block(cfg, i, weights))
    output = DenseLinear(t.embed if t.output is None else t.output, None)
    embed = torch.nn.Embedding.from_pretrained(t.embed)
    return Model(cfg, embed=embed, layers=blocks, norm=t.norm, output=output, fmt="f32",
                 dtype=torch.float32).eval()


def gguf_tensors(t: Tensors) -> dict[str, np.ndarray]:
    """The same tensors under llama.cpp's GGUF names (what the loader reads)."""
    out = {"token_embd.weight": t.embed, "output_norm.weight": t.norm}
    if t.output is not None:
        out["output.weight"] = t.output
    for i, lt in enumerate(t.layers):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": lt.attn_norm, p + "attn_q.weight": lt.wq, p + "attn_k.weight": lt.wk,
                    p + "attn_v.weight": lt.wv, p + "attn_output.weight": lt.wo, p + "ffn_norm.weight": lt.ffn_norm,
                    p + "ffn_gate.weight": lt.gate, p + "ffn_up.weight": lt.up, p + "ffn_down.weight": lt.down})
        if lt.bias:
            out.update({p + "attn_q.bias": lt.bias[0], p + "attn_k.bias": lt.bias[1], p + "attn_v.bias": lt.bias[2]})
        if lt.qk_norm:
            out.update({p + "attn_q_norm.weight": lt.qk_norm[0], p + "attn_k_norm.weight": lt.qk_norm[1]})
        if lt.post_norms:
            out.update({p + "post_attention_norm.weight": lt.post_norms[0],
                        p + "post_ffw_norm.weight": lt.post_norms[1]})
    return {name: v.numpy() for name, v in out.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_model_from_memory_equals_model_from_gguf(arch, tmp_path):
    spec = TinySpec(arch=arch, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                    tied_output=arch != "qwen2")
    if arch == "gemma3":
        spec.extra_metadata = {"gemma3.attention.sliding_window_pattern": 2}  # one local, one global layer
    cfg = config_for(arch, len(vocab_for(spec)[0]))
    tensors = random_tensors(cfg)
    ours = model_from_tensors(cfg, tensors)
    loaded = load_model(write_tiny_gguf(tmp_path / f"{arch}.gguf", spec, tensors=gguf_tensors(tensors)), fmt="f32")
    assert loaded.config == cfg

    ids = [(7 * i + 3) % cfg.vocab_size for i in range(20)]  # past the window of 8: local masks matter
    a, b = ours.new_cache(), loaded.new_cache()
    for chunk in (ids[:13], ids[13:17], ids[17:18], ids[18:]):  # prefill, verification widths, decode
        out_a = ours(chunk, a, return_hidden=True)
        out_b = loaded(chunk, b, return_hidden=True)
        assert torch.equal(out_a.logits, out_b.logits)
        assert torch.equal(out_a.prenorm_hidden, out_b.prenorm_hidden)
    n = len(ids)  # the caches are allocated uninitialised: compare the positions written
    assert torch.equal(a.k[:, :, :n], b.k[:, :, :n]) and torch.equal(a.v[:, :, :n], b.v[:, :, :n])
