"""The hyper-parameters every decoder GGUF states, declared once for both sides of the file.

The importer reads them from a Hugging Face config.json and writes them as ``{arch}.*`` keys
(``importer.hf.params.ModelParams``); the engine reads them back from those keys (``engine.models.config.
ModelConfig``). Both extend :class:`Hyperparameters`, each with what only its side needs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hyperparameters:
    arch: str  # general.architecture
    n_layer: int  # {arch}.block_count, less any MTP (NextN) blocks stored after the model's own
    n_embd: int  # {arch}.embedding_length
    n_ff: int  # {arch}.feed_forward_length (0: every FFN is a sparse MoE)
    n_head: int  # {arch}.attention.head_count
    n_head_kv: int  # {arch}.attention.head_count_kv
    head_dim: int  # {arch}.attention.key_length (n_embd / n_head when absent)
    vocab_size: int  # {arch}.vocab_size, or the token embedding's rows
    context_length: int  # {arch}.context_length
    rms_eps: float  # {arch}.attention.layer_norm_rms_epsilon
    rope_base: float  # {arch}.rope.freq_base
