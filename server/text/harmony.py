"""gpt-oss output in OpenAI's harmony format, split into reasoning, answer and tool calls as Ollama's
harmony parser splits it.

A harmony reply is a run of messages, ``<|start|>HEADER<|message|>BODY<|end|>``; the model's last one
ends in ``<|return|>`` (an answer) or ``<|call|>`` (a tool call), which are stop tokens, so they
rarely reach the text. The header holds the role, ``<|channel|>NAME`` and an optional recipient
``to=functions.NAME`` (before or after the channel), and ``<|constrain|>json`` for the body's type.
By channel:

- ``analysis``: the reasoning (``thinking``); with a recipient, a tool call;
- ``commentary``: a tool call when it has a recipient, else answer text;
- ``final``, no channel, or a channel not named here: answer text (``content``).

A tool call's body is its JSON arguments; the name is the recipient without ``functions.`` and mapped
back to the request's tool name when the prompt renamed it (``harmony_function_names``). Unlike
Ollama, which parses one call when the whole reply is done, each call message becomes a call at its
end (or at ``finish``), so several calls in one reply all count; a body that is not a JSON object
(Ollama answers an error) comes out as content. Text outside any message is dropped, as Ollama does.

The prompt already wrote the reply's first ``<|start|>assistant`` (and for a prefilled assistant
message the header up to ``<|message|>``): ``HarmonyParser.for_prompt`` starts from there. Partial
markers are held back, so feeding one character at a time or everything at once gives the same
split. Torch-free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HarmonyHeader", "HarmonyParser", "HarmonyPiece", "harmony_function_names", "is_gpt_oss",
           "uses_harmony"]

START = "<|start|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
GPT_OSS_FAMILIES = frozenset({"gptoss", "gpt-oss"})


def is_gpt_oss(*families: str) -> bool:
    """Ollama's model-family check for gpt-oss (its GGUF architecture is ``gptoss`` or ``gpt-oss``)."""
    return any(f in GPT_OSS_FAMILIES for f in families)


def uses_harmony(template: str, *families: str) -> bool:
    """Ollama's shouldUseHarmony: a gpt-oss model whose template writes harmony's ``<|start|>`` and
    ``<|end|>``."""
    return is_gpt_oss(*families) and START in template and "<|end|>" in template


def _valid_identifier(name: str) -> str:
    out = "".join("_" if c in " -." else c for c in name if c in " -._$" or c.isalpha() or c.isdigit())
    if not out:
        return "unnamed"
    return "_" + out if out[0].isdigit() else out


_BUILTINS = frozenset({"browser.open", "browser.search", "browser.find", "python"})


def harmony_function_names(names: Iterable[str]) -> dict[str, str]:
    """user name -> the name the prompt shows a harmony model, as Ollama renames tools for it:
    TypeScript-like identifiers (space, ``-`` and ``.`` become ``_``, other characters go, a leading
    digit gets ``_``), ``_2``, ``_3``... on clashes; the built-in browser/python tools keep theirs."""
    mapping: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = _valid_identifier(name)
        candidate, n = base, 2
        while candidate in taken:
            candidate, n = f"{base}_{n}", n + 1
        if name in _BUILTINS:
            candidate = name
        mapping[name] = candidate
        taken.add(candidate)
    return mapping


@dataclass(frozen=True)
class HarmonyHeader:
    role: str = ""
    channel: str = ""
    recipient: str = ""
    constrain: str = ""


def parse_header(raw: str) -> HarmonyHeader:
    """A header's role, channel, recipient (``to=X`` as the role, or right after it) and content type."""
    constrain = ""
    m = re.search(re.escape(CONSTRAIN) + r"\s*(\S*)", raw)
    if m:
        constrain = m.group(1)
        raw = raw[:m.start()] + " " + raw[m.end():]
    channel = ""
    i = raw.find(CHANNEL)
    if i >= 0:
        rest = raw[i + len(CHANNEL):]
        m = re.match(r"\S*", rest)
        assert m is not None
        channel = m.group(0)
        raw = raw[:i] + " " + rest[m.end():]
    tokens = raw.split()
    if not tokens:
        return HarmonyHeader(channel=channel, constrain=constrain)
    role, recipient = tokens[0], ""
    if role.startswith("to="):
        role, recipient = "tool", role[3:]
    elif len(tokens) > 1 and tokens[1].startswith("to="):
        recipient = tokens[1][3:]
    return HarmonyHeader(role, channel, recipient, constrain)


