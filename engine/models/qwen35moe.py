"""qwen35moe (Qwen3.5 / Qwen3.6 MoE): qwen35's hybrid layers with every FFN a sparse MoE beside a shared expert.

The routed experts are qwen3moe's (softmax over the router's logits, top-k renormalised to sum 1); the shared
expert (``ffn_{gate,up,down}_shexp``, width ``expert_shared_feed_forward_length``) runs on every token and its
output is scaled by sigmoid(``ffn_gate_inp_shexp`` x) before the sum (``engine.models.moe.SharedExpertMoE``).
"""

from __future__ import annotations

from dataclasses import replace

from engine.contract.gguf import GGUFFile
from engine.models import qwen35
from engine.models.config import ModelConfig, UnsupportedModelError, WeightLayout, moe_config


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    shared = f.arch_key("expert_shared_feed_forward_length")
    if not shared:
        raise UnsupportedModelError(f"{f.path}: {f.architecture} metadata lacks expert_shared_feed_forward_length")
    return replace(qwen35.read_config(f, layout, dense_ffn=False),
                   moe=replace(moe_config(f, normalize_weights=True), n_ff_shared=int(shared)))
