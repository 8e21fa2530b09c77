"""bert (BERT-family sentence encoders: all-MiniLM, bge, e5, ...), as llama.cpp's converter writes them.

An encoder, not a decoder: every token attends every other token of its input (no causal mask, no KV
cache), positions are learned embeddings (``position_embd``) plus a token-type embedding (``token_types``),
the norms are post-norm LayerNorms with biases (``token_embd_norm`` after the embeddings,
``attn_output_norm`` and ``layer_output_norm`` after each residual add), the FFN is ``ffn_up`` -> GELU ->
``ffn_down``. The output is one vector per input, pooled over the last hidden states as
``bert.pooling_type`` says (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last, 4 rank).

The pooling and normalisation a GGUF declares are read by ``engine.contract.capabilities`` (the server decides
the ``embedding`` capability from them without torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.contract.capabilities import embedding_normalizes, embedding_pooling
from engine.contract.gguf import GGUFFile
from engine.models.config import UnsupportedModelError

ARCH = "bert"

# What the encoder computes; "none" (per-token vectors) and "rank" (a reranker's score) are not embeddings.
RUNNABLE_POOLING = frozenset({"mean", "cls", "last"})


@dataclass(frozen=True)
class EncoderConfig:
    """What the encoder needs to know about one model, read from GGUF metadata."""

    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    vocab_size: int
    context_length: int  # learned positions: no input may be longer
    norm_eps: float
    n_token_types: int
    pooling: str  # "mean" | "cls" | "last"
    normalize: bool  # the model's own pipeline L2-normalises (sentence-transformers' Normalize module)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def read_config(f: GGUFFile) -> EncoderConfig:
    path = f.path

    def need(key: str) -> Any:
        value = f.arch_key(key)
        if value is None:
            raise UnsupportedModelError(f"{path}: GGUF metadata lacks {f.architecture}.{key}")
        return value

    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    if n_embd % n_head:
        raise UnsupportedModelError(f"{path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
    pooling = embedding_pooling(f.metadata)
    if pooling not in RUNNABLE_POOLING:
        raise UnsupportedModelError(f"{path}: pooling type {pooling or 'missing'} is not supported "
                                    f"(supported: {', '.join(sorted(RUNNABLE_POOLING))})")
    if f.arch_key("attention.causal", False):
        raise UnsupportedModelError(f"{path}: a causal bert is not supported")
    return EncoderConfig(
        arch=f.architecture,
        n_layer=int(need("block_count")),
        n_embd=n_embd,
        n_ff=int(need("feed_forward_length")),
        n_head=n_head,
        vocab_size=len(f.metadata.get("tokenizer.ggml.tokens") or ()),
        context_length=int(need("context_length")),
        norm_eps=float(f.arch_key("attention.layer_norm_epsilon", 1e-12)),
        n_token_types=int(f.metadata.get("tokenizer.ggml.token_type_count", 2)),
        pooling=pooling,
        normalize=embedding_normalizes(f.metadata),
    )
