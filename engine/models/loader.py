"""GGUF -> ``Model`` (and NextN head): the one place in the engine that knows GGUF tensor names.

It opens the file, reads the config through the architecture registry (``engine.models``), builds each
layer's ``Linear`` modules and tensors with ``engine.ops.linear`` and assembles the layers and the model
(``engine.models.layers``, ``engine.models.transformer``, ``engine.models.nextn``), which take weights
and know nothing of where they came from.

Memory: each layer's source pages are released once its weights are converted, so the peak stays near
the converted model rather than converted model + mapped file. The file stays open with the model: the
token embedding reads its rows from the mapping on demand, and some weight formats may be views of it.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Sequence

import torch
from torch import nn

from engine.contract.adapter import AdapterError
from engine.contract.capabilities import drafter_target_width
from engine.contract.gguf import GGUFError, GGUFFile
from engine.models import bert, gemma4_assistant, get_arch
from engine.models.gemma4_assistant_model import AssistantWeights, Gemma4Assistant
from engine.models.config import ModelConfig, UnsupportedModelError, WeightLayout
from engine.models.deltanet import DeltaNetWeights, HybridBlock, HybridBlockWeights
from engine.models.encoder import DenseWeights, Encoder, EncoderLayerWeights, EncoderWeights, NormWeights
from engine.models.gemma4_moe import Gemma4MoE
from engine.models.layers import Block, BlockWeights, FeedForward
from engine.models.moe import Router, SharedExpertMoE, SparseMoE
from engine.models.nextn import NextNHead, NextNWeights
from engine.models.per_layer import PerLayerInput
from engine.models.transformer import Model
from engine.ops.dequant import load_tensor
from engine.ops.linear import Embedding, format_problem, load_linear
from engine.ops.linear import default_format as linear_default_format
from engine.ops.lora import LoraWeights
from engine.ops.memory import place_on_huge_pages
from engine.ops.pack_cache import PackCache

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"
OUTPUT_NORM = "output_norm.weight"
ROPE_FREQS = "rope_freqs.weight"
PER_LAYER_TOKEN_EMBD = "per_layer_token_embd.weight"
PER_LAYER_MODEL_PROJ = "per_layer_model_proj.weight"
PER_LAYER_PROJ_NORM = "per_layer_proj_norm.weight"
NEXTN_PRE_PROJECTION = "nextn.pre_projection.weight"
NEXTN_POST_PROJECTION = "nextn.post_projection.weight"
_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.eh_proj\.weight$")


# ------------------------------------------------------------------------------------------------
# config
# ------------------------------------------------------------------------------------------------

def output_weight_name(cfg: ModelConfig) -> str:
    """The GGUF tensor the output head reads: the embedding table itself when the model ties them."""
    return EMBEDDING if cfg.tied_output else OUTPUT


def weight_layout(f: GGUFFile) -> WeightLayout:
    """The config's facts that come from which tensors ``f`` holds."""
    emb = f.tensors.get(EMBEDDING)
    if emb is None:
        raise UnsupportedModelError(f"{f.path}: GGUF has no {EMBEDDING}")
    return WeightLayout(
        vocab_size=emb.dims[1] if len(emb.dims) > 1 else None,
        tied_output=OUTPUT not in f.tensors,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors,
    )


def read_config(f: GGUFFile) -> ModelConfig:
    """The ModelConfig of an open GGUF, via its architecture's module in ``engine.models``."""
    arch = get_arch(f.architecture, f.path)
    return arch.read_config(f, weight_layout(f))


