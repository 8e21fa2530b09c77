"""EAGLE-3 heads (``LlamaForCausalLMEagle3``, the folders SpecForge and EAGLE's own trainer write, which vLLM, SGLang
and llama.cpp load) as DRAFT layers: converted whole, into the ``eagle3`` GGUF ``engine/models/eagle3.py`` reads.

The checkpoint's one decoder layer (``midlayer.*``, or ``model.layers.0.*`` / ``layers.0.*``) becomes ``blk.0.*`` in
llama.cpp's names, ``hidden_norm`` included; ``fc`` fuses the target's three captured layers; ``lm_head`` scores
the head's draft vocabulary and ``d2t`` maps it to the target's (``t2d``, its inverse, is not needed). q/k keep
transformers' row order: the engine rotates the head's halves as transformers does. A head without tokenizer files
adopts its target's vocabulary (the donor): the engine checks a DRAFT's vocabulary against the target's.

What the head needs of its target is written down (``eagle3.embedding_length_out``: the target's width;
``eagle3.target_layers``: the layers it reads) so that ``tandem create`` refuses a head made for another target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import gguf
import numpy as np

from engine.contract.capabilities import EAGLE3, drafter_problem

from ..hf.errors import CreateError, fail
from ..hf.params import ModelParams, read_int, rope_entry, rope_scaling
from ..hf.plan import GGML, NP, TensorPlan, file_type, out_type, prepare, refuse_quantized_tensor
from ..hf.safetensors import HFSource, TensorReader, open_source
from ..hf.vocab_copy import copy_vocab
from .llama import rope_factors
from .spec import SILU, ArchitectureSpec

ProgressFn = Callable[[int, int], None]
HF_CLASSES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
_LAYER_PREFIXES = ("midlayer.", "model.layers.0.", "layers.0.")
_LAYER = {  # checkpoint name (after the layer prefix) -> GGUF name
    "input_layernorm.weight": "blk.0.attn_norm.weight",
    "hidden_norm.weight": "blk.0.hidden_norm.weight",
    "self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
_TOP = {  # checkpoint names (either spelling) -> GGUF name
    ("fc.weight", "model.fc.weight"): "fc.weight",
    ("norm.weight", "model.norm.weight"): "output_norm.weight",
    ("lm_head.weight",): "output.weight",
    ("embed_tokens.weight", "model.embed_tokens.weight"): "token_embd.weight",
}
_OPTIONAL = {"token_embd.weight"}


def _params(config: Mapping[str, Any], role: str) -> ModelParams:
    """The head's layer read as the llama layer it is (RoPE scaling included: Llama 3.x heads carry llama3's)."""
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise fail(role, f"an EAGLE-3 head of {config.get('num_hidden_layers')} layers is not supported (one layer)")
    act = config.get("hidden_act", "silu")
    if act not in SILU:
        raise fail(role, f"activation {act!r} is not supported for an EAGLE-3 head (tandem runs: silu)")
    n_embd = read_int(config, "hidden_size", role)
    n_head = read_int(config, "num_attention_heads", role)
    if n_head == 0:
        raise fail(role, "config.json: num_attention_heads is 0")
    entry, theta = rope_entry(config, None)
    return ModelParams(
        hf_arch=HF_CLASSES[0], arch=EAGLE3, n_layer=1, n_embd=n_embd,
        n_ff=read_int(config, "intermediate_size", role), n_head=n_head,
        n_head_kv=read_int(config, "num_key_value_heads", role, n_head),
        head_dim=read_int(config, "head_dim", role, n_embd // n_head),
        vocab_size=read_int(config, "vocab_size", role),
        context_length=read_int(config, "max_position_embeddings", role, 4096),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_base=float(theta if theta is not None else 10_000.0),
        rope_scaling=rope_scaling(entry, EAGLE3, ("linear", "llama3"), role),
        tied_output=False, n_nextn=0)


def _target_layers(config: Mapping[str, Any], role: str) -> list[int] | None:
    eagle = config.get("eagle_config") or {}
    layers = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if layers is None:
        return None
    if not isinstance(layers, list) or not layers or not all(isinstance(i, int) and i >= 0 for i in layers):
        raise fail(role, f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids must be layer numbers "
                         f"(got {layers!r})")
    return layers


def _plan(source: HFSource) -> tuple[list[TensorPlan], dict[str, str]]:
    """The output tensors (checked for presence, dtype and shape before anything is written), and the
    checkpoint names of d2t (if any)."""
    role, names = source.role, set(source.tensors)
    plans: list[TensorPlan] = []
    prefix = next((p for p in _LAYER_PREFIXES if p + "self_attn.q_proj.weight" in names), None)
    if prefix is None:
        raise fail(role, "no EAGLE-3 layer in the checkpoint (midlayer.self_attn.q_proj.weight)")
    wanted = [(prefix + src, dst) for src, dst in _LAYER.items()]
    for sources, dst in _TOP.items():
        src = next((s for s in sources if s in names), None)
        if src is None:
            if dst in _OPTIONAL:
                continue
            raise fail(role, f"the EAGLE-3 checkpoint lacks {sources[0]}")
        wanted.append((src, dst))
    for src, dst in wanted:
        if src not in names:
            raise fail(role, f"the EAGLE-3 checkpoint lacks {src}")
        entry = source.tensors[src]
        refuse_quantized_tensor(src, entry.dtype, role)
        plans.append(TensorPlan(src, dst, entry.shape, out_type(entry.dtype, entry.shape, dst)))
    extra = {"d2t": "d2t"} if "d2t" in names else {}
    return plans, extra


def _check_shapes(plans: list[TensorPlan], p, target_width: int, n_layers: int, draft_vocab: int, role: str) -> None:
    D, H, Hkv, hd, F = p.n_embd, p.n_head, p.n_head_kv, p.head_dim, p.n_ff
    expected = {
        "blk.0.attn_norm.weight": (D,), "blk.0.hidden_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
        "blk.0.attn_q.weight": (H * hd, 2 * D), "blk.0.attn_k.weight": (Hkv * hd, 2 * D),
        "blk.0.attn_v.weight": (Hkv * hd, 2 * D), "blk.0.attn_output.weight": (D, H * hd),
        "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D), "blk.0.ffn_down.weight": (D, F),
        "fc.weight": (D, n_layers * target_width), "output_norm.weight": (D,), "output.weight": (draft_vocab, D),
    }
    for t in plans:
        want = expected.get(t.name)
        if want is not None and tuple(t.shape) != want:
            raise fail(role, f"{t.source} has shape {list(t.shape)}, expected {list(want)} for this EAGLE-3 config")
    embed = next((t for t in plans if t.name == "token_embd.weight"), None)
    if embed is not None and embed.shape[1] != D:
        raise fail(role, f"{embed.source} has width {embed.shape[1]}, the head's is {D}")


def convert_folder(files: Mapping[str, Path], out: Path, role: str, progress: ProgressFn | None = None,
                   tokenizer_donor: Mapping[str, Any] | None = None) -> None:
    """Validate an uploaded EAGLE-3 folder and convert it into the ``eagle3`` GGUF ``out``."""
    if role != "DRAFT":
        raise fail(role, "an EAGLE-3 head only drafts for a target model; name it in DRAFT, beside FROM")
    source = open_source(files, role)
    config = source.config
    p = _params(config, role)
    layers = _target_layers(config, role)
    target_width = int(config.get("target_hidden_size") or p.n_embd)
    draft_vocab = int(config.get("draft_vocab_size") or p.vocab_size)
    n_layers = len(layers) if layers is not None else 3
    plans, extra = _plan(source)
    _check_shapes(plans, p, target_width, n_layers, draft_vocab, role)
    if "d2t" not in extra and draft_vocab != p.vocab_size:
        raise fail(role, f"the head drafts {draft_vocab} tokens of the target's {p.vocab_size} but has no d2t map")
    if tokenizer_donor is None:
        raise fail(role, "an EAGLE-3 head takes its target's vocabulary: create it with FROM and DRAFT together")
    n_tokens = len(tokenizer_donor.get("tokenizer.ggml.tokens") or [])
    if n_tokens and abs(n_tokens - p.vocab_size) > 128:
        raise fail(role, f"the EAGLE-3 head drafts over {p.vocab_size} tokens, but the target's vocabulary has "
                         f"{n_tokens}; a head must share its target's tokenizer")
    with TensorReader(source) as reader:
        d2t = None
        if "d2t" in extra:
            import torch

            d2t = reader.get("d2t").to(torch.int64)
            if tuple(d2t.shape) != (draft_vocab,):
                raise fail(role, f"d2t has shape {list(d2t.shape)}, expected [{draft_vocab}]")
            ids = d2t + torch.arange(draft_vocab)
            if int(ids.min()) < 0 or int(ids.max()) >= p.vocab_size:
                raise fail(role, f"d2t maps a draft token outside the target's {p.vocab_size} tokens")
            d2t = d2t.to(torch.int32).numpy()
        generated = rope_factors(p)
        _write(out, plans, reader, p, config, layers, target_width, draft_vocab, d2t, generated, tokenizer_donor,
               progress)


def _write(out: Path, plans: list[TensorPlan], reader: TensorReader, p, config: Mapping[str, Any],
           layers: list[int] | None, target_width: int, draft_vocab: int, d2t: np.ndarray | None,
           generated: dict[str, np.ndarray], donor: Mapping[str, Any], progress: ProgressFn | None) -> None:
    w = gguf.GGUFWriter(str(out), EAGLE3)
    try:
        w.add_file_type(file_type(plans))
        w.add_name(str(config.get("_name_or_path") or "eagle3 head"))
        w.add_context_length(p.context_length)
        w.add_embedding_length(p.n_embd)
        w.add_uint32(f"{EAGLE3}.embedding_length_out", target_width)
        w.add_block_count(1)
        w.add_feed_forward_length(p.n_ff)
        w.add_head_count(p.n_head)
        w.add_head_count_kv(p.n_head_kv)
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
        w.add_layer_norm_rms_eps(p.rms_eps)
        w.add_rope_freq_base(p.rope_base)
        if p.rope_scaling is not None and p.rope_scaling.kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(p.rope_scaling.factor)
        w.add_vocab_size(draft_vocab)
        if layers is not None:
            w.add_array(f"{EAGLE3}.target_layers", [int(i) for i in layers])
        w.add_bool(f"{EAGLE3}.norm_before_residual", bool(config.get("norm_before_residual", False)))
        copy_vocab(w, donor)
        for t in plans:
            w.add_tensor_info(t.name, t.shape, np.dtype(NP[t.out_type]), t.nbytes, raw_dtype=GGML[t.out_type])
        if d2t is not None:
            w.add_tensor_info("d2t", d2t.shape, d2t.dtype, d2t.nbytes, raw_dtype=gguf.GGMLQuantizationType.I32)
        for name, arr in generated.items():
            w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total, done = sum(t.nbytes for t in plans), 0
        for t in plans:
            w.write_tensor_data(prepare(reader.get(t.source), t))
            done += t.nbytes
            if progress:
                progress(done, total)
        if d2t is not None:
            w.write_tensor_data(d2t)
        for arr in generated.values():
            w.write_tensor_data(arr)
    finally:
        w.close()


def pair_problem(config: Mapping[str, Any], target) -> str | None:
    """Why an EAGLE-3 head (its config.json) cannot draft for ``target`` (a target's ModelParams), or None."""
    width = int(config.get("target_hidden_size") or config.get("hidden_size") or 0)
    problem = drafter_problem(EAGLE3, width or None, target.arch, target.n_embd)
    if problem is not None:
        return problem
    try:
        layers = _target_layers(config, "DRAFT")
    except CreateError as e:
        return str(e)
    bad = [i for i in (layers or ()) if i > target.n_layer]
    if bad:
        return f"the EAGLE-3 head reads target layer {bad[0]}, but the target has {target.n_layer} layers"
    return None


EAGLE3_SPEC = ArchitectureSpec(arch=EAGLE3, hf_classes=HF_CLASSES, convert_folder=convert_folder,
                               pair_problem=pair_problem)
SPECS = (EAGLE3_SPEC,)
