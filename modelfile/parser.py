"""Modelfile parser with Ollama's exact observable behaviour.

Reference: ollama/ollama ``parser/parser.go`` (``ParseFile``), summarised in
``docs/modelfile-spec.md``.  Ollama reads the file rune by rune through a small
state machine; here the same language is defined by the Lark grammar
``modelfile.lark`` and this module does only what a grammar cannot:

1. decoding (BOM selects UTF-8 / UTF-16LE / UTF-16BE, invalid bytes -> U+FFFD);
2. replacing every rune that Go's ``strconv.IsPrint`` rejects (except TAB, CR,
   LF) by NUL, the grammar's single stand-in for "non-printable";
3. turning VALUE tokens into strings exactly like Go (drop non-printables,
   ``strings.TrimSpace``, ``unquote``);
4. mapping a Lark failure to Ollama's error text and line number.  The Lark
   error gives the failing position and the last token read, which say which
   Ollama state the failure happened in; a few characters of look-around then
   reproduce the rune at which Ollama would stop.  Ollama's line counter is
   incremented when a CR or LF is read, *before* that rune is examined, so an
   error raised by a newline reports the following line.
"""
from __future__ import annotations

import codecs
import re
import unicodedata
from pathlib import Path

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, UnexpectedToken, VisitError

from .command import Command

__all__ = ["ParseError", "parse", "KEYWORDS", "ROLES", "decode"]

#: Command keywords, in the order of Ollama's error message (case-insensitive).
KEYWORDS = ("from", "license", "template", "system", "adapter", "draft",
            "renderer", "parser", "parameter", "message", "requires")
#: MESSAGE roles (case-sensitive).
ROLES = ("system", "user", "assistant")

ERR_MISSING_FROM = "no FROM line"
ERR_INVALID_COMMAND = ('command must be one of "from", "license", "template", "system", '
                       '"adapter", "draft", "renderer", "parser", "parameter", "message", '
                       'or "requires"')
ERR_INVALID_ROLE = 'message role must be one of "system", "user", or "assistant"'
ERR_UNEXPECTED_EOF = "unexpected EOF"


class ParseError(ValueError):
    """A Modelfile syntax error; ``str(err)`` is Ollama's exact message."""

    def __init__(self, msg: str, line: int | None = None):
        self.msg = msg
        self.line = line
        super().__init__(f"(line {line}): {msg}" if line else msg)


# --------------------------------------------------------------------------- decoding

def _replace_per_byte(err: UnicodeDecodeError):
    # Go's UTF-8 decoder emits one U+FFFD per invalid byte.
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("modelfile-per-byte", _replace_per_byte)


def decode(data: str | bytes | bytearray | memoryview) -> str:
    """Decode like ``unicode.BOMOverride(unicode.UTF8.NewDecoder())``."""
    if isinstance(data, str):
        # Already text: the only thing left to honour is a UTF-8 BOM.
        return data[1:] if data.startswith("\ufeff") else data
    data = bytes(data)
    if data.startswith(codecs.BOM_UTF8):
        return data[3:].decode("utf-8", "modelfile-per-byte")
    if data.startswith(codecs.BOM_UTF16_BE):
        return data[2:].decode("utf-16-be", "replace")
    if data.startswith(codecs.BOM_UTF16_LE):
        return data[2:].decode("utf-16-le", "replace")
    return data.decode("utf-8", "modelfile-per-byte")


def is_print(ch: str) -> bool:
    """Go's ``strconv.IsPrint``: letters, marks, numbers, punctuation, symbols, ASCII space."""
    if " " <= ch <= "~":
        return True
    return unicodedata.category(ch)[0] in "LMNPS"


_NON_ASCII_OR_CONTROL = re.compile(r"[^\x20-\x7e\t\r\n]")


def _sanitize(text: str) -> str:
    """Replace every non-printable rune except TAB/CR/LF by NUL (same length)."""
    return _NON_ASCII_OR_CONTROL.sub(lambda m: m.group() if is_print(m.group()) else "\x00", text)


# --------------------------------------------------------------------------- grammar

_LARK = Lark(
    (Path(__file__).with_name("modelfile.lark")).read_text(encoding="utf-8"),
    parser="lalr",
    lexer="contextual",
    maybe_placeholders=True,
)


def _unquote(s: str) -> tuple[str, bool]:
    # Go's unquote (parser.go); s is already trimmed.
    if s.startswith('"""'):
        if len(s) >= 6 and s.endswith('"""'):
            return s[3:-3], True
        return "", False
    if s.startswith('"'):
        if len(s) >= 2 and s.endswith('"'):
            return s[1:-1], True
        return "", False
    return s, True


def _value(tok: Token) -> str:
    # tok = separator + buffer; Ollama drops non-printables, trims, unquotes.
    text = tok[1:].replace("\x00", "").strip(" \t\r\n")
    value, ok = _unquote(text)
    assert ok, "grammar accepted an incomplete value"  # VALUE only matches complete ones
    return value


