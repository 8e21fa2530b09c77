"""``ArchitectureSpec``: everything the importer knows about one GGUF architecture, as values and hooks.

An architecture module builds its spec(s) from these fields and lists them in ``SPECS``; the registry
(``importer/architectures/__init__.py``) collects them; the generic drivers (``importer/hf_config.py``,
``importer/hf_to_gguf.py``, ``importer/adapter.py``, ``importer/create.py``) only read fields. The defaults are the
plain llama-style decoder's: a module states only where its architecture differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import gguf
import numpy as np

from ..hf.params import ModelParams
from ..hf.plan import ConversionPlan
from ..hf.safetensors import HFSource

SILU = frozenset({"silu", "swish"})
GELU_TANH = frozenset({"gelu_pytorch_tanh", "gelu_tanh"})


def plain_text_config(config: Mapping[str, Any], hf_class: str) -> dict[str, Any]:
    """config.json itself: the text model's config is the whole of it."""
    return dict(config)


def _nothing(cfg: Mapping[str, Any], role: str) -> None:
    return None


def _as_read(params: ModelParams, config: Mapping[str, Any], cfg: Mapping[str, Any], role: str) -> ModelParams:
    return params


def _none_generated(p: ModelParams) -> dict[str, np.ndarray]:
    return {}


def _no_extra(w: gguf.GGUFWriter, p: ModelParams) -> None:
    return None


@dataclass(frozen=True)
class ArchitectureSpec:
    arch: str  # the GGUF general.architecture written (one of engine.contract.capabilities' names)
    hf_classes: tuple[str, ...]  # the Hugging Face model classes (config.json "architectures") it imports
    model_types: Mapping[str, str] = field(default_factory=dict)  # model_type -> class, for a config naming none

    # --- config.json -> ModelParams (importer/hf_config.py runs these in this order) ---
    # the text model's config (merged with the defaults transformers would fill in): (config, hf class) -> cfg
    text_config: Callable[[Mapping[str, Any], str], dict[str, Any]] = plain_text_config
    activations: frozenset[str] = SILU  # hidden_act / hidden_activation values it runs
    default_activation: str = "silu"  # what transformers assumes when config.json names none
    refuse: Callable[[Mapping[str, Any], str], None] = _nothing  # (cfg, role): what the engine cannot run
    rope_layer_type: str | None = None  # the layer type whose RoPE is the model's (models with several)
    rope_kinds: tuple[str, ...] | None = ("linear",)  # RoPE scalings it runs; None: the module reads RoPE itself
    tied_default: bool = True  # tie_word_embeddings when config.json does not say
    n_ff_default: int | None = None  # intermediate_size when absent (None: required)
    # (params, config, text cfg, role) -> the params with what only this architecture reads (ModelParams.layout)
    finish: Callable[[ModelParams, Mapping[str, Any], Mapping[str, Any], str], ModelParams] = _as_read

    # --- tensors ---
    # The generic planner (importer/hf_to_gguf.py): names through gguf's TensorNameMap for ``name_map``,
    # shapes as hf.plan.expected_shape, each block needing ``block_tensors``.
    name_map: gguf.MODEL_ARCH | None = None
    block_tensors: tuple[str, ...] = ()
    permute_qk: bool = False  # q/k rows regrouped per head so RoPE pairs are adjacent (llama's rotation)
    norms_add_one: bool = False  # norm weights stored as 1 + w
    generated: Callable[[ModelParams], dict[str, np.ndarray]] = _none_generated  # tensors computed from config
    # An architecture with tensors of its own: (source, params, text names) -> the plan, instead of the above.
    plan: Callable[[HFSource, ModelParams, dict[str, str]], ConversionPlan] | None = None
    skip_prefixes: tuple[str, ...] = ()  # checkpoint tensors that are not part of the model tandem runs

    # --- metadata ---
    writes_head_dim: bool = False  # key_length / value_length even when head_dim is n_embd / n_head
    # (writer, params, MTP blocks) -> the {arch}.* keys, instead of the common ones (after general.file_type)
    write_params: Callable[[gguf.GGUFWriter, ModelParams, int], None] | None = None
    write_extra: Callable[[gguf.GGUFWriter, ModelParams], None] = _no_extra  # after the common keys
    # the GGUF tokenizer model its byte-fallback BPE is written as (None: chosen from the tokenizer files)
    tokenizer_model: str | None = None

    # --- a whole conversion of its own (an encoder with its own files, vocabulary and metadata) ---
    # (files, out, role, progress, tokenizer_donor) -> None
    convert_folder: Callable[..., None] | None = None
    # A drafter converted whole: (its config.json, the target's params) -> why they cannot pair, or None; checked
    # from the two config.json files before anything is converted (importer/pair_precheck.py).
    pair_problem: Callable[[Mapping[str, Any], ModelParams], str | None] | None = None

    def accepts(self, config: Mapping[str, Any]) -> bool:
        """Whether config.json names one of this spec's classes (or, naming none, one of its model types)."""
        names = config.get("architectures") or []
        if isinstance(names, str):
            names = [names]
        return any(n in self.hf_classes for n in names) or (not names and config.get("model_type") in self.model_types)
