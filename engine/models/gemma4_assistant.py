"""gemma4-assistant: Gemma 4's multi-token-prediction drafter, a few layers that run on a gemma4 target's state.

It is not a model of its own (``engine.models.DRAFTERS``, not ``ARCHITECTURES``): one draft step takes the
target's embedding of the last token (scaled as the target scales it) and a target-width hidden state
``h``, projects their concatenation down (``nextn.pre_projection``), runs its layers, whose queries attend
the *target's* cached K/V (for each layer kind, the target's last layer of that kind that stores K/V;
the assistant computes no K/V), and predicts a token through its final norm and its tied embedding;
``nextn.post_projection`` maps the normed state back to the target's width as the next step's ``h``
(llama.cpp's ``gemma4-assistant.cpp``, transformers' ``Gemma4AssistantForCausalLM``).

Its layers are gemma4 layers (``engine.models.gemma4.attention_config``) with only q projections, so the
config read here is completed at load by ``bind_to_target``: which target cache layer each layer reads
and how many K/V heads that layer has. Its name and targets are the contract's (``engine.contract.capabilities``).
"""

from __future__ import annotations

from dataclasses import replace

from engine.contract.capabilities import DRAFTER_TARGETS, GEMMA4_ASSISTANT
from engine.contract.gguf import GGUFFile
from engine.models.config import (
    ModelConfig,
    UnsupportedModelError,
    WeightLayout,
    base_config,
)
from engine.models.gemma4 import attention_config

ARCH = GEMMA4_ASSISTANT
TARGET_ARCHITECTURES = DRAFTER_TARGETS[ARCH]


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    """The assistant's own layers (not yet bound to a target)."""
    cfg = attention_config(f, base_config(f, layout, per_layer_arrays=True))
    return replace(cfg, final_softcap=None, kv_external=True, per_layer_input=0)


def bind_to_target(cfg: ModelConfig, target: ModelConfig, width: int | None) -> ModelConfig:
    """``cfg`` with each layer reading the target's last K/V-storing layer of its kind; a refusal
    (``UnsupportedModelError``) says what does not fit."""
    if target.arch not in TARGET_ARCHITECTURES:
        raise UnsupportedModelError(f"a Gemma 4 assistant drafts for a gemma4 model, not {target.arch}")
    if width is not None and width != target.n_embd:
        raise UnsupportedModelError(f"the assistant was built for a target of width {width} "
                                    f"(embedding_length_out); this target's is {target.n_embd}")
    last: dict[bool, int] = {}
    for j in range(target.n_layer):
        if target.owns_kv(j):
            last[target.is_local(j)] = j
    sources, kv_heads = [], []
    for i in range(cfg.n_layer):
        local = cfg.is_local(i)
        j = last.get(local)
        if j is None:
            raise UnsupportedModelError(f"assistant layer {i} is {'sliding' if local else 'global'}, and the target "
                                        "has no such layer to read K/V from")
        if cfg.head_dim_of(i) != target.head_dim_of(j):
            raise UnsupportedModelError(f"assistant layer {i} has head size {cfg.head_dim_of(i)}, the target layer "
                                        f"{j} it reads has {target.head_dim_of(j)}")
        sources.append(j)
        kv_heads.append(target.n_head_kv_of(j))
    return replace(cfg, kv_source=tuple(sources), layer_n_head_kv=tuple(kv_heads))
