"""A tiny random transformers ``Qwen3_5ForCausalLM`` (or ``Qwen3_5MoeForCausalLM``) and the same weights as a
qwen35 (qwen35moe) GGUF, as llama.cpp's converter writes it, for oracle tests of the hybrid (Gated DeltaNet +
gated attention) model.

The converter's transforms, reproduced: ``A_log`` -> ``ssm_a`` = -exp(A_log); ``dt_bias`` -> ``ssm_dt.bias``;
the conv kernel squeezed to [channels, kernel]; every RMSNorm but the DeltaNet's output norm stored as 1 + w;
value heads reordered from grouped-by-key-head to tiled order (``_LinearAttentionVReorderBase``) in the v rows
of ``attn_qkv``, the conv's v channels, ``attn_gate``, ``ssm_alpha``/``ssm_beta``, ``ssm_a``/``ssm_dt`` and
the columns of ``ssm_out``; ``q_proj`` (q and the output gate interleaved per head) kept as ``attn_q``. The
metadata carries ``ssm.*``, ``full_attention_interval``, the partial RoPE dimension count and the mRoPE
sections. MoE: the experts' fused gate/up split into ``ffn_{gate,up}_exps``, the shared expert as
``ffn_*_shexp`` and its gate as ``ffn_gate_inp_shexp``. The reference runs in float64 (its delta rule casts to
float32).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from tests.tiny_gguf import TinySpec, vocab_for, write_tiny_gguf

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 128, 4, 2, 32
PARTIAL_ROTARY = 0.25  # rope over 8 of 32 dims, as the released models (64 of 256)
MROPE_SECTION = [2, 1, 1]  # halves of the rotated dims per (t, h, w); text positions make them one RoPE
LIN_K_HEADS, LIN_V_HEADS, LIN_K_DIM, LIN_V_DIM, CONV_KERNEL = 2, 4, 16, 16, 4
INTERVAL = 4
N_EXPERT, N_EXPERT_USED, N_FF_EXPERT, N_FF_SHARED = 8, 2, 32, 48


@dataclass
class Pair:
    hf: torch.nn.Module
    path: Path
    spec: TinySpec
    vocab_size: int
    mtp: "MtpHead | None" = None


def tiny_spec(*, n_layer: int = 4, tied: bool = True, seed: int = 0, moe: bool = False) -> TinySpec:
    arch = "qwen35moe" if moe else "qwen35"
    meta = {"ssm.conv_kernel": CONV_KERNEL, "ssm.state_size": LIN_K_DIM, "ssm.group_count": LIN_K_HEADS,
            "ssm.time_step_rank": LIN_V_HEADS, "ssm.inner_size": LIN_V_HEADS * LIN_V_DIM,
            "full_attention_interval": INTERVAL, "rope.dimension_count": int(HEAD_DIM * PARTIAL_ROTARY),
            "rope.dimension_sections": MROPE_SECTION + [0]}
    if moe:
        meta["expert_shared_feed_forward_length"] = N_FF_SHARED
    meta = {f"{arch}.{k}": v for k, v in meta.items()}
    # MoE: no dense FFN, so no feed_forward_length in the file (the converter writes none)
    return TinySpec(arch=arch, n_layer=n_layer, n_ff=0 if moe else N_FF, n_expert=N_EXPERT if moe else 0,
                    n_expert_used=N_EXPERT_USED if moe else 0, n_ff_expert=N_FF_EXPERT if moe else 0,
                    n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                    context_length=256, rope_base=10_000_000.0, rms_eps=1e-6, tied_output=tied, seed=seed,
                    name=f"tiny-{arch}", head_dim=HEAD_DIM, extra_metadata=meta)


def build_hf(spec: TinySpec, vocab_size: int) -> torch.nn.Module:
    import transformers as tf

    moe = spec.n_expert > 0
    extra = dict(num_experts=spec.n_expert, num_experts_per_tok=spec.n_expert_used,
                 moe_intermediate_size=spec.n_ff_expert, shared_expert_intermediate_size=N_FF_SHARED) if moe else {}
    if not moe:
        extra["intermediate_size"] = spec.n_ff
    cfg = (tf.Qwen3_5MoeTextConfig if moe else tf.Qwen3_5TextConfig)(**extra,
        vocab_size=vocab_size, hidden_size=spec.n_embd, num_hidden_layers=spec.n_layer,
        num_attention_heads=spec.n_head, num_key_value_heads=spec.n_head_kv, head_dim=spec.head_dim,
        rms_norm_eps=spec.rms_eps, max_position_embeddings=spec.context_length, tie_word_embeddings=spec.tied_output,
        linear_conv_kernel_dim=CONV_KERNEL, linear_key_head_dim=LIN_K_DIM, linear_value_head_dim=LIN_V_DIM,
        linear_num_key_heads=LIN_K_HEADS, linear_num_value_heads=LIN_V_HEADS,
        layer_types=["linear_attention" if (i + 1) % INTERVAL else "full_attention" for i in range(spec.n_layer)],
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base, "partial_rotary_factor": PARTIAL_ROTARY,
                         "mrope_section": MROPE_SECTION, "mrope_interleaved": True},
        pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(spec.seed)
    cls = tf.Qwen3_5MoeForCausalLM if moe else tf.Qwen3_5ForCausalLM
    # MoE: the eager per-expert loop (the grouped-matmul default has no float64 kernel)
    model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float64,
                             **({"experts_implementation": "eager"} if moe else {}))
    _randomize(model, torch.Generator().manual_seed(spec.seed + 1))
    return model.double().eval()


def _randomize(module: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            def rnd(scale):
                return scale * torch.randn(p.shape, generator=g, dtype=p.dtype)
            if name.endswith("linear_attn.norm.weight"):  # stored as is
                p.copy_(1.0 + rnd(0.1))
            elif "norm" in name:  # zero-centred: the model multiplies by 1 + w
                p.copy_(rnd(0.1))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, dtype=p.dtype).uniform_(-1.0, 1.0, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(rnd(0.5))
            elif "conv1d" in name:
                p.copy_(rnd(0.4))
            elif "q_proj.weight" in name or "k_proj.weight" in name or name.endswith("mlp.gate.weight"):
                p.copy_(rnd(0.3))
            elif "embed_tokens" in name:
                p.copy_(rnd(0.5))
            else:
                p.copy_(rnd(0.08))
            p.copy_(p.float().double())  # the GGUF holds f32: both hold exactly the same weights


class MtpHead(torch.nn.Module):
    """Qwen3.5's multi-token-prediction head as its checkpoints name it (``mtp.*``): ``fc`` over the
    concatenated normed token embedding and normed hidden state, one full-attention decoder layer, a
    final norm; the LM head is the target's. transformers has no module for it (it drops ``mtp.*``), so
    it is assembled here from transformers' own layer and norm classes, to serve as the oracle."""

    def __init__(self, hf: torch.nn.Module):
        super().__init__()
        cfg = hf.config
        moe = getattr(cfg, "num_experts", 0)
        if moe:
            from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
            layer_cls, norm_cls = m.Qwen3_5MoeDecoderLayer, m.Qwen3_5MoeRMSNorm
        else:
            from transformers.models.qwen3_5 import modeling_qwen3_5 as m
            layer_cls, norm_cls = m.Qwen3_5DecoderLayer, m.Qwen3_5RMSNorm
        full = cfg.layer_types.index("full_attention")
        D = cfg.hidden_size
        self.fc = torch.nn.Linear(2 * D, D, bias=False)
        self.pre_fc_norm_embedding = norm_cls(D, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(D, eps=cfg.rms_norm_eps)
        self.layers = torch.nn.ModuleList([layer_cls(cfg, full)])
        self.norm = norm_cls(D, eps=cfg.rms_norm_eps)

    @torch.no_grad()
    def outputs(self, hf: torch.nn.Module, hidden: torch.Tensor, next_tokens: list[int]) -> torch.Tensor:
        """g [n, D] for the pairs (hidden[j], next_tokens[j]) at positions 0..n-1, computed from scratch."""
        n = len(next_tokens)
        e = hf.model.embed_tokens(torch.tensor([next_tokens]))
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden[None])], dim=-1))
        pos = torch.arange(n).view(1, 1, -1).expand(3, 1, -1)
        rope = hf.model.rotary_emb(x, pos)
        mask = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)[None, None]
        out = self.layers[0](x, position_embeddings=rope, attention_mask=mask, position_ids=pos[0])
        out = out[0] if isinstance(out, tuple) else out
        return self.norm(out)[0]

    @torch.no_grad()
    def chain(self, hf: torch.nn.Module, tokens: list[int], drafts: list[int]) -> torch.Tensor:
        """Logits [len(tokens) - 1 + len(drafts), vocab]: the head's prediction after each pair of the prompt
        (from the target's final-normed states), then after each draft chained on the head's own output."""
        hidden = hf.model(torch.tensor([tokens])).last_hidden_state[0]
        pairs_h, pairs_t = list(hidden[:-1]), list(tokens[1:])
        g = self.outputs(hf, torch.stack(pairs_h), pairs_t)
        for d in drafts:
            pairs_h.append(g[-1])
            pairs_t.append(d)
            g = self.outputs(hf, torch.stack(pairs_h), pairs_t)
        return hf.lm_head(g)


