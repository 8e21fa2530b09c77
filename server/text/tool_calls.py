"""Tool calls in a model's output, parsed from a stream of text chunks.

A model calls a tool by writing it in its own format; what the format is comes from its template
(Ollama: tools/template.go for Go templates; the markers a GGUF's Jinja template writes otherwise):

- Qwen2.5 / Qwen3 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one per block;
- Llama 3.x and Ollama's generic fallback: a bare JSON object (``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``) that must open the answer, else the answer is plain text;
- a tag learned from a Go template (the first text after ``.ToolCalls``, up to any ``{``), followed by
  JSON objects, as Ollama's generic parser reads them;
- Gemma: FunctionGemma's ``<start_function_call>call:NAME{key:<escape>v<escape>}<end_function_call>`` and
  Gemma 4's ``<|tool_call>call:NAME{key:<|"|>v<|"|>}<tool_call|>``.

``ToolCallParser.feed`` takes each chunk and returns the content that is certainly not part of a call
and the calls completed so far; text that may still become a call (a partial tag, an open JSON object)
is held back and released as content when it turns out not to be one. Only names of the request's
tools are calls (as Ollama's parser matches names against the tools). Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from modelfile.gotemplate import Action, Field, GoTemplate, If, Node, Range, Text, With
from server.text.json_scan import JsonScan

__all__ = [
    "FUNCTIONGEMMA",
    "GEMMA4",
    "JSON_OBJECT",
    "LLAMA3",
    "QWEN",
    "ParsedCall",
    "ToolCallFormat",
    "ToolCallParser",
    "format_for_go_template",
    "format_for_jinja_template",
    "format_for_tag",
    "gemma_arguments",
    "go_tool_call_tag",
]


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model writes a call.

    ``open``: the text that starts a call; "{" means a bare JSON answer (it must come first).
    ``close``: the text that ends a call block ("" when the JSON's own end ends it).
    ``syntax``: "json" (an object with name and arguments/parameters) or "gemma" (``call:NAME{k:v}``).
    ``string_quote``: Gemma's delimiter around string values. ``prefixes``: text a bare call may start with.
    """

    open: str
    close: str = ""
    syntax: str = "json"
    string_quote: str = ""
    prefixes: tuple[str, ...] = ()
    bare_start: bool = False  # a tagged format whose calls may also come as bare JSON opening the answer

    @property
    def bare(self) -> bool:
        return self.open in ("{", "[")


# Qwen models (Qwen2.5-Coder above all) often answer a call as a bare or fenced JSON object instead of in
# <tool_call> tags; llama.cpp's Hermes parser, which Ollama runs for such GGUF templates, reads those too.
QWEN = ToolCallFormat("<tool_call>", "</tool_call>", prefixes=("```json", "```"), bare_start=True)
JSON_OBJECT = ToolCallFormat("{")
LLAMA3 = ToolCallFormat("{", prefixes=("<|python_tag|>",))
FUNCTIONGEMMA = ToolCallFormat("<start_function_call>", "<end_function_call>", "gemma", "<escape>")
GEMMA4 = ToolCallFormat("<|tool_call>", "<tool_call|>", "gemma", '<|"|>')


@dataclass(frozen=True)
class ParsedCall:
    """A call found in the output: the tool's name, its arguments, and its position among the calls."""

    name: str
    arguments: dict[str, Any]
    index: int


# ---------------------------------------------------------------------------------------------------
# The format, from the template


def format_for_tag(tag: str) -> ToolCallFormat:
    """The format a learned tag stands for: the known ones with their closing tag and syntax, any
    other as Ollama's generic parser reads it (JSON objects after the tag)."""
    if tag in ("{", "["):
        return LLAMA3 if tag == "{" else ToolCallFormat("[")
    if tag.startswith("<tool_call>"):
        return QWEN
    if tag.startswith("<start_function_call>"):
        return FUNCTIONGEMMA
    if tag.startswith("<|tool_call>"):
        return GEMMA4
    if tag.startswith("<|python_tag|>"):
        return LLAMA3
    return ToolCallFormat(tag)


