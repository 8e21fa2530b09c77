"""llama.cpp's pre-tokenizers by ``tokenizer.ggml.pre`` name: how a byte-level BPE vocabulary splits text before
its merges. A GGUF names one and carries no regexes, so both readers of the name share this table: the engine's
tokenizer (``engine/text/tokenizer.py``) builds its splitter from it, and the importer finds the name a Hugging Face
``tokenizer.json`` corresponds to (``importer/hf_tokenizer.py``). It mirrors llama.cpp's table (``llama-vocab.cpp``),
using the original ``tokenizer.json`` regexes where llama.cpp only rewrote them for its own regex engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# Each pre-tokenizer is a sequence of regexes applied like llama.cpp's unicode_regex_split: every
# regex splits the pieces the previous one produced, keeping matches and the text between them
# as separate pieces (``Split(..., "isolated")``).

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How a byte-level vocabulary splits text before BPE (one llama.cpp pre-tokenizer type)."""

    regexes: tuple[str, ...]
    nfc: bool = False  # Qwen2's tokenizer.json normalizes to NFC first
    ignore_merges: bool = False  # llama.cpp: a word that is itself a token is not merged (llama3, tekken)


_SPEC_LLAMA3 = PreTokenizerSpec((_LLAMA3,), ignore_merges=True)
_SPEC_LLAMA3_MERGED = PreTokenizerSpec((_LLAMA3,))
_SPEC_QWEN2 = PreTokenizerSpec((_QWEN2,), nfc=True)
_SPEC_STARCODER = PreTokenizerSpec((r"\p{N}", GPT2))
_SPECGPT2 = PreTokenizerSpec((GPT2,))
_SPEC_GPT4O = PreTokenizerSpec((_GPT4O,))
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT, used for "default" and for files without a pre name.
SPEC_DEFAULT = PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))

# tokenizer.ggml.pre -> pre-tokenizer, grouped as llama.cpp's llama_vocab::impl::load groups them.
PRE_TOKENIZERS: Mapping[str, PreTokenizerSpec] = {
    "default": SPEC_DEFAULT,
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _SPEC_LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe", "glm4"), _SPEC_LLAMA3_MERGED),
    "deepseek-coder": PreTokenizerSpec(_DEEPSEEK_CODER),
    "deepseek-v3": PreTokenizerSpec(_DEEPSEEK_V3),
    "falcon": PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"), _SPEC_STARCODER),
    **dict.fromkeys(
        ("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mpt", "olmo", "jais",
         "exaone4", "gigachat", "mellum"),
        _SPECGPT2,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "kormo", "f2llmv2"), _SPEC_QWEN2),
    "stablelm2": PreTokenizerSpec((_QWEN2,)),
    "qwen35": PreTokenizerSpec((_QWEN35,), nfc=True),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizerSpec((_BLOOM,))),
    "viking": PreTokenizerSpec((_BLOOM, r"\p{N}")),
    "tekken": PreTokenizerSpec((_TEKKEN,), ignore_merges=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "minimax-m2"), _SPEC_GPT4O),
}

SUPPORTED_PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(PRE_TOKENIZERS))
