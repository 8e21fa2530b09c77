"""A generation's text split the way Ollama's ChatHandler splits it: the reasoning first (the model's
thinking tags), then tool calls out of what is left (the model's call format), the rest content; or, for
gpt-oss models with a harmony template, by harmony channel (server.text.harmony) for all three.

One ``ReplySplitter`` per request: ``feed`` each engine chunk, ``finish`` at the end. Tool calls get
Ollama's ids (``call_`` and 8 random letters/digits). Reasoning is never searched for tool calls.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Sequence

from server.text.harmony import HarmonyParser, HarmonyPiece
from server.text.render import Think, Tool, ToolCall
from server.text.thinking import ThinkingParser
from server.text.tool_calls import ParsedCall, ToolCallParser

from .prompting import ModelPrompting

__all__ = ["ReplyPiece", "ReplySplitter", "thinking_on", "tool_call_id"]


def tool_call_id() -> str:
    return "call_" + "".join(random.choices(string.ascii_lowercase + string.digits, k=8))


def thinking_on(think: Think) -> bool:
    """api.ThinkValue.Bool(): true, or any level."""
    return think is True or (isinstance(think, str) and think != "")


@dataclass
class ReplyPiece:
    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls)


class ReplySplitter:
    def __init__(self, thinking: ThinkingParser | None, tools: ToolCallParser | None,
                 harmony: HarmonyParser | None = None):
        self._thinking = thinking
        self._tools = tools
        self._harmony = harmony
        self._calls = 0

    @classmethod
    def for_request(cls, prompting: ModelPrompting, prompt: str, tools: Sequence[Tool], think: Think,
                    *, raw: bool = False) -> ReplySplitter:
        """The splitter a request needs: thinking when asked for and the template has tags (a prompt that
        ends in the opening tag starts inside the reasoning), tool calls when tools were given. A gpt-oss
        model with a harmony template gets the harmony parser for all three, whatever ``think`` says
        (Ollama's builtin parser; not for raw prompts)."""
        if prompting.harmony and not raw:
            return cls(None, None, HarmonyParser.for_prompt(prompt, [t.name for t in tools]))
        opening, closing = prompting.thinking_tags
        thinking = None
        if thinking_on(think) and opening and closing:
            thinking = ThinkingParser(opening, closing, opened=ThinkingParser.prompt_opens(prompt, opening))
        parser = None
        if tools and prompting.tool_format is not None:
            parser = ToolCallParser(prompting.tool_format, [t.name for t in tools])
        return cls(thinking, parser)

    @property
    def passthrough(self) -> bool:
        return self._thinking is None and self._tools is None and self._harmony is None

    def feed(self, text: str) -> ReplyPiece:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        if self._thinking is None:
            thinking, content = "", text
        else:
            thinking, content = self._thinking.feed(text)
        return self._with_calls(thinking, content, final=False)

    def finish(self) -> ReplyPiece:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish())
        thinking, content = self._thinking.finish() if self._thinking is not None else ("", "")
        return self._with_calls(thinking, content, final=True)

    def _from_harmony(self, piece: HarmonyPiece) -> ReplyPiece:
        calls = []
        for name, args in piece.calls:
            calls.append(ToolCall(name, args, index=self._calls, id=tool_call_id()))
            self._calls += 1
        return ReplyPiece(piece.content, piece.thinking, calls)

    def _with_calls(self, thinking: str, content: str, final: bool) -> ReplyPiece:
        if self._tools is None:
            return ReplyPiece(content, thinking)
        calls: list[ParsedCall]
        content, calls = self._tools.feed(content) if content else ("", [])
        if final:
            rest, more = self._tools.finish()
            content += rest
            calls += more
        return ReplyPiece(content, thinking,
                          [ToolCall(c.name, c.arguments, index=c.index, id=tool_call_id()) for c in calls])