def go_tool_call_tag(template: GoTemplate) -> str:
    """Ollama's parseTag: the first non-blank text inside the `if` on .ToolCalls, cut at its first "{"
    and trimmed; "{" (a bare JSON answer) when there is none."""
    node = _tool_calls_if(template.root)
    if node is None:
        return "{"
    text = _first_text(node.body)
    if text is None:
        return "{"
    tag = text.replace("\r\n", "\n").split("{", 1)[0].strip()
    return tag or "{"


def format_for_go_template(template: GoTemplate) -> ToolCallFormat:
    return format_for_tag(go_tool_call_tag(template))


def format_for_jinja_template(source: str) -> ToolCallFormat:
    """The format a Jinja chat template teaches, from the markers it writes."""
    for marker, fmt in (("<|tool_call>", GEMMA4), ("<start_function_call>", FUNCTIONGEMMA), ("<tool_call>", QWEN)):
        if marker in source:
            return fmt
    if "[TOOL_CALLS]" in source:
        return ToolCallFormat("[TOOL_CALLS]")
    return LLAMA3


def _mentions_tool_calls(node: If) -> bool:
    return any(isinstance(a, Field) and "ToolCalls" in a.chain for c in node.pipe.cmds for a in c.args)


def _tool_calls_if(nodes: Sequence[Node]) -> If | None:
    for node in nodes:
        if isinstance(node, If) and _mentions_tool_calls(node):
            return node
        if isinstance(node, (If, Range, With)):
            found = _tool_calls_if(node.body) or (_tool_calls_if(node.else_body) if node.else_body else None)
            if found is not None:
                return found
    return None


def _first_text(nodes: Sequence[Node]) -> str | None:
    """Depth-first, the first non-blank text; an action, or a block without one, ends the search."""
    for node in nodes:
        if isinstance(node, Text):
            if node.text.strip():
                return node.text
            continue
        if isinstance(node, Action):
            return None
        if isinstance(node, (If, Range, With)):
            found = _first_text(node.body)
            if found is None and node.else_body:
                found = _first_text(node.else_body)
            return found
    return None


# ---------------------------------------------------------------------------------------------------
# Reading calls


def _json_end(text: str, start: int) -> int:
    """The end (exclusive) of the balanced JSON object/array opening at ``start``; -1 if not yet closed."""
    end = JsonScan().scan(text[start:])
    return end if end < 0 else start + end


def _arguments(value: Any) -> dict[str, Any] | None:
    if value is None:
        return {}
    if isinstance(value, str):  # some models write the arguments as a JSON string
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _call_from_json(obj: Any, names: Collection[str]) -> tuple[str, dict[str, Any]] | None:
    """``{"name", "arguments"|"parameters"}``, OpenAI's ``{"function": {...}}``, or ``{"<tool>": {args}}``."""
    if not isinstance(obj, dict):
        return None
    fn = obj["function"] if isinstance(obj.get("function"), dict) else obj
    name = fn.get("name")
    if isinstance(name, str) and (name in names or not names):
        args = _arguments(fn["arguments"] if "arguments" in fn else fn.get("parameters"))
        return None if args is None else (name, args)
    if len(obj) == 1:
        (key, value), = obj.items()
        if key in names and isinstance(value, dict):
            return key, value
    return None