class _ToCommands(Transformer):
    def start(self, children):
        return list(children)

    def model(self, children):
        return Command("model", _value(children[0]))

    def parameter(self, children):
        name, value = children
        return Command(str(name) if name is not None else "", _value(value))

    def message(self, children):
        role, value = children
        return Command("message", f"{role}: {_value(value)}")

    def __default__(self, data, children, meta):
        # license, template, system, adapter, draft, renderer, parser, requires
        return Command(str(data), _value(children[0]))


_TRANSFORMER = _ToCommands()


# --------------------------------------------------------------------------- errors

_KEYWORD_TOKENS = {f"_{k.upper()}" for k in KEYWORDS}


def _is_alpha(ch: str) -> bool:
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_param_char(ch: str) -> bool:
    return _is_alpha(ch) or ("0" <= ch <= "9") or ch == "_"


def _line_at(s: str, i: int) -> int:
    """Ollama's line counter while it examines rune ``s[i]`` (CR and LF both count)."""
    head = s[: i + 1]
    return 1 + head.count("\n") + head.count("\r")


def _name_error(s: str, start: int) -> ParseError:
    """Ollama in state name; ``s[start]`` is the rune that opened the name."""
    buf = s[start] if s[start] != "\x00" else ""
    i = start + 1
    while i < len(s) and _is_alpha(s[i]):
        buf += s[i]
        i += 1
    if i == len(s):
        return ParseError(ERR_UNEXPECTED_EOF)
    if s[i] in " \t" and buf.lower() in KEYWORDS:
        # A valid command whose value never completed (unclosed quote).
        return ParseError(ERR_UNEXPECTED_EOF)
    return ParseError(ERR_INVALID_COMMAND, _line_at(s, i))


def _parameter_error(s: str, start: int) -> ParseError:
    """Ollama in state parameter, name starting at ``s[start]``."""
    i = start
    while i < len(s) and _is_param_char(s[i]):
        i += 1
    if i == len(s) or s[i] in " \t":
        return ParseError(ERR_UNEXPECTED_EOF)  # EOF, or the value never completed
    return ParseError(f"{ERR_UNEXPECTED_EOF}: {s[start:i]}")


def _role_error(s: str, start: int) -> ParseError:
    """Ollama in state message, role starting at ``s[start]``."""
    i = start
    while i < len(s) and _is_alpha(s[i]):
        i += 1
    if i == len(s):
        return ParseError(ERR_UNEXPECTED_EOF)
    if s[i] in " \t":
        if s[start:i] in ROLES:
            return ParseError(ERR_UNEXPECTED_EOF)  # the value never completed
        return ParseError(ERR_INVALID_ROLE, _line_at(s, i))
    return ParseError(f"{ERR_UNEXPECTED_EOF}: {s[start:i]}")


def _map_error(s: str, err: UnexpectedInput, tokens: list[Token]) -> ParseError:
    if isinstance(err, UnexpectedToken):
        pos = len(s) if err.token.type == "$END" else err.token.start_pos
    else:
        pos = err.pos_in_stream
    if pos is None or pos >= len(s):
        return ParseError(ERR_UNEXPECTED_EOF)
    done = [t for t in tokens if t.end_pos is not None and t.end_pos <= pos]
    prev = done[-1].type if done else None
    if prev in (None, "_BLANK", "_COMMENT"):
        return _name_error(s, pos)           # s[pos] opens a command name
    if prev == "_NP":
        return _name_error(s, done[-1].start_pos)
    if prev in _KEYWORD_TOKENS:
        return _name_error(s, done[-1].start_pos)
    if prev == "_SEP":
        keyword = done[-2].type
        return _parameter_error(s, pos) if keyword == "_PARAMETER" else _role_error(s, pos)
    if prev == "PARAM_NAME":
        return _parameter_error(s, done[-1].start_pos)
    if prev == "ROLE":
        return _role_error(s, done[-1].start_pos)
    # After VALUE the grammar always sees a newline or the end: unreachable.
    raise AssertionError(f"unmapped Modelfile parse failure after {prev} at {pos}")  # pragma: no cover


def _iter_tokens(ip):
    """Feed the interactive parser token by token, yielding each token (Lark >= 1.1)."""
    if hasattr(ip, "iter_parse"):  # Lark >= 1.1.6
        yield from ip.iter_parse()
        return
    for tok in ip.lexer_thread.lex(ip.parser_state):  # pragma: no cover - older Lark
        yield tok
        ip.feed_token(tok)


# --------------------------------------------------------------------------- API

def parse(text: str | bytes) -> list[Command]:
    """Parse a Modelfile into its ordered commands (Ollama's ``ParseFile``).

    Raises :class:`ParseError` with Ollama's exact message.
    """
    s = _sanitize(decode(text))
    ip = _LARK.parse_interactive(s)
    tokens: list[Token] = []
    try:
        for tok in _iter_tokens(ip):
            tokens.append(tok)
        tree = ip.feed_eof(tokens[-1] if tokens else None)
    except UnexpectedInput as err:
        raise _map_error(s, err, tokens) from None
    try:
        commands = _TRANSFORMER.transform(tree)
    except VisitError as err:  # pragma: no cover - only on internal bugs
        raise err.orig_exc from None
    if not any(c.name == "model" for c in commands):
        raise ParseError(ERR_MISSING_FROM)
    return commands
