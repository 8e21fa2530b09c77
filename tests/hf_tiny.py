"""Tiny random transformers models and the same weights as a GGUF, for oracle tests of engine.models.

``make_pair(arch, dir)`` builds a LlamaForCausalLM / Qwen2ForCausalLM / Gemma3ForCausalLM / Qwen3ForCausalLM /
Qwen3MoeForCausalLM with a few layers,
randomised weights, norms and biases, converts its state dict to GGUF names the way llama.cpp's converter
does (llama: q/k rows permuted; gemma3: norms stored as 1 + w; qwen3moe: each layer's experts stacked into
3-D ``ffn_{gate,up,down}_exps``) and writes it with ``tiny_gguf``'s writer,
so the GGUF and the HF model hold the same weights. The HF model is returned in float64 as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tests.tiny_gguf import TinySpec, vocab_for, write_tiny_gguf

N_EMBD, N_FF, N_HEAD, N_HEAD_KV = 64, 128, 4, 2
HEAD_DIM = N_EMBD // N_HEAD
ROPE_BASE = {"llama": 10000.0, "qwen2": 1_000_000.0, "gemma3": 1_000_000.0, "qwen3": 1_000_000.0,
             "qwen3moe": 1_000_000.0}
# qwen3: a head size that is not n_embd / n_head, as in the released models (1024 dims, 16 heads of 128)
QWEN3_HEAD_DIM = 32
# qwen3moe: 8 experts of width 32, 2 per token
N_EXPERT, N_EXPERT_USED, N_FF_EXPERT = 8, 2, 32
_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}
GEMMA_LOCAL_BASE = 10000.0
GEMMA_WINDOW = 8


@dataclass
class Pair:
    arch: str
    hf: torch.nn.Module  # float64, eval mode
    path: Path
    spec: TinySpec
    vocab_size: int


def tiny_spec(arch: str, *, n_layer: int | None = None, tied: bool = True, seed: int = 0,
              extra_metadata: dict | None = None) -> TinySpec:
    if n_layer is None:
        n_layer = 6 if arch == "gemma3" else 2  # gemma3: 6 layers = 5 sliding + 1 global
    qwen3 = arch in ("qwen3", "qwen3moe")
    moe = arch == "qwen3moe"
    return TinySpec(arch=arch, n_layer=n_layer, n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                    context_length=256, rope_base=ROPE_BASE[arch], rms_eps=1e-6, tied_output=tied,
                    sliding_window=GEMMA_WINDOW, seed=seed, name=f"tiny-{arch}",
                    head_dim=QWEN3_HEAD_DIM if qwen3 else None, n_expert=N_EXPERT if moe else 0,
                    n_expert_used=N_EXPERT_USED if moe else 0, n_ff_expert=N_FF_EXPERT if moe else 0,
                    extra_metadata=dict(extra_metadata or {}))


def hf_config(spec: TinySpec, vocab_size: int, **overrides):
    import transformers as tf

    common = dict(vocab_size=vocab_size, hidden_size=spec.n_embd, intermediate_size=spec.n_ff,
                  num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                  num_key_value_heads=spec.n_head_kv, rms_norm_eps=spec.rms_eps,
                  max_position_embeddings=spec.context_length, tie_word_embeddings=spec.tied_output,
                  pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if spec.arch == "llama":
        return tf.LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base})
    if spec.arch == "qwen2":
        return tf.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base},
                              use_sliding_window=False)
    if spec.arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=spec.head_dim, use_sliding_window=False,
                              rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base}, **overrides)
    if spec.arch == "qwen3moe":
        return tf.Qwen3MoeConfig(**common, head_dim=spec.head_dim, use_sliding_window=False,
                                 num_experts=spec.n_expert, num_experts_per_tok=spec.n_expert_used,
                                 moe_intermediate_size=spec.n_ff_expert, norm_topk_prob=True,
                                 decoder_sparse_step=1, mlp_only_layers=[],
                                 rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base},
                                 **overrides)
    if spec.arch == "gemma3":
        head_dim = spec.n_embd // spec.n_head
        layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(spec.n_layer)]
        return tf.Gemma3TextConfig(
            **common, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=spec.sliding_window,
            layer_types=layer_types, hidden_activation="gelu_pytorch_tanh",
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": spec.rope_base},
                             "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA_LOCAL_BASE}},
            **overrides)
    raise ValueError(spec.arch)


def build_hf(spec: TinySpec, vocab_size: int, **overrides) -> torch.nn.Module:
    import transformers as tf

    cfg = hf_config(spec, vocab_size, **overrides)
    cls = getattr(tf, _CLASSES[spec.arch])
    torch.manual_seed(spec.seed)
    # MoE models: the eager per-expert loop (the grouped-matmul default has no float64 kernel)
    extra = {"experts_implementation": "eager"} if spec.n_expert else {}
    model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float64, **extra)
    g = torch.Generator().manual_seed(spec.seed + 1)
    gemma = spec.arch == "gemma3"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # llama/qwen: w ~ 1 + noise; gemma: stored as offset from 1
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "q_proj.weight" in name or "k_proj.weight" in name:
                # large enough that attention is peaked, so RoPE, masks and windows matter to the logits
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("mlp.gate.weight"):  # a MoE router: peaked enough that routing is decisive
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "embed_tokens" in name:
                p.copy_((0.1 if gemma else 0.5) * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.double().eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf LlamaModel.permute (q/k rows: rotate-half pairs -> adjacent pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def to_gguf_tensors(model: torch.nn.Module, spec: TinySpec) -> dict[str, np.ndarray]:
    gemma = spec.arch == "gemma3"
    out: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        a = t.detach().to(torch.float64).numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if spec.tied_output:
                continue
            gname = "output.weight"
        elif name.startswith("model.layers."):
            rest = name[len("model.layers."):]
            idx, sub = rest.split(".", 1)
            stem, kind = sub.rsplit(".", 1)
            if sub in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # [E, rows, cols], no ".weight"
                if sub.endswith("down_proj"):
                    out[f"blk.{idx}.ffn_down_exps.weight"] = np.ascontiguousarray(a.astype(np.float32))
                else:
                    gate, up = np.split(a, 2, axis=1)
                    out[f"blk.{idx}.ffn_gate_exps.weight"] = np.ascontiguousarray(gate.astype(np.float32))
                    out[f"blk.{idx}.ffn_up_exps.weight"] = np.ascontiguousarray(up.astype(np.float32))
                continue
            if stem == "mlp.gate":
                base = "ffn_gate_inp"
            elif stem == "post_attention_layernorm":
                base = "post_attention_norm" if gemma else "ffn_norm"
            elif stem == "pre_feedforward_layernorm":
                base = "ffn_norm"
            elif stem == "post_feedforward_layernorm":
                base = "post_ffw_norm"
            else:
                base = _LAYER_NAMES[stem]
            gname = f"blk.{idx}.{base}.{kind}"
            if spec.arch == "llama" and base in ("attn_q", "attn_k"):
                a = _permute(a, spec.n_head if base == "attn_q" else spec.n_head_kv)
        else:
            raise KeyError(f"unmapped HF tensor {name}")
        if gemma and "norm" in gname:
            a = a + 1.0  # GGUF convention for gemma norms: 1 + w
        out[gname] = np.ascontiguousarray(a.astype(np.float32))
    return out


def make_pair(arch: str, directory: Path, *, n_layer: int | None = None, tied: bool = True, seed: int = 0,
              final_softcap: float | None = None, attn_softcap: float | None = None) -> Pair:
    """``final_softcap``/``attn_softcap`` (gemma3 only): logit soft-capping, in the HF config and the GGUF."""
    meta, overrides = {}, {}
    if final_softcap:
        meta[f"{arch}.final_logit_softcapping"] = float(final_softcap)
        overrides["final_logit_softcapping"] = final_softcap
    if attn_softcap:
        meta[f"{arch}.attn_logit_softcapping"] = float(attn_softcap)
        overrides["attn_logit_softcapping"] = attn_softcap
    spec = tiny_spec(arch, n_layer=n_layer, tied=tied, seed=seed, extra_metadata=meta)
    vocab_size = len(vocab_for(spec)[0])
    hf = build_hf(spec, vocab_size, **overrides)
    # The GGUF holds f32: round the reference's weights to f32 first so both hold exactly the same.
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.float().double())
    path = Path(directory) / f"tiny-{arch}{'' if tied else '-untied'}{'-capped' if meta else ''}-{seed}.gguf"
    write_tiny_gguf(path, spec, tensors=to_gguf_tensors(hf, spec))
    return Pair(arch, hf, path, spec, vocab_size)


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double()


def hf_greedy(hf: torch.nn.Module, prompt: list[int], n_new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def write_variant(pair: Pair, dtype: str, directory: Path) -> Path:
    """The same weights stored with 2-D tensors as ``dtype`` ('F16', 'BF16', 'Q8_0', 'Q4_0')."""
    import dataclasses

    spec = dataclasses.replace(pair.spec, dtype=dtype)
    path = Path(directory) / f"{pair.path.stem}-{dtype}.gguf"
    return write_tiny_gguf(path, spec, tensors=to_gguf_tensors(pair.hf, spec))
