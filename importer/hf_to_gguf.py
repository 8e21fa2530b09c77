"""Converting a validated Hugging Face safetensors folder into a GGUF the engine runs.

What llama.cpp's convert_hf_to_gguf.py does for these architectures, in the engine's layout:

* tensor names through the ``gguf`` package's ``TensorNameMap`` for the architecture; NextN (MTP)
  modules in DeepSeek-V3/GLM naming (``model.layers.N.eh_proj`` & co.) become ``blk.N.nextn.*``, their
  block's attention and MLP the ordinary ``blk.N.*``; ``block_count`` stays ``num_hidden_layers``,
  so the engine's model never runs a head block as a layer;
* llama q/k rows permuted so RoPE pairs are adjacent (the engine rotates llama's pairs that way);
* gemma3 norms stored as 1 + w (the engine uses GGUF norm weights as they are);
* 2-D weights keep the source dtype (F32, F16 or BF16; F64 becomes F32), 1-D tensors are F32, and
  ``general.file_type`` records the dtype of the weights;
* llama 3.x RoPE scaling as a ``rope_freqs`` tensor of per-frequency factors;
* qwen3moe: each layer's per-expert ``mlp.experts.E.{gate,up,down}_proj`` stacked, in expert order,
  into one 3-D ``ffn_{gate,up,down}_exps`` [n_expert, rows, cols]; the router ``ffn_gate_inp`` kept F32
  (llama.cpp's converter never stores it below F32); ``expert_*`` metadata;
* gemma4 and gemma4-assistant: their own names, per-layer shapes and metadata (``gemma4_tensors``), norms as
  they are, a generated ``rope_freqs`` for the global layers' proportional RoPE; the 26B-A4B's experts already
  stacked in the checkpoint (copied as they are), its router ``ffn_gate_inp`` kept F32 as qwen3moe's;
* qwen35 / qwen35moe (Qwen3.5, Qwen3.6): their own names, value transforms (``TensorPlan.transforms``) and
  metadata (``qwen35_tensors``); the multimodal checkpoints' text model only; an MTP head (``mtp.*``) as block
  N with ``block_count`` N + 1, as llama.cpp writes qwen35.

Every tensor is checked against config.json (name, shape, dtype) before the output is opened, and
the output is written tensor by tensor: at most one tensor of the source is in memory at a time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import gguf
import numpy as np

from . import gemma4_tensors, qwen35_tensors
from .hf_config import ModelParams, read_params
from .hf_tokenizer import copy_vocab, has_tokenizer, read_vocab, write_vocab
from .request import CreateError
from .safetensors_import import FLOAT_DTYPES, HFSource, TensorReader, open_source
from .tensor_transforms import Transform, out_shape

ProgressFn = Callable[[int, int], None]  # (bytes written, total bytes)

_GGML = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
         "BF16": gguf.GGMLQuantizationType.BF16}
_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.int16}  # bf16 travels as its raw 16 bits
_FILE_TYPE = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
              "BF16": gguf.LlamaFileType.MOSTLY_BF16}
_MODEL_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "gemma3": gguf.MODEL_ARCH.GEMMA3,
               "qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE}
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")

_NEXTN_RE = re.compile(r"^model\.layers\.(\d+)\.(eh_proj|enorm|hnorm|shared_head\.norm|shared_head\.head|embed_tokens)"
                       r"\.weight$")
_NEXTN_TENSORS = {
    "eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ, "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
    "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM, "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
    "shared_head.head": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD, "embed_tokens": gguf.MODEL_TENSOR.NEXTN_EMBED_TOKENS,
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# The multimodal gemma3 keeps its text model under a prefix (transformers 4 / 5 spelling).
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_SKIP_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                  "model.audio_tower.", "model.embed_vision.", "model.embed_audio.", *gemma4_tensors.SKIPPED)

_ATTN_REQUIRED = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                  "ffn_norm.weight")
_BLOCK_REQUIRED = _ATTN_REQUIRED + ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
_ARCH_REQUIRED = {
    "llama": _BLOCK_REQUIRED,
    "qwen2": _BLOCK_REQUIRED + ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
    "gemma3": _BLOCK_REQUIRED + _QK_NORM + ("post_attention_norm.weight", "post_ffw_norm.weight"),
    "qwen3": _BLOCK_REQUIRED + _QK_NORM,
    "qwen3moe": _ATTN_REQUIRED + _QK_NORM + ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                                             "ffn_down_exps.weight"),
}
_NEXTN_REQUIRED = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


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
        return math.prod(self.shape) * np.dtype(_NP[self.out_type]).itemsize


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


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


# ------------------------------------------------------------------------------------------------
# planning: names, shapes, dtypes
# ------------------------------------------------------------------------------------------------
def _text_name(name: str) -> str | None:
    """The name in plain causal-LM spelling, or None for tensors that are not part of the text model."""
    if name.endswith("rotary_emb.inv_freq") or name.startswith(_SKIP_PREFIXES):
        return None
    for old, new in _TEXT_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _expected_shape(gname: str, p: ModelParams) -> tuple[int, ...] | None:
    """The shape config.json implies for a GGUF tensor name; None for a name the engine has no use for."""
    D, V, F, hd = p.n_embd, p.vocab_size, p.n_ff, p.head_dim
    E, Fe = p.n_expert, p.n_ff_expert
    q, kv = p.n_head * hd, p.n_head_kv * hd
    top = {"token_embd.weight": (V, D), "output.weight": (V, D), "output_norm.weight": (D,)}
    if gname in top:
        return top[gname]
    m = _BLOCK_RE.match(gname)
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


def _nextn_blocks(names: list[str]) -> tuple[int, ...]:
    return tuple(sorted({int(m.group(1)) for n in names if (m := _NEXTN_RE.match(n)) and m.group(2) == "eh_proj"}))


def _gguf_name(name: str, tmap: gguf.TensorNameMap, nextn: tuple[int, ...]) -> str | None:
    m = _NEXTN_RE.match(name)
    if m and int(m.group(1)) in nextn:
        return gguf.TENSOR_NAMES[_NEXTN_TENSORS[m.group(2)]].format(bid=int(m.group(1))) + ".weight"
    return tmap.get_name(name, try_suffixes=(".weight", ".bias"))


def _out_type(dtype: str, shape: tuple[int, ...], gname: str = "") -> str:
    if len(shape) < 2 or dtype in ("F32", "F64") or gname.endswith("ffn_gate_inp.weight"):
        return "F32"
    return dtype


def _order(name: str) -> tuple[int, int, str]:
    """token_embd, then blocks in numeric order, then the rest: a stable, readable layout."""
    m = _BLOCK_RE.match(name)
    if m:
        return (1, int(m.group(1)), name)
    return (0 if name == "token_embd.weight" else 2, 0, name)


def _plan_tensor(src: str, gname: str, entry_dtype: str, shape: tuple[int, ...], p: ModelParams,
                 role: str) -> TensorPlan:
    if entry_dtype not in FLOAT_DTYPES:
        raise _fail(role, f"tensor {src} is {entry_dtype}: the checkpoint is already quantized; import its "
                          "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")
    expected = _expected_shape(gname, p)
    if expected is None:
        raise _fail(role, f"tensor {src} ({gname}) is not supported by tandem's {p.arch} model")
    if tuple(shape) != expected:
        raise _fail(role, f"tensor {src} has shape {list(shape)}, but config.json implies {list(expected)}")
    permute = 0
    if p.arch == "llama":
        if gname.endswith(("attn_q.weight", "attn_q.bias")):
            permute = p.n_head
        elif gname.endswith(("attn_k.weight", "attn_k.bias")):
            permute = p.n_head_kv
    add_one = p.arch == "gemma3" and gname.endswith("norm.weight")
    return TensorPlan(src, gname, tuple(shape), _out_type(entry_dtype, shape, gname), permute, add_one)


def _plan_experts(experts: dict[tuple[int, str], dict[int, str]], source: HFSource, p: ModelParams,
                  role: str, n_blocks: int | None = None) -> list[TensorPlan]:
    """One stacked ``blk.L.ffn_{kind}_exps.weight`` per (layer, kind) from the per-expert source tensors
    (``n_blocks``: the blocks that may hold experts, the model's layers unless an MTP block follows them)."""
    if experts and not p.n_expert:
        raise _fail(role, f"the checkpoint has MoE experts, but tandem's {p.arch} model is dense")
    plans = []
    for (layer, kind), by_expert in sorted(experts.items()):
        if layer >= (p.n_layer if n_blocks is None else n_blocks):
            raise _fail(role, f"experts of layer {layer}, but config.json has {p.n_layer} layers")
        missing = [e for e in range(p.n_expert) if e not in by_expert]
        extra = sorted(e for e in by_expert if e >= p.n_expert)
        if missing or extra:
            what = f"lacks expert {missing[0]}" if missing else f"has expert {extra[0]}"
            raise _fail(role, f"layer {layer}'s {kind}_proj {what}; config.json has {p.n_expert} experts")
        srcs = tuple(by_expert[e] for e in range(p.n_expert))
        entries = [source.tensors[s] for s in srcs]
        dtypes = {en.dtype for en in entries}
        shapes = {tuple(en.shape) for en in entries}
        if len(dtypes) != 1 or len(shapes) != 1:
            raise _fail(role, f"layer {layer}'s experts ({kind}_proj) differ in dtype or shape")
        plan = _plan_tensor(srcs[0], f"blk.{layer}.ffn_{kind}_exps.weight", dtypes.pop(),
                            (p.n_expert, *shapes.pop()), p, role)
        plans.append(TensorPlan(plan.source, plan.name, plan.shape, plan.out_type, stack=srcs))
    return plans


def _required(p: ModelParams, nextn: tuple[int, ...], head_only: bool) -> list[str]:
    per_block = _ARCH_REQUIRED[p.arch]
    names = [f"blk.{b}.{s}" for b in nextn for s in per_block + _NEXTN_REQUIRED]
    if head_only:
        return names
    names += ["token_embd.weight", "output_norm.weight"] + ([] if p.tied_output else ["output.weight"])
    names += [f"blk.{b}.{s}" for b in range(p.n_layer) for s in per_block]
    return names


def plan_conversion(source: HFSource) -> ConversionPlan:
    """Map, check and order every tensor of ``source``; raises CreateError on the first problem."""
    role = source.role
    p = read_params(source.config, role)
    texts = {n: t for n in source.tensors if (t := _text_name(n)) is not None}
    if p.gemma4 is not None:
        return _plan_gemma4(source, p, texts)
    if p.qwen35 is not None:
        return _plan_qwen35(source, p, texts)
    nextn = _nextn_blocks(list(texts.values()))
    head_only = bool(nextn) and "model.embed_tokens.weight" not in texts.values()
    if not head_only and any(b < p.n_layer for b in nextn):
        raise _fail(role, f"layer {min(nextn)} holds an MTP (NextN) module but is one of the model's "
                          f"{p.n_layer} layers (NextN layers follow num_hidden_layers)")
    tmap = gguf.TensorNameMap(_MODEL_ARCH[p.arch], max([p.n_layer, *[b + 1 for b in nextn]]))
    plans: list[TensorPlan] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}  # (layer, gate|up|down) -> expert -> source name
    for src, text in texts.items():
        if text == "lm_head.weight" and p.tied_output:
            continue  # tied: the output is the embedding (a duplicate copy is not stored)
        if (m := _EXPERT_RE.match(text)) is not None:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = src
            continue
        gname = _gguf_name(text, tmap, nextn)
        if gname is None:
            raise _fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
        m = _BLOCK_RE.match(gname)
        if m and int(m.group(1)) >= p.n_layer and int(m.group(1)) not in nextn:
            raise _fail(role, f"tensor {src} belongs to layer {m.group(1)}, but config.json has "
                              f"{p.n_layer} layers and no MTP module there")
        entry = source.tensors[src]
        plans.append(_plan_tensor(src, gname, entry.dtype, entry.shape, p, role))
    plans += _plan_experts(experts, source, p, role)
    have = {t.name for t in plans}
    missing = [n for n in _required(p, nextn, head_only) if n not in have]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _fail(role, f"the safetensors lack {missing[0]}{more}, which config.json's model needs")
    plans.sort(key=lambda t: _order(t.name))
    generated = {}
    if p.rope_scaling and p.rope_scaling.kind == "llama3":
        generated["rope_freqs.weight"] = _llama3_rope_factors(p)
    return ConversionPlan(p, plans, generated, nextn, head_only, _file_type(plans))