def _loads(text: str) -> Any:
    """A balanced JSON value, or one wrapped in doubled braces (``{{"name": ..., "arguments": {...}}}``, as
    Qwen2.5-Coder's shipped template teaches: server.text.template_errata), read without its outer pair.
    Raises ValueError when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        if text.startswith("{{") and text.endswith("}}"):
            return json.loads(text[1:-1])
        raise


def _calls_from_json(value: Any, names: Collection[str]) -> list[tuple[str, dict[str, Any]]] | None:
    """Every call in a parsed JSON value (an object, or a list of them); None if any part is not one."""
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_json(v, names) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


_GEMMA_PUNCT = "{}[],:"


def gemma_arguments(text: str, quote: str) -> dict[str, Any] | None:
    """Gemma's ``{key:value,...}`` as a dict: strings between ``quote`` delimiters, bare keys, bare
    values (numbers, true/false/null, else strings); None if it does not read as an object."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if quote and text.startswith(quote, i):
            end = text.find(quote, i + len(quote))
            if end < 0:
                return None
            out.append(json.dumps(text[i + len(quote):end]))
            i = end + len(quote)
            continue
        c = text[i]
        if c == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i:end + 1])
            i = end + 1
            continue
        if c in _GEMMA_PUNCT or c.isspace():
            out.append(c)
            i += 1
            continue
        j = i
        while j < n and text[j] not in _GEMMA_PUNCT and not (quote and text.startswith(quote, j)):
            j += 1
        token = text[i:j].strip()
        if j < n and text[j] == ":":
            out.append(json.dumps(token))
        else:
            try:
                literal = json.loads(token)
                out.append(token if isinstance(literal, (int, float, bool)) or literal is None else json.dumps(token))
            except ValueError:
                out.append(json.dumps(token))
        i = j
    try:
        value = json.loads("".join(out))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _gemma_call(block: str, quote: str, names: Collection[str]) -> tuple[str, dict[str, Any]] | None:
    body = block.strip()
    if not body.startswith("call:"):
        return None
    brace = body.find("{")
    if brace < 0:
        return None
    name = body[len("call:"):brace].strip()
    end = body.rfind("}")
    args = gemma_arguments(body[brace:end + 1], quote) if end > brace else None
    if args is None or not name or (names and name not in names):
        return None
    return name, args


