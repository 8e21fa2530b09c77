"""Qwen3 (``Qwen3ForCausalLM``) and Qwen3-MoE (``Qwen3MoeForCausalLM``): the plain decoder with q/k norms and
an explicit head size; the MoE's per-expert ``mlp.experts.E.{gate,up,down}_proj`` are stacked, in expert order,
into one 3-D ``ffn_{gate,up,down}_exps`` [n_expert, rows, cols] (by the generic planner), the router
``ffn_gate_inp`` kept F32 (llama.cpp's converter never stores it below F32), and ``expert_*`` metadata."""

from __future__ import annotations

from typing import Any, Mapping

import gguf

from ..hf.errors import fail
from ..hf.params import moe_params
from .llama import BLOCK_TENSORS
from .qwen2 import refuse_sliding_window
from .spec import ArchitectureSpec

_QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
_ATTN = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
         "ffn_norm.weight")


def _refuse(arch: str):
    sliding_window = refuse_sliding_window(arch)

    def refuse(cfg: Mapping[str, Any], role: str) -> None:
        sliding_window(cfg, role)
        if cfg.get("attention_bias"):
            raise fail(role, f"{arch} with attention_bias is not supported")
        if arch == "qwen3moe" and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
            raise fail(role, "qwen3moe with dense layers (mlp_only_layers, decoder_sparse_step > 1) is not "
                             "supported: every layer must be a MoE layer, as llama.cpp's qwen3moe has it")
    return refuse


QWEN3 = ArchitectureSpec(
    arch="qwen3", hf_classes=("Qwen3ForCausalLM",), model_types={"qwen3": "Qwen3ForCausalLM"},
    refuse=_refuse("qwen3"),
    name_map=gguf.MODEL_ARCH.QWEN3, block_tensors=BLOCK_TENSORS + _QK_NORM, writes_head_dim=True,
)
QWEN3MOE = ArchitectureSpec(
    arch="qwen3moe", hf_classes=("Qwen3MoeForCausalLM",), model_types={"qwen3_moe": "Qwen3MoeForCausalLM"},
    refuse=_refuse("qwen3moe"), finish=lambda params, config, cfg, role: moe_params(params, cfg, role),
    name_map=gguf.MODEL_ARCH.QWEN3MOE,
    block_tensors=_ATTN + _QK_NORM + ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                                      "ffn_down_exps.weight"),
    writes_head_dim=True,
)
SPECS = (QWEN3, QWEN3MOE)
