"""Parsing: template text -> syntax tree (nodes.py), with Go's parse-time checks and error messages.

The grammar lives in gotemplate.lark (in modelfile/, beside this package).  The builder applies trim
markers and rejects unknown functions and misplaced keywords; the checks reject undefined variables and
break/continue outside range; Lark's errors become Go's messages.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from .nodes import (Action, Arg, Break, Command, Continue, Dot, Field, Ident, If, Literal, Node, Paren, Pipe, Pos,
                    Range, Text, Variable, With)
from .values import TemplateError

# ---------------------------------------------------------------------------------------------------
# Parsing

_SPACE = " \t\r\n"  # Go's isSpace for trim markers; str.strip() would also eat \v, \f and Unicode spaces
_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})
_TOKEN_NAMES = {
    "_RD": '"}}"',
    "_LD": '"{{"',
    "LD_IF": "{{if}}",
    "LD_RANGE": "{{range}}",
    "LD_WITH": "{{with}}",
    "LD_BREAK": "{{break}}",
    "LD_CONTINUE": "{{continue}}",
    "_LD_END": "{{end}}",
    "_LD_ELSE": "{{else}}",
    "LD_ELSE_IF": "{{else if}}",
    "LD_ELSE_WITH": "{{else with}}",
    "$END": "EOF",
}


@functools.cache
def _parser() -> Lark:
    # Built once per process and never mutated afterwards; building takes ~0.1 s.
    # The grammar sits in modelfile/, beside this package (package-data `modelfile = ["*.lark"]` ships it).
    grammar = Path(__file__).parent.with_name("gotemplate.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer="contextual", start="start")


_SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}


def _unquote(body: str, quote: str, pos: Pos) -> str:
    """Decode the inside of a Go interpreted string or rune literal (strconv.Unquote)."""
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8", "surrogatepass")
            i += 1
            continue
        if i + 1 >= n:
            raise TemplateError("invalid syntax in quoted string", *pos)
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 2
        elif e == quote:
            out += e.encode()
            i += 2
        elif e == "x":
            digits = body[i + 2 : i + 4]
            if not re.fullmatch(r"[0-9a-fA-F]{2}", digits):
                raise TemplateError(f"invalid escape \\x{digits} in quoted string", *pos)
            out.append(int(digits, 16))
            i += 4
        elif e in "uU":
            size = 4 if e == "u" else 8
            digits = body[i + 2 : i + 2 + size]
            if not re.fullmatch(rf"[0-9a-fA-F]{{{size}}}", digits):
                raise TemplateError(f"invalid escape \\{e}{digits} in quoted string", *pos)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise TemplateError(f"invalid Unicode code point \\{e}{digits}", *pos)
            out += chr(code).encode()
            i += 2 + size
        elif e in "01234567":
            digits = body[i + 1 : i + 4]
            if not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise TemplateError(f"invalid octal escape \\{digits} in quoted string", *pos)
            out.append(int(digits, 8))
            i += 4
        else:
            raise TemplateError(f"unknown escape sequence \\{e}", *pos)
    return out.decode("utf-8", errors="replace")


def _parse_number(text: str, pos: Pos) -> int | float:
    """Go number literal -> int, or float when it has a fraction/exponent (Go's idealConstant)."""
    t = text.replace("_", "")
    try:
        lower = t.lower()
        if re.fullmatch(r"[+-]?0x[0-9a-f.]*p[+-]?\d+", lower) or (lower.lstrip("+-").startswith("0x") and "." in lower):
            return float.fromhex(t)
        if lower.lstrip("+-").startswith(("0x", "0o", "0b")):
            return int(t, 0)
        if re.fullmatch(r"[+-]?0[0-7]+", t):
            return int(t, 8)  # Go's legacy octal, e.g. 017 == 15
        if re.search(r"[.eE]", t):
            return float(t)
        return int(t, 10)
    except ValueError:
        raise TemplateError(f"bad number syntax: {text!r}", *pos) from None


def _pos(tok: Token) -> Pos:
    return (tok.line or 0, tok.column or 0)


@dataclass(frozen=True)
class _Decl:
    names: tuple[str, ...]
    is_assign: bool


class _Builder(Transformer):
    """Lark tree -> syntax tree; applies trim markers and rejects unknown functions and misplaced keywords."""

    def __init__(self, source: str, func_names: frozenset[str]):
        super().__init__()
        self._source = source
        self._func_names = func_names

    # -- text and structure --
    def start(self, children: list) -> tuple[Node, ...]:
        return children[0]

    def list(self, children: list) -> tuple[Node, ...]:
        return tuple(c for c in children if not (isinstance(c, Text) and c.text == ""))

    def text(self, children: list) -> Text:
        tok = children[0]
        value = str(tok)
        # TEXT never contains "{{", so it is bounded by "}}" before and "{{" after; the trim markers
        # are exactly " -}}" / "{{- " at those boundaries (Go requires the space next to the dash).
        before = self._source[max(0, tok.start_pos - 4) : tok.start_pos]
        after = self._source[tok.end_pos : tok.end_pos + 4]
        if len(before) == 4 and before[0] in _SPACE and before[1:] == "-}}":
            value = value.lstrip(_SPACE)
        if len(after) == 4 and after[:3] == "{{-" and after[3] in _SPACE:
            value = value.rstrip(_SPACE)
        return Text(value)

    def action(self, children: list) -> Action:
        return Action(children[0])

    def break_action(self, children: list) -> Break:
        return Break(_pos(children[0]))

    def continue_action(self, children: list) -> Continue:
        return Continue(_pos(children[0]))

    def if_block(self, children: list) -> If:
        _tok, pipe, body, tail = children
        return If(pipe, body, tail)

    def with_block(self, children: list) -> With:
        _tok, pipe, body, tail = children
        return With(pipe, body, tail)

    def range_block(self, children: list) -> Range:
        _tok, pipe, body, tail = children
        return Range(pipe, body, tail)

    def no_else(self, children: list) -> None:
        return None

    def else_list(self, children: list) -> tuple[Node, ...]:
        return children[0]

    def else_if(self, children: list) -> tuple[Node, ...]:
        _tok, pipe, body, tail = children
        return (If(pipe, body, tail),)

    def else_with(self, children: list) -> tuple[Node, ...]:
        _tok, pipe, body, tail = children
        return (With(pipe, body, tail),)

    # -- pipelines --
    def pipeline(self, children: list) -> Pipe:
        decl = _Decl((), False)
        if children and isinstance(children[0], _Decl):
            decl, children = children[0], children[1:]
        cmds = tuple(children)
        return Pipe(decl.names, decl.is_assign, cmds, cmds[0].pos)

    def decl(self, children: list) -> _Decl:
        *names, op = children
        for tok in names:
            if "." in tok:
                raise TemplateError(f"unexpected {str(tok)!r} in declaration", *_pos(tok))
        return _Decl(tuple(str(t) for t in names), str(op) == "=")

    def command(self, children: list) -> Command:
        args = tuple(children)
        return Command(args, args[0].pos)

    def paren(self, children: list) -> Paren:
        pipe = children[0]
        chain = tuple(str(children[1])[1:].split(".")) if len(children) > 1 else ()
        return Paren(pipe, chain, pipe.pos)

    def operand(self, children: list) -> Arg:
        item = children[0]
        if isinstance(item, Paren):
            return item
        tok: Token = item
        pos = _pos(tok)
        text = str(tok)
        kind = tok.type
        if kind == "FIELD":
            return Field(tuple(text[1:].split(".")), pos)
        if kind == "VAR":
            name, *chain = text.split(".")
            return Variable(name, tuple(chain), pos)
        if kind == "DOT":
            return Dot(pos)
        if kind == "IDENT":
            if text == "true" or text == "false":
                return Literal(text == "true", pos)
            if text == "nil":
                return Literal(None, pos)
            if text in _KEYWORDS:
                if text in ("define", "template", "block"):
                    raise TemplateError(f"{{{{{text}}}}} is not supported", *pos)
                raise TemplateError(f"unexpected {{{{{text}}}}}", *pos)
            if text not in self._func_names:
                raise TemplateError(f'function "{text}" not defined', *pos)
            return Ident(text, pos)
        if kind == "STRING":
            return Literal(_unquote(text[1:-1], '"', pos), pos)
        if kind == "RAW_STRING":
            return Literal(text[1:-1].replace("\r", ""), pos)  # strconv.Unquote drops \r from raw strings
        if kind == "CHAR":
            value = _unquote(text[1:-1], "'", pos)
            if len(value) != 1:
                raise TemplateError(f"malformed character constant: {text}", *pos)
            return Literal(ord(value), pos)
        if kind == "NUMBER":
            return Literal(_parse_number(text, pos), pos)
        raise TemplateError(f"unexpected {text!r}", *pos)  # pragma: no cover - grammar has no other operands


def _check(nodes: Sequence[Node], scope: list[str], in_range: bool) -> None:
    """Parse-time checks Go's parser makes: variables defined before use, break/continue inside range."""
    for node in nodes:
        if isinstance(node, Action):
            _check_pipe(node.pipe, scope, max_decl=1, context="command")
        elif isinstance(node, (If, With, Range)):
            mark = len(scope)
            is_range = isinstance(node, Range)
            _check_pipe(node.pipe, scope, max_decl=2 if is_range else 1, context=type(node).__name__.lower())
            _check(node.body, scope, in_range or is_range)
            if node.else_body is not None:
                _check(node.else_body, scope, in_range)
            del scope[mark:]
        elif isinstance(node, (Break, Continue)) and not in_range:
            word = "break" if isinstance(node, Break) else "continue"
            raise TemplateError(f"{{{{{word}}}}} outside {{{{range}}}}", *node.pos)


def _check_pipe(pipe: Pipe, scope: list[str], max_decl: int, context: str) -> None:
    if len(pipe.decl) > max_decl:
        raise TemplateError(f"too many declarations in {context}", *pipe.pos)
    for cmd in pipe.cmds:
        for arg in cmd.args:
            if isinstance(arg, Variable) and arg.name != "$" and arg.name not in scope:
                raise TemplateError(f'undefined variable "{arg.name}"', *arg.pos)
            if isinstance(arg, Paren):
                _check_pipe(arg.pipe, scope, max_decl=1, context="parenthesized pipeline")
    for name in pipe.decl:
        if pipe.is_assign:
            if name not in scope and name != "$":
                raise TemplateError(f'undefined variable "{name}"', *pipe.pos)
        else:
            scope.append(name)


def _syntax_error(err: UnexpectedInput, source: str) -> TemplateError:
    line, column = getattr(err, "line", None), getattr(err, "column", None)
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else ""
        message = {
            '"': "unterminated quoted string",
            "`": "unterminated raw quoted string",
            "'": "unterminated character constant",
        }.get(ch, f"bad character {ch!r} in action")
        return TemplateError(message, line, column)
    if isinstance(err, UnexpectedToken):
        tok = err.token
        if tok.type == "$END":
            message = "unclosed action" if "_RD" in err.expected else "unexpected EOF"
            return TemplateError(message, line if line and line > 0 else None, column if column and column > 0 else None)
        if tok.type == "_RD" and "FIELD" in err.expected:
            return TemplateError("missing value for command", line, column)
        if tok.type == "TEXT":
            # Inside an action nothing matched, so Lark re-lexed the rest as text; name what is there.
            rest = str(tok)
            quotes = {'"': "quoted string", "`": "raw quoted string", "'": "character constant"}
            if rest[:1] in quotes:
                return TemplateError(f"unterminated {quotes[rest[0]]}", line, column)
            word = re.match(r"\w+", rest)
            if word:
                return TemplateError(f"unexpected {word.group()!r} in action", line, column)
            return TemplateError(f"bad character {rest[:1]!r} in action", line, column)
        desc = _TOKEN_NAMES.get(tok.type, repr(str(tok)))
        return TemplateError(f"unexpected {desc}", line, column)
    if isinstance(err, UnexpectedEOF):
        return TemplateError("unexpected EOF")
    return TemplateError(str(err), line, column)  # pragma: no cover - Lark has no other kinds


_COMMENT_OPEN = re.compile(r"\{\{(?:-[ \t\r\n])?/\*")
_COMMENT = re.compile(r"\{\{(?:-[ \t\r\n])?/\*[\s\S]*?\*/(?:[ \t\r\n]-)?\}\}")  # as in the grammar


def _offset_pos(text: str, offset: int) -> Pos:
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


_UNSUPPORTED = re.compile(r"\{\{(?:-[ \t\r\n])?[ \t\r\n]*(define|template|block)\b")


def _parse_nodes(text: str, func_names: frozenset[str]) -> tuple[Node, ...]:
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        # An unsupported action usually derails the parse later (at its {{end}}); name the real cause.
        unsupported = _UNSUPPORTED.search(text)
        if unsupported:
            word = unsupported.group(1)
            raise TemplateError(f"{{{{{word}}}}} is not supported", *_offset_pos(text, unsupported.start())) from None
        for opener in _COMMENT_OPEN.finditer(text):
            if not _COMMENT.match(text, opener.start()):
                raise TemplateError("unclosed comment", *_offset_pos(text, opener.start())) from None
        raise _syntax_error(err, text) from None
    try:
        nodes = _Builder(text, func_names).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, TemplateError):
            raise err.orig_exc from None
        raise
    _check(nodes, [], in_range=False)
    return nodes
