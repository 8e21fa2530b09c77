"""Tensor plans: what each output tensor of a conversion is made from, checked before the output is opened.

The pieces every architecture's planning shares: the plan records, the dtype rules (2-D weights keep the
source dtype, F32, F16 or BF16, F64 becomes F32; 1-D tensors and MoE routers are F32), the decoder's shapes as
config.json implies them, stacking per-expert MoE tensors, the check that nothing required is missing, the
order tensors are written in, ``general.file_type``, and turning a read tensor into the bytes a GGUF stores.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np

from .errors import fail
from .params import ModelParams
from .safetensors import FLOAT_DTYPES, HFSource, TensorReader
from .transforms import Transform

GGML = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
        "BF16": gguf.GGMLQuantizationType.BF16}
NP = {"F32": np.float32, "F16": np.float16, "BF16": np.int16}  # bf16 travels as its raw 16 bits
FILE_TYPE = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "BF16": gguf.LlamaFileType.MOSTLY_BF16}
BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")

# The multimodal checkpoints keep their text model under a prefix (transformers 4 / 5 spelling).
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_SKIP_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                  "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


@dataclass(frozen=True)
class TensorPlan:
    """One output tensor: where it comes from and what is done to it on the way."""

    source: str  # safetensors name
    name: str  # GGUF name
    shape: tuple[int, ...]  # outermost first
    out_type: str  # "F32" | "F16" | "BF16"
    permute_heads: int = 0  # llama q/k: rows regrouped per head for adjacent-pair RoPE (0 = no)
    add_one: bool = False  # gemma norms: stored as 1 + w
    stack: tuple[str, ...] = ()  # MoE experts: these sources (one per expert, in order) stacked on a new dim 0
    transforms: tuple[Transform, ...] = ()  # run in order on the (stacked) source before the dtype conversion

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(NP[self.out_type]).itemsize


@dataclass(frozen=True)
class ConversionPlan:
    params: ModelParams
    tensors: list[TensorPlan]
    generated: dict[str, np.ndarray] = field(default_factory=dict)  # tensors computed from the config
    nextn_blocks: tuple[int, ...] = ()
    head_only: bool = False  # an MTP head alone (no embeddings, no layers of its own model)
    file_type: int = int(gguf.LlamaFileType.ALL_F32)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors) + sum(a.nbytes for a in self.generated.values())


def text_name(name: str, skip: tuple[str, ...] = ()) -> str | None:
    """The name in plain causal-LM spelling, or None for tensors that are not part of the text model (besides the
    vision and audio towers, those under ``skip``)."""
    if name.endswith("rotary_emb.inv_freq") or name.startswith(_SKIP_PREFIXES) or name.startswith(skip):
        return None
    for old, new in _TEXT_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def expected_shape(gname: str, p: ModelParams) -> tuple[int, ...] | None:
    """The shape config.json implies for a GGUF tensor name of a plain decoder block (its attention with optional
    biases and q/k norms, gemma-style extra norms, a dense or sparse FFN, NextN modules); None for a name the
    engine has no use for."""
    D, V, F, hd = p.n_embd, p.vocab_size, p.n_ff, p.head_dim
    E, Fe = p.n_expert, p.n_ff_expert
    q, kv = p.n_head * hd, p.n_head_kv * hd
    top = {"token_embd.weight": (V, D), "output.weight": (V, D), "output_norm.weight": (D,)}
    if gname in top:
        return top[gname]
    m = BLOCK_RE.match(gname)
    if not m:
        return None
    block = {
        "attn_norm.weight": (D,), "attn_q.weight": (q, D), "attn_k.weight": (kv, D), "attn_v.weight": (kv, D),
        "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_output.weight": (D, q),
        "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,), "ffn_norm.weight": (D,),
        "post_attention_norm.weight": (D,), "post_ffw_norm.weight": (D,),
        "ffn_gate.weight": (F, D), "ffn_up.weight": (F, D), "ffn_down.weight": (D, F),
        **({"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, Fe, D), "ffn_up_exps.weight": (E, Fe, D),
            "ffn_down_exps.weight": (E, D, Fe)} if E else {}),
        "nextn.eh_proj.weight": (D, 2 * D), "nextn.enorm.weight": (D,), "nextn.hnorm.weight": (D,),
        "nextn.shared_head_norm.weight": (D,), "nextn.shared_head_head.weight": (V, D),
        "nextn.embed_tokens.weight": (V, D),
    }
    return block.get(m.group(2))


def out_type(dtype: str, shape: tuple[int, ...], gname: str = "") -> str:
    if len(shape) < 2 or dtype in ("F32", "F64") or gname.endswith("ffn_gate_inp.weight"):
        return "F32"
    return dtype


def refuse_quantized_tensor(src: str, dtype: str, role: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise fail(role, f"tensor {src} is {dtype}: the checkpoint is already quantized; import its "
                         "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")


def order(name: str) -> tuple[int, int, str]:
    """token_embd, then blocks in numeric order, then the rest: a stable, readable layout."""
    m = BLOCK_RE.match(name)
    if m:
        return (1, int(m.group(1)), name)
    return (0 if name == "token_embd.weight" else 2, 0, name)


def plan_tensor(src: str, gname: str, entry_dtype: str, shape: tuple[int, ...], p: ModelParams,
                role: str) -> TensorPlan:
    """A decoder tensor checked against ``expected_shape``, stored as it is (the caller adds any transform)."""
    refuse_quantized_tensor(src, entry_dtype, role)
    expected = expected_shape(gname, p)
    if expected is None:
        raise fail(role, f"tensor {src} ({gname}) is not supported by tandem's {p.arch} model")
    if tuple(shape) != expected:
        raise fail(role, f"tensor {src} has shape {list(shape)}, but config.json implies {list(expected)}")
    return TensorPlan(src, gname, tuple(shape), out_type(entry_dtype, shape, gname))


def plan_experts(experts: dict[tuple[int, str], dict[int, str]], source: HFSource, p: ModelParams,
                 role: str, n_blocks: int | None = None) -> list[TensorPlan]:
    """One stacked ``blk.L.ffn_{kind}_exps.weight`` per (layer, kind) from the per-expert source tensors
    (``n_blocks``: the blocks that may hold experts, the model's layers unless an MTP block follows them)."""
    if experts and not p.n_expert:
        raise fail(role, f"the checkpoint has MoE experts, but tandem's {p.arch} model is dense")
    plans = []
    for (layer, kind), by_expert in sorted(experts.items()):
        if layer >= (p.n_layer if n_blocks is None else n_blocks):
            raise fail(role, f"experts of layer {layer}, but config.json has {p.n_layer} layers")
        missing = [e for e in range(p.n_expert) if e not in by_expert]
        extra = sorted(e for e in by_expert if e >= p.n_expert)
        if missing or extra:
            what = f"lacks expert {missing[0]}" if missing else f"has expert {extra[0]}"
            raise fail(role, f"layer {layer}'s {kind}_proj {what}; config.json has {p.n_expert} experts")
        srcs = tuple(by_expert[e] for e in range(p.n_expert))
        entries = [source.tensors[s] for s in srcs]
        dtypes = {en.dtype for en in entries}
        shapes = {tuple(en.shape) for en in entries}
        if len(dtypes) != 1 or len(shapes) != 1:
            raise fail(role, f"layer {layer}'s experts ({kind}_proj) differ in dtype or shape")
        plan = plan_tensor(srcs[0], f"blk.{layer}.ffn_{kind}_exps.weight", dtypes.pop(),
                           (p.n_expert, *shapes.pop()), p, role)
        plans.append(TensorPlan(plan.source, plan.name, plan.shape, plan.out_type, stack=srcs))
    return plans


def refuse_missing(required: list[str], have: set[str], role: str) -> None:
    missing = [n for n in required if n not in have]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise fail(role, f"the safetensors lack {missing[0]}{more}, which config.json's model needs")


def file_type(plans: list[TensorPlan]) -> int:
    """The dtype holding most weight elements (2-D tensors), as general.file_type."""
    counts: dict[str, int] = {}
    for t in plans:
        if len(t.shape) >= 2:
            counts[t.out_type] = counts.get(t.out_type, 0) + math.prod(t.shape)
    return int(FILE_TYPE[max(counts, key=counts.__getitem__)] if counts else FILE_TYPE["F32"])


def read(reader: TensorReader, plan: TensorPlan) -> Any:
    """The source tensor of ``plan`` (torch), or its experts stacked."""
    if not plan.stack:
        return reader.get(plan.source)
    import torch

    return torch.stack([reader.get(s) for s in plan.stack])


def prepare(t: Any, plan: TensorPlan) -> np.ndarray:
    """One source tensor (torch) transformed and laid out as the GGUF stores it."""
    import torch

    if plan.permute_heads:
        n = plan.permute_heads
        t = t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)
    for step in plan.transforms:
        t = step.apply(t)
    if plan.out_type == "F32":
        t = t.to(torch.float32)
        if plan.add_one:
            t = t + 1.0  # in f32, as the reference computes 1 + w
        return t.contiguous().numpy()
    if plan.out_type == "F16":
        return t.to(torch.float16).contiguous().numpy()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