def _plan_gemma4(source: HFSource, p: ModelParams, texts: dict[str, str]) -> ConversionPlan:
    """gemma4 / gemma4-assistant: its own names and per-layer shapes (``gemma4_tensors``), the same checks."""
    role, lay = source.role, p.gemma4
    assert lay is not None
    shapes = gemma4_tensors.expected_shapes(lay, p.n_embd, p.n_head, p.vocab_size, p.n_layer)
    plans: list[TensorPlan] = []
    for src, text in texts.items():
        if text == "lm_head.weight" and p.tied_output:
            continue
        gname = gemma4_tensors.gguf_name(text)
        if gname is not None and gemma4_tensors.unused(lay, gname):
            continue
        if gname is None or gname not in shapes:
            raise _fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
        entry = source.tensors[src]
        if entry.dtype not in FLOAT_DTYPES:
            raise _fail(role, f"tensor {src} is {entry.dtype}: the checkpoint is already quantized; import its "
                              "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")
        if tuple(entry.shape) != shapes[gname]:
            raise _fail(role, f"tensor {src} has shape {list(entry.shape)}, but config.json implies "
                              f"{list(shapes[gname])}")
        plans.append(TensorPlan(src, gname, tuple(entry.shape), _out_type(entry.dtype, entry.shape, gname)))
    have = {t.name for t in plans}
    missing = [n for n in gemma4_tensors.required(lay, p.tied_output) if n not in have]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _fail(role, f"the safetensors lack {missing[0]}{more}, which config.json's model needs")
    plans.sort(key=lambda t: _order(t.name))
    return ConversionPlan(p, plans, {"rope_freqs.weight": gemma4_tensors.rope_freqs(lay)}, (), False,
                          _file_type(plans))