def engine_head_logits(model, tokens: list[int], drafts: list[int]) -> torch.Tensor:
    """What ``MtpHead.chain`` computes, through the engine: the NextN head loaded from ``model``'s GGUF over
    the target's hidden states, then chained on its own outputs."""
    from engine.models.loader import find_nextn_block, load_nextn_head

    head = load_nextn_head(model, model.gguf, find_nextn_block(model.gguf.tensors), "f32")
    out = model.forward(tokens, model.new_cache(64), logits_for="all", return_hidden=True)
    cache = head.new_cache(64)
    g = head.forward(head.from_target(out.prenorm_hidden[:-1]), tokens[1:], cache)
    got = [head.logits(row) for row in g]
    last = g[-1]
    for d in drafts:  # chained: the head's own (normed) output stands in for the target's state
        last = head.forward(last.reshape(1, -1), [d], cache)[-1]
        got.append(head.logits(last))
    return torch.cat(got)


def build_mtp(hf: torch.nn.Module, seed: int) -> MtpHead:
    head = MtpHead(hf).double()
    _randomize(head, torch.Generator().manual_seed(seed + 2))
    return head.eval()


def mtp_gguf_tensors(head: MtpHead, spec: TinySpec) -> dict[str, np.ndarray]:
    """The head as llama.cpp's converter writes it: block ``n_layer`` holds its layer under the usual
    names and ``nextn.*`` the rest (fc -> eh_proj, the norms +1 like every qwen35 norm)."""
    layer = {"model.layers.0." + k[len("layers.0."):]: v for k, v in head.state_dict().items()
             if k.startswith("layers.0.")}

    class _Layer(torch.nn.Module):  # to_gguf_tensors reads a state_dict
        def state_dict(self):
            return layer

    out = {k.replace("blk.0.", f"blk.{spec.n_layer}.", 1): v for k, v in to_gguf_tensors(_Layer(), spec).items()}
    p = f"blk.{spec.n_layer}.nextn."
    sd = {k: v.detach().numpy() for k, v in head.state_dict().items()}
    out[p + "eh_proj.weight"] = sd["fc.weight"]
    for src, dst in (("pre_fc_norm_embedding", "enorm"), ("pre_fc_norm_hidden", "hnorm"), ("norm", "shared_head_norm")):
        out[p + dst + ".weight"] = sd[src + ".weight"] + 1.0
    return {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in out.items()}


