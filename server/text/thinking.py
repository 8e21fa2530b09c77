"""A model's reasoning, told apart from its answer, as Ollama's thinking package does.

- ``infer_thinking_tags``: the tags a Go template wraps an assistant's ``.Thinking`` in (Ollama's
  InferTags: inside a ``range`` over ``.Messages``, the first and last text of the list around the
  ``.Thinking`` reference), e.g. ``<think>`` / ``</think>``; a template with them supports thinking.
- ``jinja_thinking_tags``: the same for a GGUF's Jinja chat template (Ollama's chat-template check).
- ``ThinkingParser``: splits a stream of output chunks into thinking and content; whitespace right
  after each tag is dropped, a partial closing tag is held back until it is decided. A prompt that
  ends inside an open tag (Qwen3's templates can open ``<think>``) starts the parser in the thinking.

Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelfile.gotemplate import Action, Field, GoTemplate, If, Node, Paren, Pipe, Range, Text, With

__all__ = ["ThinkingParser", "infer_thinking_tags", "jinja_thinking_tags"]


def _pipe_fields(pipe: Pipe) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for cmd in pipe.cmds:
        for arg in cmd.args:
            if isinstance(arg, Field):
                out.append(arg.chain)
            elif isinstance(arg, Paren):
                out.extend(_pipe_fields(arg.pipe))
    return out


def infer_thinking_tags(template: GoTemplate) -> tuple[str, str]:
    """(opening, closing) tags, "" each when the template shows none. Every ``.Thinking`` reference
    under a range over ``.Messages`` is looked at in walk order; the list around it sets the opening
    tag if it starts with text and the closing one if it ends with text (later references win)."""
    tags = ["", ""]

    def visit_pipe(pipe: Pipe, enclosing: Sequence[Node], in_messages: bool) -> None:
        for chain in _pipe_fields(pipe):
            if chain and chain[0] == "Thinking" and in_messages and enclosing:
                if isinstance(enclosing[0], Text):
                    tags[0] = enclosing[0].text.strip()
                if isinstance(enclosing[-1], Text):
                    tags[1] = enclosing[-1].text.strip()

    def walk(nodes: Sequence[Node], in_messages: bool) -> None:
        for node in nodes:
            if isinstance(node, Action):
                visit_pipe(node.pipe, nodes, in_messages)
            elif isinstance(node, (If, With, Range)):
                visit_pipe(node.pipe, nodes, in_messages)
                inner = in_messages
                if isinstance(node, Range):  # the nearest range decides
                    inner = any(c and c[0] == "Messages" for c in _pipe_fields(node.pipe))
                walk(node.body, inner)
                if node.else_body:
                    walk(node.else_body, inner)

    walk(template.root, False)
    return tags[0], tags[1]


def jinja_thinking_tags(source: str) -> tuple[str, str]:
    """A Jinja chat template that writes ``<think>`` and ``</think>`` (or strips earlier reasoning at
    ``</think>``) thinks in those tags; ("", "") otherwise."""
    if "<think>" in source and "</think>" in source:
        return "<think>", "</think>"
    splits = "content.split('</think>')" in source or 'content.split("</think>")' in source
    if splits and "reasoning_content" not in source:
        return "<think>", "</think>"
    return "", ""


_LOOKING, _STARTED, _THINKING, _ENDED, _CONTENT = range(5)


def _overlap(text: str, tag: str) -> int:
    for k in range(min(len(text), len(tag)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ThinkingParser:
    """``feed(chunk) -> (thinking, content)``; ``finish()`` releases what was held back."""

    def __init__(self, opening: str, closing: str, *, opened: bool = False):
        self.opening = opening
        self.closing = closing
        self._state = _STARTED if opened else _LOOKING
        self._buf = ""

    @staticmethod
    def prompt_opens(prompt: str, opening: str) -> bool:
        """Whether a rendered prompt leaves the model inside an open thinking tag."""
        return bool(opening) and prompt.strip().endswith(opening)

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        thinking: list[str] = []
        content: list[str] = []
        while self._step(thinking, content):
            pass
        return "".join(thinking), "".join(content)

    def finish(self) -> tuple[str, str]:
        buf, self._buf = self._buf, ""
        if self._state in (_THINKING, _STARTED):
            return buf.lstrip() if self._state == _STARTED else buf, ""
        if self._state == _LOOKING:
            return "", buf
        return "", buf.lstrip() if self._state == _ENDED else buf

    def _step(self, thinking: list[str], content: list[str]) -> bool:
        state, buf = self._state, self._buf
        if state == _LOOKING:
            trimmed = buf.lstrip()
            if trimmed.startswith(self.opening):
                self._buf = trimmed[len(self.opening):].lstrip()
                self._state = _THINKING if self._buf else _STARTED
                return bool(self._buf)
            if not trimmed or self.opening.startswith(trimmed):
                return False  # blank, or maybe the opening tag: wait
            self._state = _CONTENT  # no thinking: the text is content, untrimmed
            return True
        if state == _STARTED:
            self._buf = buf.lstrip()
            if not self._buf:
                return False
            self._state = _THINKING
            return True
        if state == _THINKING:
            i = buf.find(self.closing)
            if i >= 0:
                if buf[:i]:
                    thinking.append(buf[:i])
                self._buf = buf[i + len(self.closing):].lstrip()
                self._state = _CONTENT if self._buf else _ENDED
                return bool(self._buf)
            keep = _overlap(buf, self.closing)
            if buf[:len(buf) - keep]:
                thinking.append(buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        if state == _ENDED:
            self._buf = buf.lstrip()
            if self._buf:
                self._state = _CONTENT
                return True
            return False
        if buf:
            content.append(buf)
        self._buf = ""
        return False