def _plan_qwen35(source: HFSource, p: ModelParams, texts: dict[str, str]) -> ConversionPlan:
    """qwen35 / qwen35moe: ``qwen35_tensors``' names and transforms, each output's shape checked against config.json."""
    role, lay = source.role, p.qwen35
    assert lay is not None
    texts = {src: text for src, text in texts.items() if not text.startswith(("model.visual.", "visual."))}
    has_mtp = any(qwen35_tensors.is_mtp(t) for t in texts.values())
    n_nextn = 1 if has_mtp else 0
    head_only = has_mtp and "model.embed_tokens.weight" not in texts.values()
    if has_mtp and any(t.startswith("mtp.layers.") and not t.startswith("mtp.layers.0.") for t in texts.values()):
        raise _fail(role, "the MTP head has more than one layer (mtp.layers.1 and on); tandem imports one")
    n_blocks = p.n_layer + n_nextn
    shapes = {f"blk.{b}.{name}": shape for b in range(n_blocks)
              for name, shape in qwen35_tensors.expected_shapes(p, b, head=b >= p.n_layer).items()}
    shapes.update({"token_embd.weight": (p.vocab_size, p.n_embd), "output.weight": (p.vocab_size, p.n_embd),
                   "output_norm.weight": (p.n_embd,)})
    plans: list[TensorPlan] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    for src, raw in texts.items():
        if raw == "lm_head.weight" and p.tied_output:
            continue
        text = qwen35_tensors.canonical(raw, p.n_layer)
        if (m := qwen35_tensors.EXPERT_RE.match(text)) is not None:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = src
            continue
        entry = source.tensors[src]
        if entry.dtype not in FLOAT_DTYPES:
            raise _fail(role, f"tensor {src} is {entry.dtype}: the checkpoint is already quantized; import its "
                              "unquantized F32/F16/BF16 weights (then --quantize) or a GGUF")
        for mapped in qwen35_tensors.map_tensor(text, lay, p.n_layer) or [None]:
            if mapped is None or mapped.name not in shapes:
                raise _fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
            shape = out_shape(mapped.transforms, tuple(entry.shape))
            if shape != shapes[mapped.name]:
                raise _fail(role, f"tensor {src} has shape {list(entry.shape)}, but config.json implies "
                                  f"{list(shapes[mapped.name])} for {mapped.name}")
            kind = "F32" if mapped.name.endswith(qwen35_tensors.F32_ALWAYS) else _out_type(entry.dtype, shape)
            plans.append(TensorPlan(src, mapped.name, shape, kind, add_one=mapped.add_one,
                                    transforms=mapped.transforms))
    plans += _plan_experts(experts, source, p, role, n_blocks)
    names = [t.name for t in plans]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise _fail(role, f"the safetensors hold {dup} twice (fused and per-expert, or two spellings)")
    missing = [n for n in qwen35_tensors.required(p, n_nextn, head_only) if n not in set(names)]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _fail(role, f"the safetensors lack {missing[0]}{more}, which config.json's model needs")
    plans.sort(key=lambda t: _order(t.name))
    return ConversionPlan(p, plans, {}, tuple(range(p.n_layer, n_blocks)), head_only, _file_type(plans))