@dataclass
class HarmonyPiece:
    content: str = ""
    thinking: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


_OUTSIDE, _HEADER, _BODY = range(3)


def _overlap(text: str, tags: Iterable[str]) -> int:
    """The longest end of ``text`` that begins one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(text), len(tag) - 1), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


class HarmonyParser:
    """``feed(chunk) -> HarmonyPiece``; ``finish()`` ends the reply (an open tool call is parsed then)."""

    def __init__(self, tool_names: Iterable[str] = (), *, seed: str = START + "assistant"):
        names = list(tool_names)
        renamed = harmony_function_names(names)
        self._user_names = {v: k for k, v in renamed.items()}
        self._user_names.update({n: n for n in names})
        self._state = _OUTSIDE
        self._buf = ""
        self._header = HarmonyHeader()
        self._call = ""  # the open call's JSON so far
        self.feed(seed)

    @classmethod
    def for_prompt(cls, prompt: str, tool_names: Iterable[str] = ()) -> HarmonyParser:
        """Start where the prompt leaves off: after its last ``<|start|>`` when that message is still open
        (up to its ``<|message|>``: a prefilled body is the prompt's, not the reply's), else at a new
        assistant message."""
        i = prompt.rfind(START)
        tail = prompt[i:] if i >= 0 else ""
        if not tail or any(end in tail for end in ENDS):
            return cls(tool_names)
        j = tail.find(MESSAGE)
        return cls(tool_names, seed=tail if j < 0 else tail[:j + len(MESSAGE)])

    def feed(self, text: str) -> HarmonyPiece:
        self._buf += text
        piece = HarmonyPiece()
        while self._step(piece):
            pass
        return piece

    def finish(self) -> HarmonyPiece:
        piece = HarmonyPiece()
        if self._state == _BODY:
            self._emit(self._buf, piece)
            self._end_message(piece)
        self._buf = ""
        self._state = _OUTSIDE
        return piece

    # -- the state machine ----------------------------------------------------------------------
    def _step(self, piece: HarmonyPiece) -> bool:
        buf = self._buf
        if self._state == _OUTSIDE:
            i = buf.find(START)
            if i < 0:
                keep = _overlap(buf, (START,))
                self._buf = buf[len(buf) - keep:] if keep else ""
                return False
            self._buf = buf[i + len(START):]
            self._state = _HEADER
            return True
        if self._state == _HEADER:
            i = buf.find(MESSAGE)
            if i < 0:
                return False
            self._header = parse_header(buf[:i])
            self._buf = buf[i + len(MESSAGE):]
            self._state = _BODY
            return True
        ends = [(buf.find(e), e) for e in ENDS if e in buf]
        if ends:
            i, end = min(ends)
            self._emit(buf[:i], piece)
            self._end_message(piece)
            self._buf = buf[i + len(end):]
            self._state = _OUTSIDE
            return True
        keep = _overlap(buf, ENDS)
        self._emit(buf[:len(buf) - keep], piece)
        self._buf = buf[len(buf) - keep:]
        return False

    def _kind(self) -> str:
        h = self._header
        if h.recipient and h.channel in ("analysis", "commentary"):
            return "call"
        if h.channel == "analysis":
            return "thinking"
        return "content"

    def _emit(self, text: str, piece: HarmonyPiece) -> None:
        if not text:
            return
        kind = self._kind()
        if kind == "call":
            self._call += text
        elif kind == "thinking":
            piece.thinking += text
        else:
            piece.content += text

    def _end_message(self, piece: HarmonyPiece) -> None:
        if self._kind() == "call":
            raw, self._call = self._call, ""
            try:
                args = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                args = None
            if isinstance(args, dict):
                name = self._header.recipient.removeprefix("functions.")
                piece.calls.append((self._user_names.get(name, name), args))
            else:
                piece.content += raw
        self._header = HarmonyHeader()
