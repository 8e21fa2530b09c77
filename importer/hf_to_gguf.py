"""Converting a validated Hugging Face safetensors folder into a GGUF the engine runs: the generic driver.

What llama.cpp's convert_hf_to_gguf.py does, in the engine's layout. The architecture's module
(``importer/architectures/``, found through ``read_params``) decides what is its own; the rest is here:

* tensor names through the ``gguf`` package's ``TensorNameMap`` for the architecture (``ArchitectureSpec.name_map``)
  unless the architecture plans its tensors itself (``ArchitectureSpec.plan``: gemma4, qwen35); NextN (MTP)
  modules in DeepSeek-V3/GLM naming (``model.layers.N.eh_proj`` & co.) become ``blk.N.nextn.*``, their
  block's attention and MLP the ordinary ``blk.N.*``; ``block_count`` stays ``num_hidden_layers``,
  so the engine's model never runs a head block as a layer;
* per-expert ``mlp.experts.E.{gate,up,down}_proj`` stacked, in expert order, into one 3-D
  ``ffn_{gate,up,down}_exps`` [n_expert, rows, cols]; the router ``ffn_gate_inp`` kept F32;
* 2-D weights keep the source dtype (F32, F16 or BF16; F64 becomes F32), 1-D tensors are F32, and
  ``general.file_type`` records the dtype of the weights (``importer.hf.plan``);
* the common ``{arch}.*`` metadata, unless the architecture writes its own (``ArchitectureSpec.write_params``),
  then what it adds (``write_extra``); the tokenizer (``hf_tokenizer``).

Every tensor is checked against config.json (name, shape, dtype) before the output is opened, and
the output is written tensor by tensor: at most one tensor of the source is in memory at a time.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import gguf
import numpy as np

from engine.contract.capabilities import DRAFTER_ARCHITECTURES

from .architectures import SKIPPED_PREFIXES, spec_for
from .architectures.spec import ArchitectureSpec
from .hf.errors import fail
from .hf.params import ModelParams
from .hf.plan import (BLOCK_RE, EXPERT_RE, GGML, NP, ConversionPlan, TensorPlan, file_type, order, plan_experts,
                      plan_tensor, prepare, read, refuse_missing, text_name)
from .hf.safetensors import HFSource, TensorReader, open_source
from .hf_config import read_params
from .hf.vocab_copy import copy_vocab
from .hf_tokenizer import has_tokenizer, read_vocab, write_vocab

__all__ = ["ConversionPlan", "TensorPlan", "convert_folder", "plan_conversion", "write_gguf"]

ProgressFn = Callable[[int, int], None]  # (bytes written, total bytes)

_NEXTN_RE = re.compile(r"^model\.layers\.(\d+)\.(eh_proj|enorm|hnorm|shared_head\.norm|shared_head\.head|embed_tokens)"
                       r"\.weight$")
_NEXTN_TENSORS = {
    "eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ, "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
    "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM, "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
    "shared_head.head": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD, "embed_tokens": gguf.MODEL_TENSOR.NEXTN_EMBED_TOKENS,
}
_NEXTN_REQUIRED = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")


# ------------------------------------------------------------------------------------------------
# planning: names, shapes, dtypes
# ------------------------------------------------------------------------------------------------
def _nextn_blocks(names: list[str]) -> tuple[int, ...]:
    return tuple(sorted({int(m.group(1)) for n in names if (m := _NEXTN_RE.match(n)) and m.group(2) == "eh_proj"}))


def _gguf_name(name: str, tmap: gguf.TensorNameMap, nextn: tuple[int, ...]) -> str | None:
    m = _NEXTN_RE.match(name)
    if m and int(m.group(1)) in nextn:
        return gguf.TENSOR_NAMES[_NEXTN_TENSORS[m.group(2)]].format(bid=int(m.group(1))) + ".weight"
    return tmap.get_name(name, try_suffixes=(".weight", ".bias"))


def _plan_tensor(src: str, gname: str, entry_dtype: str, shape: tuple[int, ...], p: ModelParams,
                 spec: ArchitectureSpec, role: str) -> TensorPlan:
    plan = plan_tensor(src, gname, entry_dtype, shape, p, role)
    permute = 0
    if spec.permute_qk:
        if gname.endswith(("attn_q.weight", "attn_q.bias")):
            permute = p.n_head
        elif gname.endswith(("attn_k.weight", "attn_k.bias")):
            permute = p.n_head_kv
    add_one = spec.norms_add_one and gname.endswith("norm.weight")
    return replace(plan, permute_heads=permute, add_one=add_one)


def _required(p: ModelParams, spec: ArchitectureSpec, nextn: tuple[int, ...], head_only: bool) -> list[str]:
    per_block = spec.block_tensors
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
    spec = spec_for(p.arch)
    texts = {n: t for n in source.tensors if (t := text_name(n, SKIPPED_PREFIXES)) is not None}
    if spec.plan is not None:
        return spec.plan(source, p, texts)
    assert spec.name_map is not None, f"{p.arch}: a spec without a planner of its own needs a name_map"
    nextn = _nextn_blocks(list(texts.values()))
    head_only = bool(nextn) and "model.embed_tokens.weight" not in texts.values()
    if not head_only and any(b < p.n_layer for b in nextn):
        raise fail(role, f"layer {min(nextn)} holds an MTP (NextN) module but is one of the model's "
                         f"{p.n_layer} layers (NextN layers follow num_hidden_layers)")
    tmap = gguf.TensorNameMap(spec.name_map, max([p.n_layer, *[b + 1 for b in nextn]]))
    plans: list[TensorPlan] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}  # (layer, gate|up|down) -> expert -> source name
    for src, text in texts.items():
        if text == "lm_head.weight" and p.tied_output:
            continue  # tied: the output is the embedding (a duplicate copy is not stored)
        if (m := EXPERT_RE.match(text)) is not None:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = src
            continue
        gname = _gguf_name(text, tmap, nextn)
        if gname is None:
            raise fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
        m = BLOCK_RE.match(gname)
        if m and int(m.group(1)) >= p.n_layer and int(m.group(1)) not in nextn:
            raise fail(role, f"tensor {src} belongs to layer {m.group(1)}, but config.json has "
                             f"{p.n_layer} layers and no MTP module there")
        entry = source.tensors[src]
        plans.append(_plan_tensor(src, gname, entry.dtype, entry.shape, p, spec, role))
    plans += plan_experts(experts, source, p, role)
    refuse_missing(_required(p, spec, nextn, head_only), {t.name for t in plans}, role)
    plans.sort(key=lambda t: order(t.name))
    return ConversionPlan(p, plans, spec.generated(p), nextn, head_only, file_type(plans))


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def _write_params(w: gguf.GGUFWriter, p: ModelParams, file_type: int, n_nextn: int = 0) -> None:
    w.add_file_type(file_type)
    spec = spec_for(p.arch)
    if spec.write_params is not None:
        spec.write_params(w, p, n_nextn)
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
    if spec.writes_head_dim or p.head_dim != p.n_embd // p.n_head:
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
    spec.write_extra(w, p)


def write_gguf(source: HFSource, plan: ConversionPlan, out: Path, vocab_writer: Callable[[gguf.GGUFWriter], None],
               progress: ProgressFn | None = None) -> None:
    """Write ``plan`` to ``out``: metadata first, then each tensor as it is read."""
    p = plan.params
    w = gguf.GGUFWriter(str(out), p.arch)
    try:
        _write_params(w, p, plan.file_type, len(plan.nextn_blocks))
        vocab_writer(w)
        for t in plan.tensors:
            w.add_tensor_info(t.name, t.shape, np.dtype(NP[t.out_type]), t.nbytes, raw_dtype=GGML[t.out_type])
        for name, arr in plan.generated.items():
            w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes, raw_dtype=GGML["F32"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total, done = plan.total_bytes, 0
        with TensorReader(source) as reader:
            for t in plan.tensors:
                w.write_tensor_data(prepare(read(reader, t), t))
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
    # an MTP head or a drafter-only architecture (the Gemma 4 assistant) drafts in its target's vocabulary by
    # construction
    drafts_only = plan.head_only or plan.params.arch in DRAFTER_ARCHITECTURES
    if not has_tokenizer(source.files) and drafts_only and donor is not None:
        n_tokens = len(donor.get("tokenizer.ggml.tokens") or [])
        if n_tokens != n_rows:
            raise fail(source.role, f"the MTP head predicts {n_rows} tokens, but the target's vocabulary has "
                                     f"{n_tokens}; a head must share its target's tokenizer")
        return lambda w: copy_vocab(w, donor)
    vocab = read_vocab(source.files, n_rows, source.role, bpe_model=spec_for(plan.params.arch).tokenizer_model)
    return lambda w: write_vocab(w, vocab, source.files)