def _file_type(plans: list[TensorPlan]) -> int:
    """The dtype holding most weight elements (2-D tensors), as general.file_type."""
    counts: dict[str, int] = {}
    for t in plans:
        if len(t.shape) >= 2:
            counts[t.out_type] = counts.get(t.out_type, 0) + math.prod(t.shape)
    return int(_FILE_TYPE[max(counts, key=counts.__getitem__)] if counts else _FILE_TYPE["F32"])


def _llama3_rope_factors(p: ModelParams) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3.x scaling: each frequency's divisor (1, the factor, or between)."""
    s = p.rope_scaling
    assert s is not None
    freqs = 1.0 / (p.rope_base ** (np.arange(0, p.head_dim, 2, dtype=np.float64) / p.head_dim))
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s.factor)
        else:
            smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
            out.append(1.0 / ((1 - smooth) / s.factor + smooth))
    return np.asarray(out, dtype=np.float32)


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def _write_params(w: gguf.GGUFWriter, p: ModelParams, file_type: int, n_nextn: int = 0) -> None:
    w.add_file_type(file_type)
    if p.qwen35 is not None:
        qwen35_tensors.write_params(w, p, n_nextn)
        return
    if p.gemma4 is not None:
        gemma4_tensors.write_params(w, p.gemma4, context=p.context_length, n_embd=p.n_embd, n_head=p.n_head,
                                    rms_eps=p.rms_eps, vocab=p.vocab_size)
        return
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.n_embd)
    w.add_block_count(p.n_layer)
    w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_rope_freq_base(p.rope_base)
    w.add_rope_dimension_count(p.head_dim)
    w.add_vocab_size(p.vocab_size)  # the tokenizer is padded to (or must equal) the embedding rows
    if p.arch in ("gemma3", "qwen3", "qwen3moe") or p.head_dim != p.n_embd // p.n_head:
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
    if p.n_expert:
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        w.add_expert_feed_forward_length(p.n_ff_expert)
        if not p.expert_weights_norm:  # llama.cpp's qwen3moe renormalises unless told otherwise
            w.add_expert_weights_norm(False)
    if p.rope_scaling and p.rope_scaling.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(p.rope_scaling.factor)
    if p.sliding_window:
        w.add_sliding_window(p.sliding_window)
        w.add_sliding_window_pattern(list(p.sliding_layers))
    if p.rope_base_local is not None:
        w.add_rope_freq_base_swa(p.rope_base_local)
    if p.attn_scale is not None:
        w.add_attention_scale(p.attn_scale)
    if p.final_softcap is not None:
        w.add_final_logit_softcapping(p.final_softcap)


