"""Copying a tokenizer from another GGUF: a drafter uploaded without tokenizer files (an MTP head, an EAGLE-3 head)
speaks its target's vocabulary, so the target's GGUF donates it."""

from __future__ import annotations

from typing import Any, Mapping

import gguf

# GGUF key -> writer method, for copying a tokenizer from another GGUF (an MTP head uploaded without
# tokenizer files speaks its target's vocabulary).
_COPY_KEYS: Mapping[str, str] = {
    "tokenizer.ggml.model": "add_tokenizer_model", "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list", "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.scores": "add_token_scores", "tokenizer.ggml.merges": "add_token_merges",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id", "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.unknown_token_id": "add_unk_token_id", "tokenizer.ggml.padding_token_id": "add_pad_token_id",
    "tokenizer.ggml.eot_token_id": "add_eot_token_id", "tokenizer.ggml.add_bos_token": "add_add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_add_eos_token", "tokenizer.ggml.add_space_prefix": "add_add_space_prefix",
    "tokenizer.chat_template": "add_chat_template",
}


def copy_vocab(writer: gguf.GGUFWriter, metadata: Mapping[str, Any]) -> None:
    """Copy another GGUF's tokenizer metadata."""
    for key, method in _COPY_KEYS.items():
        value = metadata.get(key)
        if value is None:
            continue
        if hasattr(value, "tolist"):
            value = value.tolist()
        getattr(writer, method)(value)