def _tile_v(t: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
    """Value heads grouped by key head -> tiled (llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads)."""
    r = LIN_V_HEADS // LIN_K_HEADS
    shape = list(t.shape)
    t = t.reshape(shape[:axis] + [LIN_K_HEADS, r, head_dim] + shape[axis + 1:])
    return np.swapaxes(t, axis, axis + 1).reshape(shape)


_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
          "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_b": "ssm_beta",
          "linear_attn.out_proj": "ssm_out", "linear_attn.norm": "ssm_norm", "linear_attn.conv1d": "ssm_conv1d",
          "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
          "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
          "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def to_gguf_tensors(model: torch.nn.Module, spec: TinySpec) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    qk = 2 * LIN_K_HEADS * LIN_K_DIM
    for name, t in model.state_dict().items():
        a = t.detach().to(torch.float64).numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
            continue
        if name == "model.norm.weight":
            out["output_norm.weight"] = a + 1.0
            continue
        if name == "lm_head.weight":
            if not spec.tied_output:
                out["output.weight"] = a
            continue
        idx, sub = name[len("model.layers."):].split(".", 1)
        p = f"blk.{idx}."
        if sub == "linear_attn.A_log":
            out[p + "ssm_a"] = _tile_v(-np.exp(a)[:, None], 0, 1)[:, 0]
            continue
        if sub == "linear_attn.dt_bias":
            out[p + "ssm_dt.bias"] = _tile_v(a[:, None], 0, 1)[:, 0]
            continue
        if sub == "mlp.experts.gate_up_proj":  # [E, 2F, D]: gate rows first
            out[p + "ffn_gate_exps.weight"], out[p + "ffn_up_exps.weight"] = np.split(a, 2, axis=1)
            continue
        if sub == "mlp.experts.down_proj":
            out[p + "ffn_down_exps.weight"] = a
            continue
        stem, kind = sub.rsplit(".", 1)
        if stem == "linear_attn.in_proj_qkv":
            a = np.concatenate([a[:qk], _tile_v(a[qk:], 0, LIN_V_DIM)])
        elif stem == "linear_attn.conv1d":
            a = a.squeeze(1)
            a = np.concatenate([a[:qk], _tile_v(a[qk:], 0, LIN_V_DIM)])
        elif stem == "linear_attn.in_proj_z":
            a = _tile_v(a, 0, LIN_V_DIM)
        elif stem in ("linear_attn.in_proj_a", "linear_attn.in_proj_b"):
            a = _tile_v(a, 0, 1)
        elif stem == "linear_attn.out_proj":
            a = _tile_v(a, 1, LIN_V_DIM)
        elif "norm" in stem and stem != "linear_attn.norm":
            a = a + 1.0
        out[p + _NAMES[stem] + "." + kind] = a
    return {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in out.items()}


def make_pair(directory: Path, *, n_layer: int = 4, tied: bool = True, seed: int = 0, moe: bool = False,
              mtp: bool = False) -> Pair:
    """``mtp``: the GGUF also carries a NextN head (``Pair.mtp`` its oracle), as block ``n_layer``."""
    spec = tiny_spec(n_layer=n_layer, tied=tied, seed=seed, moe=moe)
    vocab_size = len(vocab_for(spec)[0])
    hf = build_hf(spec, vocab_size)
    tensors = to_gguf_tensors(hf, spec)
    head = None
    if mtp:
        head = build_mtp(hf, seed)
        tensors.update(mtp_gguf_tensors(head, spec))
        spec = replace(spec, n_nextn=1)
    path = Path(directory) / f"tiny-{spec.arch}-{n_layer}{'' if tied else '-untied'}-{seed}{'-mtp' if mtp else ''}.gguf"
    write_tiny_gguf(path, spec, tensors=tensors)
    return Pair(hf, path, spec, vocab_size, head)