def _read(reader: TensorReader, plan: TensorPlan) -> Any:
    """The source tensor of ``plan`` (torch), or its experts stacked."""
    if not plan.stack:
        return reader.get(plan.source)
    import torch

    return torch.stack([reader.get(s) for s in plan.stack])


def _prepare(t: Any, plan: TensorPlan) -> np.ndarray:
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


def write_gguf(source: HFSource, plan: ConversionPlan, out: Path, vocab_writer: Callable[[gguf.GGUFWriter], None],
               progress: ProgressFn | None = None) -> None:
    """Write ``plan`` to ``out``: metadata first, then each tensor as it is read."""
    p = plan.params
    w = gguf.GGUFWriter(str(out), p.arch)
    try:
        _write_params(w, p, plan.file_type, len(plan.nextn_blocks))
        vocab_writer(w)
        for t in plan.tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(_NP[t.out_type]), t.nbytes, raw_dtype=_GGML[t.out_type])
        for name, arr in plan.generated.items():
            w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes, raw_dtype=_GGML["F32"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total, done = plan.total_bytes, 0
        with TensorReader(source) as reader:
            for t in plan.tensors:
                w.write_tensor_data(_prepare(_read(reader, t), t))
                done += t.nbytes
                if progress:
                    progress(done, total)
        for arr in plan.generated.values():
            w.write_tensor_data(arr)
        if progress:
            progress(total, total)
    finally:
        w.close()


def convert_folder(files: Mapping[str, Path], out: Path, role: str, progress: ProgressFn | None = None,
                   tokenizer_donor: Mapping[str, Any] | None = None) -> ConversionPlan:
    """Convert an uploaded Hugging Face folder (file name -> path) into the GGUF ``out``.

    ``tokenizer_donor``: GGUF metadata whose tokenizer an MTP head without tokenizer files adopts (the
    target's: a head speaks its target's vocabulary by construction).
    """
    source = open_source(files, role)
    plan = plan_conversion(source)
    vocab_writer = _vocab_writer(source, plan, tokenizer_donor)
    write_gguf(source, plan, out, vocab_writer, progress)
    return plan


def _vocab_writer(source: HFSource, plan: ConversionPlan,
                  donor: Mapping[str, Any] | None) -> Callable[[gguf.GGUFWriter], None]:
    """Read the tokenizer now (so a missing or bad one fails before anything is written)."""
    n_rows = plan.params.vocab_size
    # an MTP head or a Gemma 4 assistant drafts in its target's vocabulary by construction
    drafts_only = plan.head_only or plan.params.arch == "gemma4-assistant"
    if not has_tokenizer(source.files) and drafts_only and donor is not None:
        n_tokens = len(donor.get("tokenizer.ggml.tokens") or [])
        if n_tokens != n_rows:
            raise _fail(source.role, f"the MTP head predicts {n_rows} tokens, but the target's vocabulary has "
                                     f"{n_tokens}; a head must share its target's tokenizer")
        return lambda w: copy_vocab(w, donor)
    vocab = read_vocab(source.files, n_rows, source.role, gemma4=plan.params.arch.startswith("gemma4"))
    return lambda w: write_vocab(w, vocab, source.files)