class ToolCallParser:
    """Splits a stream of output text into content and tool calls (``feed`` per chunk, ``finish`` at the end)."""

    def __init__(self, fmt: ToolCallFormat, tool_names: Iterable[str]):
        self.format = fmt
        self.names = frozenset(tool_names)
        self._buf = ""  # held text: a partial tag or prefix, or a call being read (from its tag on)
        self._skip = 0  # in a bare call: how much of the held text is the prefix before the JSON
        self._in_call = False
        self._bare_run = False  # the call being read is bare JSON at the start of the answer
        self._started = False  # the answer has begun (content was sent): no bare call any more
        self._done = False  # bare format: the answer did not start with a call, so it is all content
        self._n = 0
        self._scan: tuple[int, JsonScan] | None = None  # the open JSON value: its offset in the held text

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        if self._done:
            return text, []
        self._buf += text
        content: list[str] = []
        calls: list[ParsedCall] = []
        while self._step(content, calls, final=False):
            pass
        if content:
            self._started = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The rest: a call cut off by the end of output is still read if it parses, else it is content."""
        content: list[str] = []
        calls: list[ParsedCall] = []
        if not self._done:
            while self._step(content, calls, final=True):
                pass
            if self._buf:
                content.append(self._buf)
                self._buf = ""
        return "".join(content), calls

    # -- the state machine ----------------------------------------------------------------------
    def _emit(self, found: list[tuple[str, dict[str, Any]]], calls: list[ParsedCall]) -> None:
        for name, args in found:
            calls.append(ParsedCall(name, args, self._n))
            self._n += 1

    def _step(self, content: list[str], calls: list[ParsedCall], final: bool) -> bool:
        """One transition; True if another may follow with the text already held."""
        fmt = self.format
        if not self._in_call:
            if fmt.bare or (fmt.bare_start and not self._started and not self._n):
                return self._step_bare_start(content, final)
            return self._step_scan(content, final)
        if self._bare_run or (fmt.syntax == "json" and not fmt.close):
            return self._step_json_run(content, calls, final)
        return self._step_block(content, calls, final)

    def _step_bare_start(self, content: list[str], final: bool) -> bool:
        """A call as bare JSON opening the answer, maybe after a prefix (Llama's <|python_tag|>, a code
        fence); for a bare format (Ollama's "{" tag) the first non-blank text decides everything."""
        stripped = self._buf.lstrip()
        if not stripped:
            return False
        lead = len(self._buf) - len(stripped)
        for p in self.format.prefixes:
            if stripped.startswith(p):
                self._skip = lead + len(p)
                self._in_call = self._bare_run = True
                return True
            if p.startswith(stripped) and not final:
                return False  # maybe the prefix: wait
        if stripped[0] in "{[":
            self._skip = lead
            self._in_call = self._bare_run = True
            return True
        if self.format.bare:
            self._done = True
            content.append(self._buf)
            self._buf = ""
            return False
        self._started = True  # not a bare call: look for the tag from here on
        return True

    def _step_scan(self, content: list[str], final: bool) -> bool:
        tag = self.format.open
        i = self._buf.find(tag)
        if i >= 0:
            before = self._buf[:i]
            if self._n and not before.strip():
                before = ""  # the blank between two calls
            if before:
                content.append(before)
            self._buf = self._buf[i:]
            self._in_call = True
            return True
        keep = 0 if final else _partial_suffix(self._buf, tag)
        out = self._buf[:len(self._buf) - keep]
        if self._n and not out.strip():
            keep, out = len(self._buf), ""  # hold blanks after a call: another may follow
            if final:
                self._buf = ""
                return False
        if out:
            content.append(out)
        self._buf = self._buf[len(self._buf) - keep:] if keep else ""
        return False

    def _step_block(self, content: list[str], calls: list[ParsedCall], final: bool) -> bool:
        """A tagged block, read whole once its closing tag (or the end of output) arrives."""
        fmt = self.format
        start = len(fmt.open)
        end = self._buf.find(fmt.close, start) if fmt.close else -1
        if end < 0 and not final:
            return False
        block = self._buf[start:end] if end >= 0 else self._buf[start:]
        rest = self._buf[end + len(fmt.close):] if end >= 0 else ""
        if fmt.syntax == "gemma":
            one = _gemma_call(block, fmt.string_quote, self.names)
            found = [one] if one is not None else None
        else:
            found = _json_calls_in(block, self.names)
        if found:
            self._emit(found, calls)
        else:
            content.append(self._buf[:len(self._buf) - len(rest)])  # not a call after all
        self._buf = rest
        self._in_call = False
        return bool(rest)

    def _step_json_run(self, content: list[str], calls: list[ParsedCall], final: bool) -> bool:
        """JSON values after a tag without a closing one, or bare at the start: each complete value is
        read; once there are calls, other text is dropped, as Ollama's parser leaves it."""
        fmt = self.format
        text = self._buf[self._skip:]
        if not self._bare_run and text.startswith(fmt.open):
            text = text[len(fmt.open):]
        if self._n:
            starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
            if not starts:
                self._buf, self._skip = "", 0
                return False
            if min(starts):
                self._scan = None
            text = text[min(starts):]
            self._buf, self._skip = text, 0
        head = text.lstrip()
        if not head:
            return False
        end = -2
        if head[0] in "{[":
            offset = len(self._buf) - len(head)  # stable while the value grows: the buffer is only appended to
            if self._scan is None or self._scan[0] != offset:
                self._scan = (offset, JsonScan())
            end = self._scan[1].scan(head)
            if end != -1:
                self._scan = None
        if end == -1:  # not complete yet
            if final and self._n:
                self._buf, self._skip = "", 0
            return False
        found = None
        if end > 0:
            try:
                found = _calls_from_json(_loads(head[:end]), self.names)
            except ValueError:
                found = None
        if not found:
            if self._n:
                self._buf, self._skip = head[max(end, 0):] if end > 0 else "", 0
                return bool(self._buf)
            # not a call: the held text is content (all of the answer for a bare format)
            content.append(self._buf)
            self._buf, self._skip = "", 0
            self._in_call = False
            if fmt.bare:
                self._done = True
            elif self._bare_run:
                self._started = True
            self._bare_run = False
            return False
        self._emit(found, calls)
        self._buf, self._skip = head[end:], 0
        return bool(self._buf)


def _json_calls_in(block: str, names: Collection[str]) -> list[tuple[str, dict[str, Any]]] | None:
    """Every JSON value in a block, each a call (or list of calls); None if any is not."""
    found: list[tuple[str, dict[str, Any]]] = []
    i = 0
    text = block.strip()
    while i < len(text):
        if text[i].isspace() or text[i] in ",;":
            i += 1
            continue
        if text[i] not in "{[":
            return None
        end = _json_end(text, i)
        if end < 0:
            return None
        try:
            calls = _calls_from_json(_loads(text[i:end]), names)
        except ValueError:
            return None
        if calls is None:
            return None
        found += calls
        i = end
    return found or None


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (held back: it may become the tag)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