# ------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------
def load_block_weights(f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device) -> BlockWeights:
    """Block ``i``'s weights (``blk.{i}.*``): q/k/v fused into one linear, gate/up into another.

    A layer that reads another layer's K/V (``cfg.kv_layer``) loads only its q rows (any k/v tensors the
    file still has for it are unused); a layer without ``attn_v`` uses its K projection as V."""
    p = f"blk.{i}."

    def norm(name: str) -> torch.Tensor:
        return load_tensor(f, p + name + ".weight")

    def linear(name: str):
        return load_linear(f, p + name + ".weight", fmt, device=device)

    owns_kv = cfg.owns_kv(i)
    v_from_k = owns_kv and p + "attn_v.weight" not in f.tensors
    parts = ("attn_q", "attn_k", "attn_v") if owns_kv and not v_from_k else ("attn_q", "attn_k") if owns_kv \
        else ("attn_q",)
    qkv = [p + part + ".weight" for part in parts]
    bias = [p + part + ".bias" for part in parts] if cfg.qkv_bias else None
    ple = cfg.per_layer_input > 0
    moe = load_moe(f, cfg, i, fmt, device) if cfg.moe is not None else None
    return BlockWeights(
        attn_norm=norm("attn_norm"),
        wqkv=load_linear(f, qkv, fmt, bias_names=bias, device=device),
        wo=linear("attn_output"),
        q_norm=norm("attn_q_norm") if cfg.qk_norm else None,
        k_norm=norm("attn_k_norm") if cfg.qk_norm and owns_kv else None,
        ffn_norm=None if cfg.moe is not None and cfg.moe.dense_branch else norm("ffn_norm"),
        w13=None if moe else load_linear(f, [p + "ffn_gate.weight", p + "ffn_up.weight"], fmt, device=device),
        w2=None if moe else linear("ffn_down"),
        post_attn_norm=norm("post_attention_norm") if cfg.post_norms else None,
        post_ffn_norm=norm("post_ffw_norm") if cfg.post_norms else None,
        ffn=moe,
        v_from_k=v_from_k,
        ple_gate=linear("inp_gate") if ple else None,
        ple_proj=linear("proj") if ple else None,
        ple_norm=norm("post_norm") if ple else None,
        out_scale=norm("layer_output_scale") if p + "layer_output_scale.weight" in f.tensors else None,
    )


