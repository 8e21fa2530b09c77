"""The reply split as Ollama's ChatHandler splits it: reasoning first, tool calls out of the rest only (a call
written while thinking is part of the reasoning), ids in Ollama's shape."""

from __future__ import annotations

import re

import pytest

from server.text.thinking import ThinkingParser
from server.text.tool_calls import QWEN, ToolCallParser
from server.reply import ReplyPiece, ReplySplitter, thinking_on

OUTPUT = ('Maybe <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>? No, Paris.</think>\n\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.mark.parametrize("step", [1, 3, len(OUTPUT)])
def test_calls_in_the_reasoning_are_not_calls(step: int) -> None:
    splitter = ReplySplitter(ThinkingParser("<think>", "</think>", opened=True), ToolCallParser(QWEN, ["get_weather"]))
    whole = ReplyPiece()
    for piece in [splitter.feed(OUTPUT[i:i + step]) for i in range(0, len(OUTPUT), step)] + [splitter.finish()]:
        whole.content += piece.content
        whole.thinking += piece.thinking
        whole.tool_calls += piece.tool_calls
    assert whole.thinking == 'Maybe <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>? No, Paris.'
    assert whole.content == ""
    [call] = whole.tool_calls
    assert (call.name, dict(call.arguments), call.index) == ("get_weather", {"city": "Paris"}, 0)
    assert re.fullmatch(r"call_[a-z0-9]{8}", call.id)


def test_thinking_on() -> None:
    assert thinking_on(True) and thinking_on("low") and not thinking_on(False) and not thinking_on(None)
