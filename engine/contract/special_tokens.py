"""Special tokens found from a model's vocabulary: fill-in-the-middle markers and reasoning tags.

FIM: llama.cpp (``llama_vocab::impl::load``) takes the ``tokenizer.ggml.fim_{pre,suf,mid}_token_id``
keys when the file has them and otherwise recognises the markers by their text; the names below are
its lists (Qwen/CodeGemma ``<|fim_prefix|>``, StarCoder/Granite ``<fim_prefix>``, DeepSeek
``<｜fim▁begin｜>``, CodeLlama ``<PRE>``/``▁<PRE>``, GLM-4.5 ``<|code_prefix|>``). The prompt is laid out
as llama.cpp's server lays out an infill without extra context: prefix marker, prefix, suffix marker,
suffix, middle marker. The markers must be matched whole when the prompt text is tokenized, so only
control or user-defined tokens count (a marker stored as an ordinary token would be split into pieces).

Reasoning tags: the ``<think>``/``</think>`` pair (Qwen3, DeepSeek-R1 and their distillations), found as
single tokens of any type; ``relaxed_scope: thinking`` follows them token by token.

Torch-free: the server reads these from GGUF metadata, the engine from its tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["FimTokens", "find_fim_tokens", "ThinkTags", "find_think_tags"]

# llama.cpp token types whose text is matched whole in a prompt (control, user-defined).
_WHOLE_TYPES = (3, 4)

_FIM_NAMES: Mapping[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
               "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
               "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
               "<|code_middle|>"),
}
_FIM_KEYS = {"prefix": "tokenizer.ggml.fim_pre_token_id", "suffix": "tokenizer.ggml.fim_suf_token_id",
             "middle": "tokenizer.ggml.fim_mid_token_id"}


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle markers, as the token texts the tokenizer matches whole."""

    prefix: str
    suffix: str
    middle: str

    def render(self, prefix: str, suffix: str) -> str:
        """The infill prompt (prefix-suffix-middle order); the model writes the middle after it."""
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


def find_fim_tokens(tokens: Sequence[str], token_types: Sequence[int] | None,
                    metadata: Mapping[str, Any] | None = None) -> FimTokens | None:
    """The FIM markers of a vocabulary, or None when it lacks any of the three.

    ``tokens``/``token_types``: ``tokenizer.ggml.tokens``/``token_type``; ``metadata`` (the GGUF's) is read
    for the explicit ``tokenizer.ggml.fim_*_token_id`` keys, which win over names as in llama.cpp.
    """
    n = len(tokens)
    index: dict[str, int] | None = None
    found: dict[str, str] = {}
    for role in ("prefix", "suffix", "middle"):
        tid = _valid_id((metadata or {}).get(_FIM_KEYS[role]), n)
        if tid is None:
            if index is None:
                wanted = {name for names in _FIM_NAMES.values() for name in names}
                index = {}
                for i, t in enumerate(tokens):
                    if t in wanted and t not in index:
                        index[t] = i
            tid = next((index[name] for name in _FIM_NAMES[role] if name in index), None)
        if tid is None:
            return None
        if token_types is not None and len(token_types) == n and int(token_types[tid]) not in _WHOLE_TYPES:
            return None  # an ordinary token: the rendered marker would be tokenized as plain text
        found[role] = str(tokens[tid])
    return FimTokens(**found)


def _valid_id(value: Any, n: int) -> int | None:
    if value is None:
        return None
    try:
        i = int(value)
    except (TypeError, ValueError):
        return None
    return i if 0 <= i < n else None  # converters write -1 / 0xFFFFFFFF for "none"


# --- reasoning tags -----------------------------------------------------------------------------

_THINK_PAIRS: tuple[tuple[str, str], ...] = (("<think>", "</think>"),)


@dataclass(frozen=True)
class ThinkTags:
    """The token ids that open and close a model's reasoning block."""

    open_id: int
    close_id: int

    def inside_after(self, tokens: Iterable[int], inside: bool) -> bool:
        """Whether the reasoning block is open after ``tokens``, given the state before them."""
        for t in tokens:
            if t == self.open_id:
                inside = True
            elif t == self.close_id:
                inside = False
        return inside

    def reasoning_positions(self, drafts: Sequence[int], inside: bool) -> list[bool]:
        """Per drafted position of a round: whether it is decided inside the block. A position is
        inside when every token before it (the committed log, then the earlier drafts) leaves the
        block open, so the close tag itself is the block's last position and what follows it in the
        same round is outside."""
        out = []
        for t in drafts:
            out.append(inside)
            inside = self.inside_after((t,), inside)
        return out


def find_think_tags(token_id: Callable[[str], int | None]) -> ThinkTags | None:
    """The first known tag pair whose both tags are single tokens of the vocabulary
    (``token_id``: text -> id, e.g. ``Tokenizer.token_id``)."""
    for open_text, close_text in _THINK_PAIRS:
        o, c = token_id(open_text), token_id(close_text)
        if o is not None and c is not None:
            return ThinkTags(o, c)
    return None