def load_hybrid_block_weights(f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device, *,
                              attention: bool | None = None) -> HybridBlockWeights:
    """Block ``i`` of a hybrid recurrent model (qwen35) as llama.cpp's converter names it: a Gated DeltaNet
    layer (``attn_qkv``, ``attn_gate`` (z), ``ssm_beta``, ``ssm_alpha``, ``ssm_conv1d`` [conv_dim, kernel],
    ``ssm_a`` (-exp(A_log)), ``ssm_dt.bias``, ``ssm_norm``, ``ssm_out``) or full attention whose ``attn_q``
    rows hold q and the output gate interleaved per head; ``post_attention_norm`` is the FFN's input norm.
    ``attention``: which of the two (None: as ``cfg.recurrent.layers`` says; a NextN head block, past the
    layers, is attention)."""
    p = f"blk.{i}."

    def linear(name: str) -> object:
        return load_linear(f, p + name + ".weight", fmt, device=device)

    def tensor(name: str) -> torch.Tensor:
        if p + name not in f.tensors:
            raise UnsupportedModelError(f"{f.path}: GGUF has no {p + name}")
        return load_tensor(f, p + name)

    r = cfg.recurrent
    if cfg.moe is not None:  # qwen35moe: routed experts beside a sigmoid-gated shared expert
        _check_shape(f, p + "ffn_gate_inp_shexp.weight", (1, cfg.n_embd))
        shared = FeedForward(cfg, load_linear(f, [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"], fmt,
                                              device=device), linear("ffn_down_shexp"))
        w = HybridBlockWeights(attn_norm=tensor("attn_norm.weight"), post_attn_norm=tensor("post_attention_norm.weight"),
                               w13=None, w2=None,
                               ffn=SharedExpertMoE(load_experts(f, cfg, i, fmt, device), shared,
                                                   load_linear(f, p + "ffn_gate_inp_shexp.weight", "f32", device=device)))
    else:
        w = HybridBlockWeights(attn_norm=tensor("attn_norm.weight"), post_attn_norm=tensor("post_attention_norm.weight"),
                               w13=load_linear(f, [p + "ffn_gate.weight", p + "ffn_up.weight"], fmt, device=device),
                               w2=linear("ffn_down"))
    if (r.layers[i] if attention is None else not attention):
        _check_shape(f, p + "ssm_conv1d.weight", (r.conv_dim, r.conv_kernel))
        for name in ("ssm_a", "ssm_dt.bias"):
            _check_shape(f, p + name, (r.n_v_heads,))
        w.deltanet = DeltaNetWeights(
            w_in=load_linear(f, [p + n + ".weight" for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")],
                             fmt, device=device),
            conv=tensor("ssm_conv1d.weight"), a=tensor("ssm_a"), dt_bias=tensor("ssm_dt.bias"),
            norm=tensor("ssm_norm.weight"), out=linear("ssm_out"))
    else:
        w.wqkv = load_linear(f, [p + n + ".weight" for n in ("attn_q", "attn_k", "attn_v")], fmt, device=device)
        w.wo = linear("attn_output")
        w.q_norm, w.k_norm = tensor("attn_q_norm.weight"), tensor("attn_k_norm.weight")
    return w


def load_moe(f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device) -> nn.Module:
    """Block ``i``'s MoE FFN: the experts alone (qwen3moe), or beside a dense FFN (gemma4's 26B)."""
    experts = load_experts(f, cfg, i, fmt, device)
    return load_gemma4_moe(f, cfg, i, experts, fmt, device) if cfg.moe.dense_branch else experts


def load_experts(f: GGUFFile, cfg: ModelConfig, i: int, fmt: str, device: torch.device) -> SparseMoE:
    """Block ``i``'s sparse MoE FFN in llama.cpp's layout: the router ``ffn_gate_inp`` [n_expert, n_embd]
    (kept f32: routing decides which weights run at all, and it is small) and the experts stacked in
    ``ffn_{gate,up,down}_exps`` [n_expert, rows, cols], gate and up either apart or fused in
    ``ffn_gate_up_exps`` [n_expert, 2 * rows, cols] (gate rows first; gemma4). Expert e is its rows of each,
    loaded in ``fmt`` from its stored type like any other linear (gate and up fused)."""
    p = f"blk.{i}."
    m = cfg.moe
    F, D = m.n_ff_expert, cfg.n_embd
    fused = p + "ffn_gate_up_exps.weight" in f.tensors
    gate_up = [(p + "ffn_gate_up_exps.weight", (m.n_expert, 2 * F, D))] if fused else \
        [(p + "ffn_gate_exps.weight", (m.n_expert, F, D)), (p + "ffn_up_exps.weight", (m.n_expert, F, D))]
    for name, want in ((p + "ffn_gate_inp.weight", (m.n_expert, D)), *gate_up,
                       (p + "ffn_down_exps.weight", (m.n_expert, D, F))):
        _check_shape(f, name, want)
    router = Router(load_linear(f, p + "ffn_gate_inp.weight", "f32", device=device), m.n_expert_used,
                    normalize=m.normalize_weights, scale=m.weights_scale)
    names = [name for name, _ in gate_up]
    rows = 2 * F if fused else F
    experts = [FeedForward(cfg,
                           load_linear(f, names, fmt, device=device, rows=(e * rows, (e + 1) * rows)),
                           load_linear(f, p + "ffn_down_exps.weight", fmt, device=device, rows=(e * D, (e + 1) * D)))
               for e in range(m.n_expert)]
    return SparseMoE(router, experts)


def load_gemma4_moe(f: GGUFFile, cfg: ModelConfig, i: int, experts: SparseMoE, fmt: str,
                    device: torch.device) -> Gemma4MoE:
    """Block ``i``'s experts beside its dense FFN, as llama.cpp's converter names gemma4's tensors: the dense
    branch ``ffn_{gate,up,down}`` between ``ffn_norm`` and ``post_ffw_norm_1``, the experts between
    ``pre_ffw_norm_2`` and ``post_ffw_norm_2``, the router's input scale ``ffn_gate_inp.scale`` [n_embd] and
    the per-expert scale ``ffn_down_exps.scale`` [n_expert]."""
    p = f"blk.{i}."
    _check_shape(f, p + "ffn_gate_inp.scale", (cfg.n_embd,))
    _check_shape(f, p + "ffn_down_exps.scale", (cfg.moe.n_expert,))

    def norm(name: str) -> torch.Tensor:
        return load_tensor(f, p + name + ".weight")

    dense = FeedForward(cfg, load_linear(f, [p + "ffn_gate.weight", p + "ffn_up.weight"], fmt, device=device),
                        load_linear(f, p + "ffn_down.weight", fmt, device=device))
    return Gemma4MoE(dense, experts, dense_norm=norm("ffn_norm"), dense_post_norm=norm("post_ffw_norm_1"),
                     experts_norm=norm("pre_ffw_norm_2"), experts_post_norm=norm("post_ffw_norm_2"),
                     router_scale=load_tensor(f, p + "ffn_gate_inp.scale"),
                     expert_scale=load_tensor(f, p + "ffn_down_exps.scale"), eps=cfg.rms_eps)


def _gguf_of(path_or_file: str | os.PathLike | GGUFFile) -> tuple[GGUFFile, bool]:
    """The file to read and whether this load opened it (and so closes it if the load fails)."""
    if isinstance(path_or_file, GGUFFile):
        return path_or_file, False
    return GGUFFile(path_or_file), True


def _check_shape(f: GGUFFile, name: str, want: tuple[int, ...]) -> None:
    info = f.tensors.get(name)
    if info is None or tuple(info.shape) != want:
        got = "missing" if info is None else f"shape {tuple(info.shape)}"
        raise UnsupportedModelError(f"{f.path}: {name} is {got}, expected {want}")


def default_format(f: GGUFFile, device: torch.device, role: str = "target") -> str:
    """'auto': engine.ops.linear's choice from the GGUF's linear weight types on CPU; bf16 elsewhere."""
    if device.type != "cpu":
        return "bf16"
    types = {t.type_name for name, t in f.tensors.items() if name.startswith("blk.") and len(t.dims) >= 2}
    return linear_default_format(role, types)


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------
def _placed(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` with the weights its load built moved onto 2 MB pages (``engine.ops.memory``), on the CPU."""
    if device.type == "cpu":
        place_on_huge_pages(module)
    return module


def _build_model(f: GGUFFile, cfg: ModelConfig, fmt: str, dtype: torch.dtype, device: torch.device) -> Model:
    # Embedding rows are dequantized on demand from the mmap: the GGUFFile must stay open.
    embed = Embedding(f, EMBEDDING, dtype, device=device)
    blocks = []
    for i in range(cfg.n_layer):
        if cfg.recurrent is not None:
            blocks.append(HybridBlock(cfg, i, load_hybrid_block_weights(f, cfg, i, fmt, device)))
        else:
            blocks.append(Block(cfg, i, load_block_weights(f, cfg, i, fmt, device)))
        f.release_pages()  # this layer's source bytes are converted: keep peak memory near the result
    norm = load_tensor(f, OUTPUT_NORM)
    output = load_linear(f, output_weight_name(cfg), fmt, device=device)
    f.release_pages()
    rope_freqs = load_tensor(f, ROPE_FREQS) if ROPE_FREQS in f.tensors else None
    per_layer = None
    if cfg.per_layer_input:
        per_layer = PerLayerInput(Embedding(f, PER_LAYER_TOKEN_EMBD, dtype, device=device),
                                  load_linear(f, PER_LAYER_MODEL_PROJ, fmt, device=device),
                                  load_tensor(f, PER_LAYER_PROJ_NORM), n_layer=cfg.n_layer,
                                  width=cfg.per_layer_input, n_embd=cfg.n_embd, eps=cfg.rms_eps)
    return Model(cfg, embed=embed, layers=blocks, norm=norm, output=output, fmt=fmt, dtype=dtype, device=device,
                 rope_freqs=rope_freqs, per_layer_input=per_layer)


def load_model(path_or_file: str | os.PathLike | GGUFFile, fmt: str = "auto", device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None, *, role: str = "target", pack_dir: str | os.PathLike | None = None,
               adapters: Sequence[str] = ()) -> Model:
    """Load a GGUF into a ``Model``.

    ``fmt``: weight format of the linear layers (``engine.ops.linear.FORMATS``); 'auto' asks
    ``engine.ops.linear.default_format(role, weight types)`` on CPU (a float target at its stored precision,
    a quantized one in its own codes where the qdot kernel builds) and is dense bf16 elsewhere. ``dtype``: compute dtype of activations and of the KV
    cache; default f32 on CPU (norms, RoPE and attention in f32 as llama.cpp does; the linears cast
    internally) and bf16 on CUDA unless fmt is 'f32'. ``pack_dir``: where packed kernel layouts are cached
    (``engine.ops.pack_cache``): a later load of the same file maps them instead of rebuilding them; the
    file's ``packs`` stays set, so weights loaded from it afterwards (a NextN head) are cached too once
    their loader calls ``f.packs.save()``. ``adapters``: LoRA adapter GGUFs added to the linears at run time
    (``engine.ops.lora``; an adapter that does not fit the file is an ``UnsupportedModelError``).
    """
    device = torch.device(device)
    f, owned = _gguf_of(path_or_file)
    try:
        config = read_config(f)
        if fmt == "auto":
            fmt = default_format(f, device, role)
        problem = format_problem(fmt, device)
        if problem is not None:
            raise UnsupportedModelError(problem)
        if dtype is None:
            dtype = torch.float32 if (device.type == "cpu" or fmt == "f32") else torch.bfloat16
        if pack_dir is not None and device.type == "cpu":
            f.packs = PackCache(pack_dir, f.path, fmt)
        if adapters:
            f.lora = _lora_weights(adapters, f)
        model = _build_model(f, config, fmt, dtype, device)
        _placed(model, device)  # before the save below reads the tensors from another thread
        if f.packs is not None:
            f.packs.save(background=True)  # ``f.packs.wait()`` to know it is on disk
    except BaseException:
        if owned:
            f.close()
        raise
    model.source_path = f.path
    # Keep the file open with the model: some weight formats may stay as views of the mapping,
    # and the embedding reads its rows from it.
    model.gguf = f
    if device.type != "cpu":
        model.to(device)  # norms and the other small tensors; linears were built on the device
    return model.eval()


def _lora_weights(paths: Sequence[str], f: GGUFFile) -> LoraWeights:
    try:
        return LoraWeights.load(paths, f)
    except (AdapterError, GGUFError) as e:
        raise UnsupportedModelError(f"adapter: {e}") from None


# ------------------------------------------------------------------------------------------------
# Gemma 4 assistant (MTP drafter)
# ------------------------------------------------------------------------------------------------
def load_assistant(target: Model, f: GGUFFile, fmt: str) -> Gemma4Assistant:
    """The gemma4-assistant in ``f`` over ``target``; ``UnsupportedModelError`` if it does not fit it."""
    device = target.device
    own = gemma4_assistant.read_config(f, weight_layout(f))
    cfg = gemma4_assistant.bind_to_target(own, target.config, drafter_target_width(gemma4_assistant.ARCH, f.metadata))
    blocks = []
    for i in range(cfg.n_layer):
        blocks.append(load_block_weights(f, cfg, i, fmt, device))
        f.release_pages()
    weights = AssistantWeights(
        blocks=blocks,
        pre_proj=load_linear(f, NEXTN_PRE_PROJECTION, fmt, device=device),
        post_proj=load_linear(f, NEXTN_POST_PROJECTION, fmt, device=device),
        norm=load_tensor(f, OUTPUT_NORM),
        output=load_linear(f, EMBEDDING, fmt, device=device),
        rope_freqs=load_tensor(f, ROPE_FREQS) if ROPE_FREQS in f.tensors else None,
    )
    f.release_pages()
    if weights.pre_proj.in_features != 2 * target.config.n_embd:
        raise UnsupportedModelError(f"{f.path}: the assistant's pre-projection takes {weights.pre_proj.in_features} "
                                    f"values, not twice the target's width {target.config.n_embd}")
    return _placed(Gemma4Assistant(cfg, target, weights).eval(), device)


# ------------------------------------------------------------------------------------------------
# NextN (MTP) head
# ------------------------------------------------------------------------------------------------
def find_nextn_block(tensor_names) -> int | None:
    """The block index N of a NextN head (``blk.N.nextn.eh_proj.weight``), or None."""
    for name in tensor_names:
        m = _NEXTN.match(name)
        if m:
            return int(m.group(1))
    return None


def nextn_hidden_size(f: GGUFFile, block: int) -> int:
    """The hidden size the NextN head in block ``block`` of ``f`` works in (its eh_proj's output rows)."""
    return f.tensors[f"blk.{block}.nextn.eh_proj.weight"].shape[0]


def load_nextn_head(target: Model, f: GGUFFile, block: int, fmt: str) -> NextNHead:
    """The NextN head in block ``block`` of ``f`` (the target's own file or a head-only one) over ``target``.

    Its attention/FFN weights are block ``block``'s usual ``blk.N.*`` tensors; ``blk.N.nextn.*`` holds the
    rest. Output norm, output projection and embedding are the target's unless the file has its own.
    """
    device = target.device
    p = f"blk.{block}.nextn."
    cfg = target.config
    if cfg.recurrent is not None:  # qwen35: a gated full-attention block, the only layer of its own cache
        head_cfg = replace(cfg, recurrent=replace(cfg.recurrent, layers=(False,)))
        module = HybridBlock(head_cfg, 0, load_hybrid_block_weights(f, cfg, block, fmt, device, attention=True))
    else:
        module = Block(replace(cfg, local_layers=(), sliding_window=None), 0,
                       load_block_weights(f, cfg, block, fmt, device))
    weights = NextNWeights(
        block=module,
        eh_proj=load_linear(f, p + "eh_proj.weight", fmt, device=device),
        enorm=load_tensor(f, p + "enorm.weight"),
        hnorm=load_tensor(f, p + "hnorm.weight"),
        head_norm=load_tensor(f, p + "shared_head_norm.weight") if p + "shared_head_norm.weight" in f.tensors else None,
        head=(load_linear(f, p + "shared_head_head.weight", fmt, device=device)
              if p + "shared_head_head.weight" in f.tensors else None),
        embed=(Embedding(f, p + "embed_tokens.weight", target.dtype, device=device)
               if p + "embed_tokens.weight" in f.tensors else None),
    )
    _placed(nn.ModuleList([m for m in (module, weights.eh_proj, weights.head) if m is not None]), device)
    return NextNHead(target, weights)


# ------------------------------------------------------------------------------------------------
# Encoders (bert): llama.cpp's names for a BERT-family embedding model
# ------------------------------------------------------------------------------------------------
POSITION_EMBD = "position_embd.weight"
TOKEN_TYPES = "token_types.weight"
TOKEN_EMBD_NORM = "token_embd_norm"


def load_encoder(path_or_file: str | os.PathLike | GGUFFile, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> Encoder:
    """Load a bert GGUF into an ``Encoder`` (every weight dequantized to ``dtype``)."""
    device = torch.device(device)
    f, owned = _gguf_of(path_or_file)
    try:
        cfg = bert.read_config(f)

        def t(name: str) -> torch.Tensor:
            if name not in f.tensors:
                raise UnsupportedModelError(f"{f.path}: GGUF has no {name}")
            return load_tensor(f, name, dtype).to(device)

        def dense(name: str) -> DenseWeights:
            return DenseWeights(t(name + ".weight"), t(name + ".bias"))

        def norm(name: str) -> NormWeights:
            return NormWeights(t(name + ".weight"), t(name + ".bias"))

        layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            layers.append(EncoderLayerWeights(
                q=dense(p + "attn_q"), k=dense(p + "attn_k"), v=dense(p + "attn_v"), out=dense(p + "attn_output"),
                attn_norm=norm(p + "attn_output_norm"), up=dense(p + "ffn_up"), down=dense(p + "ffn_down"),
                ffn_norm=norm(p + "layer_output_norm")))
            f.release_pages()
        weights = EncoderWeights(token_embd=t(EMBEDDING), position_embd=t(POSITION_EMBD), token_types=t(TOKEN_TYPES),
                                 embd_norm=norm(TOKEN_EMBD_NORM), layers=layers)
        # Position rows bound the input length; an embedding row per token id, each n_embd wide.
        if tuple(weights.token_embd.shape) != (cfg.vocab_size, cfg.n_embd) or \
                weights.position_embd.shape[0] < cfg.context_length or weights.position_embd.shape[1] != cfg.n_embd:
            raise UnsupportedModelError(f"{f.path}: {EMBEDDING} {tuple(weights.token_embd.shape)} or {POSITION_EMBD} "
                                        f"{tuple(weights.position_embd.shape)} does not fit {cfg.vocab_size} tokens "
                                        f"x {cfg.n_embd} over {cfg.context_length} positions")
        model = Encoder(cfg, weights)
    except BaseException:
        if owned:
            f.close()
        raise
    f.release_pages()
    model.gguf, model.source_path = f, f.path
    return _placed(model.eval(), device)
