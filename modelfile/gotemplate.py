"""Go's text/template, the subset Ollama TEMPLATEs use.

The grammar lives in gotemplate.lark.  Parsing yields an immutable tree of small dataclasses; execution
walks it with Go's semantics: whitespace trim markers, variable scoping (a variable lives until the
`end` of the control structure that declared it), `range`/`else`/`break`/`continue`, pipelines that
append the previous result as the last argument, short-circuit `and`/`or` returning the deciding value,
Go truthiness, `fmt`-style printing and Ollama's extra funcs `json` and `currentDate`.

Values the template sees: dicts (map lookups), GoStruct (a struct with named fields, optional String()
and JSON form), StringerMap (a map whose String() is its JSON), lists/tuples, str/int/float/bool/None.
Other Python objects expose their public attributes as fields and public methods as callable fields.

Deliberate deviations from Go, all in the direction of rendering instead of failing:
- A missing field or map key evaluates to "no value" (MISSING): falsy, printed as "" (Go prints
  "<no value>" for maps and fails with "can't evaluate field" for structs), `len` 0, equal only to
  nil/no value, `json` null.  Field access on nil/no value also gives no value (Go fails for nil pointers).
- Maps keep insertion order in `json` output (Go sorts map keys; Ollama's tool arguments are ordered).
- Not supported: `define`/`template`/`block`, the `call` builtin, complex numbers, `%[n]` argument
  indexes in printf, iterator functions in `range`, custom delimiters.
"""

from __future__ import annotations

import base64
import datetime
import enum
import functools
import inspect
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Union
from urllib.parse import quote_plus

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

__all__ = [
    "GoStruct",
    "GoTemplate",
    "MISSING",
    "StringerMap",
    "TemplateError",
    "format_value",
    "go_json",
    "go_sprintf",
    "parse_template",
]


class TemplateError(ValueError):
    """A template that does not parse, or fails while executing; carries the 1-based position when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.reason = message
        self.line = line
        self.column = column
        where = f"{line}:{column}: " if line is not None else ""
        super().__init__(f"template: {where}{message}")


class _NoValue(enum.Enum):
    """Go's invalid reflect.Value: what a missing field or map key evaluates to (a falsy singleton)."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _NoValue.MISSING


@dataclass(frozen=True, eq=False)
class GoStruct:
    """A Go struct as a template sees it.

    `fields` are the exported fields by Go name; `json_value` is what encoding/json would produce
    (plain Python data; derived from the fields when omitted); `stringer` marks types with a String()
    method returning their JSON (Ollama's api.Tool, ToolFunction, ...), which is what `{{ . }}` prints.
    """

    fields: Mapping[str, Any]
    json_value: Any = MISSING
    stringer: bool = False
    type_name: str = "struct"

    def field(self, name: str) -> Any:
        return self.fields.get(name, MISSING)

    def __go_json__(self) -> Any:
        return self.fields if self.json_value is MISSING else self.json_value

    def __go_str__(self) -> str:
        if self.stringer:
            return go_json(self)
        return "{" + " ".join(format_value(v, nested=True) for v in self.fields.values()) + "}"


class StringerMap(dict):
    """A map whose Go type has String() returning its JSON (Ollama's ToolCallFunctionArguments)."""

    def __go_str__(self) -> str:
        return go_json(self)


class StringerList(list):
    """Ollama's PropertyType ([]string) whose String() is the single element, or `[a b]` for several."""

    def __go_str__(self) -> str:
        if len(self) == 1:
            return format_value(self[0])
        return "[" + " ".join(format_value(v, nested=True) for v in self) + "]"


# ---------------------------------------------------------------------------------------------------
# Syntax tree.  Positions are (line, column), 1-based, for error messages.

Pos = tuple[int, int]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Field:
    chain: tuple[str, ...]
    pos: Pos


@dataclass(frozen=True)
class Variable:
    name: str  # "$" or "$x"
    chain: tuple[str, ...]
    pos: Pos


@dataclass(frozen=True)
class Dot:
    pos: Pos


@dataclass(frozen=True)
class Ident:
    name: str
    pos: Pos


@dataclass(frozen=True)
class Literal:
    value: Any  # None is Go's nil
    pos: Pos


@dataclass(frozen=True)
class Paren:
    pipe: Pipe
    chain: tuple[str, ...]
    pos: Pos


Arg = Union[Field, Variable, Dot, Ident, Literal, Paren]


@dataclass(frozen=True)
class Command:
    args: tuple[Arg, ...]
    pos: Pos


@dataclass(frozen=True)
class Pipe:
    decl: tuple[str, ...]
    is_assign: bool
    cmds: tuple[Command, ...]
    pos: Pos


@dataclass(frozen=True)
class Action:
    pipe: Pipe


@dataclass(frozen=True)
class If:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class With:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class Range:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class Break:
    pos: Pos


@dataclass(frozen=True)
class Continue:
    pos: Pos


Node = Union[Text, Action, If, With, Range, Break, Continue]

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
    grammar = Path(__file__).with_name("gotemplate.lark").read_text(encoding="utf-8")
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


# ---------------------------------------------------------------------------------------------------
# Values: truth, printing (fmt), JSON (encoding/json)


def is_true(value: Any) -> bool:
    """Go's template truth: false, 0, nil, empty string/slice/map and no value are false."""
    if value is None or value is MISSING:
        return False
    if isinstance(value, (bool, int, float, complex)):
        return value != 0
    if isinstance(value, (str, bytes, Sequence, Mapping)):
        return len(value) > 0
    return True  # structs and other objects


def go_type_name(value: Any) -> str:
    if value is None or value is MISSING:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, GoStruct):
        return value.type_name
    if isinstance(value, (bytes, bytearray)):
        return "[]uint8"
    if isinstance(value, Mapping):
        return "map[string]interface {}"
    if isinstance(value, Sequence):
        return "[]interface {}"
    return type(value).__name__


def _float_digits(f: float) -> tuple[str, int]:
    """Shortest round-trip digits of |f| and the decimal point position: |f| == 0.DIGITS * 10**dp."""
    if f == 0:
        return "0", 1
    _sign, digits, exponent = Decimal(repr(abs(f))).as_tuple()
    text = "".join(map(str, digits))
    dp = len(text) + int(exponent)
    stripped = text.lstrip("0")
    dp -= len(text) - len(stripped)
    return stripped.rstrip("0") or "0", dp


def _digits_e(digits: str, dp: int) -> str:
    exp = dp - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _digits_f(digits: str, dp: int) -> str:
    if dp <= 0:
        return "0." + "0" * -dp + digits
    if dp >= len(digits):
        return digits + "0" * (dp - len(digits))
    return digits[:dp] + "." + digits[dp:]


def _special_float(f: float) -> str | None:
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return None


def _format_float_g(f: float) -> str:
    """Go's %v / %g for a float64: shortest round-trip digits, exponent form when exp < -4 or exp >= 6.

    strconv uses precision 6 for the %e decision when printing the shortest representation, so
    1e+06 and 1.234567e+06 print in exponent form while 123456 does not.
    """
    special = _special_float(f)
    if special is not None:
        return special
    digits, dp = _float_digits(f)
    sign = "-" if math.copysign(1.0, f) < 0 else ""
    exp = dp - 1
    if exp < -4 or exp >= 6:
        return sign + _digits_e(digits, dp)
    return sign + _digits_f(digits, dp)


def _sorted_items(mapping: Mapping) -> list[tuple[Any, Any]]:
    """Map entries in Go's fmt/range order: keys sorted (numbers numerically, strings bytewise)."""
    try:
        keys = sorted(mapping)
    except TypeError:
        keys = sorted(mapping, key=lambda k: (type(k).__name__, str(k)))
    return [(k, mapping[k]) for k in keys]


def format_value(value: Any, nested: bool = False) -> str:
    """Go's fmt %v, as used to print an action's value; String() methods are honoured via __go_str__."""
    if value is MISSING:
        return "<nil>" if nested else ""
    if value is None:
        return "<nil>"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _format_float_g(value)
    stringer = getattr(value, "__go_str__", None)
    if stringer is not None:
        return stringer()
    if isinstance(value, Mapping):
        inner = " ".join(f"{format_value(k, True)}:{format_value(v, True)}" for k, v in _sorted_items(value))
        return f"map[{inner}]"
    if isinstance(value, (bytes, bytearray)):
        return "[" + " ".join(str(b) for b in value) + "]"
    if isinstance(value, Sequence):
        return "[" + " ".join(format_value(v, True) for v in value) + "]"
    return str(value)


_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    "<": "\\u003c",  # encoding/json escapes HTML-significant characters by default
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_JSON_SPECIAL = re.compile('[\\x00-\\x1f"\\\\<>&\u2028\u2029\ud800-\udfff]')


def _json_string(s: str) -> str:
    def esc(m: re.Match) -> str:
        ch = m.group()
        if ch in _JSON_ESCAPES:
            return _JSON_ESCAPES[ch]
        if "\ud800" <= ch <= "\udfff":
            return "\\ufffd"  # invalid UTF-8 becomes U+FFFD
        return f"\\u{ord(ch):04x}"

    return '"' + _JSON_SPECIAL.sub(esc, s) + '"'


def _json_float(f: float) -> str:
    if math.isnan(f) or math.isinf(f):
        raise TemplateError(f"json: unsupported value: {_special_float(f)}")
    digits, dp = _float_digits(f)
    sign = "-" if f < 0 else ""
    if f != 0 and (abs(f) < 1e-6 or abs(f) >= 1e21):
        text = _digits_e(digits, dp)
        text = re.sub(r"e([+-])0(\d)$", r"e\1\2", text)  # Go cleans e-07 to e-7
        return sign + text
    return sign + _digits_f(digits, dp)


def _json_encode(value: Any, out: list[str]) -> None:
    hook = getattr(value, "__go_json__", None)
    if hook is not None:
        value = hook()
    if value is None or value is MISSING:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_json_float(value))
    elif isinstance(value, str):
        out.append(_json_string(value))
    elif isinstance(value, (bytes, bytearray)):
        out.append(_json_string(base64.b64encode(bytes(value)).decode()))
    elif isinstance(value, Mapping):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(_json_string(str(k)))
            out.append(":")
            _json_encode(v, out)
        out.append("}")
    elif isinstance(value, Sequence):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _json_encode(v, out)
        out.append("]")
    else:
        raise TemplateError(f"json: unsupported type: {type(value).__name__}")


def go_json(value: Any) -> str:
    """encoding/json.Marshal: compact, HTML-escaped, Go float formatting, insertion-ordered maps."""
    out: list[str] = []
    _json_encode(value, out)
    return "".join(out)


def _quote(s: str, quote: str = '"') -> str:
    """strconv.Quote (or QuoteRune with quote="'")."""
    out = [quote]
    for ch in s:
        code = ord(ch)
        if ch == quote or ch == "\\":
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(ch)])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")
        elif code < 0x80 or ch.isprintable():
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append(quote)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------
# printf


_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d*))?(.?)", re.S)


def _bad_verb(verb: str, arg: Any) -> str:
    if arg is None or arg is MISSING:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({go_type_name(arg)}={format_value(arg, True)})"


def _pad(s: str, width: int | None, left: bool, zero: bool) -> str:
    if width is None or len(s) >= width:
        return s
    if left:
        return s + " " * (width - len(s))
    if zero:
        sign = s[0] if s[:1] in ("-", "+", " ") else ""
        body = s[len(sign) :]
        return sign + "0" * (width - len(s)) + body
    return " " * (width - len(s)) + s


def _signed(body: str, negative: bool, plus: bool, space: bool) -> str:
    if negative:
        return "-" + body
    if plus:
        return "+" + body
    if space:
        return " " + body
    return body


def _format_int(verb: str, n: int, flags: str, prec: int | None) -> str | None:
    sharp = "#" in flags
    digits = {
        "d": lambda v: str(v),
        "b": lambda v: format(v, "b"),
        "o": lambda v: format(v, "o"),
        "O": lambda v: format(v, "o"),
        "x": lambda v: format(v, "x"),
        "X": lambda v: format(v, "X"),
    }
    if verb in digits:
        body = digits[verb](abs(n))
        if prec is not None:
            body = body.zfill(prec) if not (prec == 0 and n == 0) else ""
        if verb == "O":
            body = "0o" + body
        elif sharp and verb in "xX":
            body = ("0x" if verb == "x" else "0X") + body
        elif sharp and verb == "o" and not body.startswith("0"):
            body = "0" + body
        elif sharp and verb == "b":
            body = "0b" + body
        return _signed(body, n < 0, "+" in flags, " " in flags)
    if verb == "c":
        return chr(n) if 0 <= n <= 0x10FFFF else "\ufffd"
    if verb == "q":
        return _quote(chr(n) if 0 <= n <= 0x10FFFF else "\ufffd", "'")
    if verb == "U":
        return f"U+{n:04X}"
    return None


def _format_float(verb: str, f: float, flags: str, prec: int | None) -> str | None:
    if verb not in "eEfFgGv":
        return None
    if math.isnan(f):  # fmt drops NaN's sign unless + or space was asked for
        return _signed("NaN", False, "+" in flags, " " in flags)
    negative = math.copysign(1.0, f) < 0
    if math.isinf(f):  # fmt always shows the sign of an infinity
        return "-Inf" if negative else (" Inf" if " " in flags and "+" not in flags else "+Inf")
    a = abs(f)
    if verb in "gGv" and prec is None:
        body = _format_float_g(a)
        if verb == "G":
            body = body.upper()
    else:
        py_verb = {"v": "g", "F": "f"}.get(verb, verb)
        p = prec if prec is not None else 6
        body = format(a, f".{p}{py_verb}")
    return _signed(body, negative, "+" in flags, " " in flags)


def _format_verb(verb: str, flags: str, width: int | None, prec: int | None, arg: Any) -> str:
    left = "-" in flags
    zero = "0" in flags and not left
    numeric = False
    if verb == "T":
        s: str | None = go_type_name(arg)
    elif verb == "v" and isinstance(arg, float):
        s, numeric = _format_float("v", arg, flags, prec), True
    elif verb == "v" and isinstance(arg, int) and not isinstance(arg, bool):
        s, numeric = _signed(str(abs(arg)), arg < 0, "+" in flags, " " in flags), True
    elif verb == "v":
        s = format_value(arg)
    elif arg is None or arg is MISSING:
        s = _bad_verb(verb, arg)
    elif isinstance(arg, bool):
        s = ("true" if arg else "false") if verb == "t" else _bad_verb(verb, arg)
    elif isinstance(arg, int):
        s = _format_int(verb, arg, flags, prec)
        numeric = verb in "dboOxX"
        if s is None:
            s = _bad_verb(verb, arg)
    elif isinstance(arg, float):
        s = _format_float(verb, arg, flags, prec)
        numeric = s is not None
        if s is None:
            s = _bad_verb(verb, arg)
    elif isinstance(arg, str) or hasattr(arg, "__go_str__") and verb in "sqxX":
        text = arg if isinstance(arg, str) else format_value(arg)
        if verb == "s":
            s = text if prec is None else text[:prec]
        elif verb == "q":
            s = _quote(text if prec is None else text[:prec])
        elif verb in "xX":
            raw = text.encode()
            s = raw.hex() if verb == "x" else raw.hex().upper()
            if "#" in flags:
                s = ("0x" if verb == "x" else "0X") + s
        else:
            s = _bad_verb(verb, arg)
    elif isinstance(arg, Sequence) and not isinstance(arg, (bytes, bytearray)):
        s = "[" + " ".join(_format_verb(verb, flags, None, prec, v) for v in arg) + "]"
    elif verb == "s":
        s = format_value(arg)
    else:
        s = _bad_verb(verb, arg)
    return _pad(s, width, left, zero and numeric)


def go_sprintf(fmt: str, *args: Any) -> str:
    """fmt.Sprintf for the common verbs (%v %s %d %q %t %f %e %g %x %X %c %b %o %U %T %%), flags, width, precision."""
    out: list[str] = []
    argi = 0
    i = 0
    while True:
        j = fmt.find("%", i)
        if j < 0:
            out.append(fmt[i:])
            break
        out.append(fmt[i:j])
        m = _VERB.match(fmt, j)
        assert m is not None  # the pattern matches any "%..." prefix
        flags, width_s, prec_s, verb = m.groups()
        i = m.end()
        if verb == "":
            out.append("%!(NOVERB)")
            break
        if verb == "%":
            out.append("%")
            continue
        width: int | None = None
        prec: int | None = None
        if width_s == "*":
            if argi < len(args) and isinstance(args[argi], int):
                width = args[argi]
                if width < 0:
                    flags, width = flags + "-", -width
            else:
                out.append("%!(BADWIDTH)")
            argi += 1
        elif width_s:
            width = int(width_s)
        if prec_s == "*":
            if argi < len(args) and isinstance(args[argi], int) and args[argi] >= 0:
                prec = args[argi]
            else:
                out.append("%!(BADPREC)")
            argi += 1
        elif prec_s is not None:
            prec = int(prec_s) if prec_s else 0
        if argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        out.append(_format_verb(verb, flags, width, prec, args[argi]))
        argi += 1
    if argi < len(args):
        extra = ", ".join(f"{go_type_name(a)}={format_value(a, True)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


# ---------------------------------------------------------------------------------------------------
# Builtin functions (text/template's plus Ollama's json and currentDate)


def _go_sprint(*args: Any) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out: list[str] = []
    prev_string = False
    for i, a in enumerate(args):
        is_string = isinstance(a, str)
        if i and not is_string and not prev_string:
            out.append(" ")
        out.append(format_value(a))
        prev_string = is_string
    return "".join(out)


def _go_sprintln(*args: Any) -> str:
    return " ".join(format_value(a) for a in args) + "\n"


def _eval_args(args: tuple[Any, ...]) -> str:
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    return _go_sprint(*args)


def _basic_kind(v: Any) -> str:
    if v is None or v is MISSING:
        return "nil"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, complex):
        return "complex"
    if isinstance(v, str):
        return "string"
    return "other"


def _eq(arg1: Any, *arg2: Any) -> bool:
    """eq a b c == (a == b || a == c); basic kinds must match (Go errors on eq 1 "1")."""
    if not arg2:
        raise TemplateError("missing argument for comparison")
    k1 = _basic_kind(arg1)
    for arg in arg2:
        k2 = _basic_kind(arg)
        if k1 == "nil" or k2 == "nil":
            truth = k1 == k2
        elif k1 != k2:
            raise TemplateError("incompatible types for comparison")
        elif k1 == "other":
            if isinstance(arg1, (Mapping, list)) or isinstance(arg, (Mapping, list)):
                raise TemplateError(f"non-comparable type {go_type_name(arg1)}")
            truth = arg1 is arg or arg1 == arg
        else:
            truth = arg1 == arg
        if truth:
            return True
    return False


def _ne(a: Any, b: Any) -> bool:
    return not _eq(a, b)


def _ordered(a: Any, b: Any) -> None:
    k1, k2 = _basic_kind(a), _basic_kind(b)
    if k1 not in ("int", "float", "string") or k2 not in ("int", "float", "string"):
        raise TemplateError("invalid type for comparison")
    if k1 != k2:
        raise TemplateError("incompatible types for comparison")


def _lt(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return a < b


def _le(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return a <= b


def _gt(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return a > b


def _ge(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return a >= b


def _and(first: Any, *rest: Any) -> Any:
    """Eager form; the executor short-circuits calls to it (Go 1.18+)."""
    for v in (first, *rest):
        if not is_true(v):
            return v
    return (first, *rest)[-1]


def _or(first: Any, *rest: Any) -> Any:
    for v in (first, *rest):
        if is_true(v):
            return v
    return (first, *rest)[-1]


def _not(a: Any) -> bool:
    return not is_true(a)


def _len(a: Any) -> int:
    if a is None or a is MISSING:
        return 0  # Go fails on nil; a missing field reads as an empty value here
    if isinstance(a, str):
        return len(a.encode())  # Go's len of a string counts bytes
    if isinstance(a, (bytes, bytearray, Sequence, Mapping)):
        return len(a)
    raise TemplateError(f"len of type {go_type_name(a)}")


def _slice_index(ix: Any, size: int) -> int:
    if isinstance(ix, bool) or not isinstance(ix, int):
        raise TemplateError(f"cannot index slice/array with type {go_type_name(ix)}")
    if ix < 0 or ix > size:
        raise TemplateError(f"index out of range: {ix}")
    return ix


def _index(item: Any, *indexes: Any) -> Any:
    value = item
    for ix in indexes:
        if value is None or value is MISSING:
            raise TemplateError("index of untyped nil")
        if isinstance(value, Mapping):
            value = value.get(ix, MISSING)
            continue
        if isinstance(value, str):
            value = value.encode()  # Go indexes strings by byte
        if isinstance(value, (bytes, bytearray, Sequence)):
            if isinstance(ix, bool) or not isinstance(ix, int):
                raise TemplateError(f"cannot index slice/array with type {go_type_name(ix)}")
            if not 0 <= ix < len(value):
                raise TemplateError(f"index out of range: {ix}")
            value = value[ix]
            continue
        raise TemplateError(f"can't index item of type {go_type_name(value)}")
    return value


def _slice(item: Any, *indexes: Any) -> Any:
    if item is None or item is MISSING:
        raise TemplateError("slice of untyped nil")
    if len(indexes) > 3:
        raise TemplateError(f"too many slice indexes: {len(indexes)}")
    is_string = isinstance(item, str)
    if is_string and len(indexes) == 3:
        raise TemplateError("cannot 3-index slice a string")
    seq = item.encode() if is_string else item
    if not isinstance(seq, (bytes, bytearray, Sequence)):
        raise TemplateError(f"can't slice item of type {go_type_name(item)}")
    size = len(seq)
    bounds = [_slice_index(ix, size) for ix in indexes]
    i = bounds[0] if len(bounds) > 0 else 0
    j = bounds[1] if len(bounds) > 1 else size
    if len(bounds) == 3 and not (j <= bounds[2] <= size):
        raise TemplateError(f"invalid slice index: {j} > {bounds[2]}")
    if i > j:
        raise TemplateError(f"invalid slice index: {i} > {j}")
    part = seq[i:j]
    return part.decode("utf-8", errors="replace") if is_string else part


def _html(*args: Any) -> str:
    s = _eval_args(args)
    return (
        s.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&#34;")
        .replace("'", "&#39;")
        .replace("\0", "\ufffd")
    )


_JS_ESCAPES = {"\\": "\\\\", "'": "\\'", '"': '\\"', "<": "\\u003C", ">": "\\u003E", "&": "\\u0026", "=": "\\u003D"}


def _js(*args: Any) -> str:
    out = []
    for ch in _eval_args(args):
        code = ord(ch)
        if ch in _JS_ESCAPES:
            out.append(_JS_ESCAPES[ch])
        elif code < 0x20:
            out.append(f"\\u00{code:02X}")
        elif code >= 0x80 and not ch.isprintable():
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    return "".join(out)


def _urlquery(*args: Any) -> str:
    return quote_plus(_eval_args(args), safe="")


def _json_func(value: Any) -> str:
    # Ollama: `b, _ := json.Marshal(v); return string(b)` -- an unencodable value renders as "".
    try:
        return go_json(value)
    except TemplateError:
        return ""


def _current_date(today: datetime.date | None, *_args: str) -> str:
    # Ollama's currentDate takes optional (ignored) string args and formats time.Now() as 2006-01-02.
    return (today or datetime.date.today()).strftime("%Y-%m-%d")


def _builtins(today: datetime.date | None) -> dict[str, Callable[..., Any]]:
    return {
        "and": _and,
        "or": _or,
        "not": _not,
        "eq": _eq,
        "ne": _ne,
        "lt": _lt,
        "le": _le,
        "gt": _gt,
        "ge": _ge,
        "len": _len,
        "index": _index,
        "slice": _slice,
        "print": _go_sprint,
        "printf": go_sprintf,
        "println": _go_sprintln,
        "html": _html,
        "js": _js,
        "urlquery": _urlquery,
        "json": _json_func,
        "currentDate": functools.partial(_current_date, today),
    }


BUILTIN_FUNCS: frozenset[str] = frozenset(_builtins(None))

# ---------------------------------------------------------------------------------------------------
# Execution


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_NO_FINAL: Any = object()  # "no piped value": distinct from every template value, including nil


class _Exec:
    """One execution: the variable stack (Go's s.vars, with mark/pop per control structure) and output."""

    def __init__(self, funcs: Mapping[str, Callable[..., Any]], root: Any):
        self.funcs = funcs
        self.vars: list[list[Any]] = [["$", root]]
        self.out: list[str] = []
        self._arity: dict[str, inspect.Signature] = {}

    # -- statements --
    def walk(self, dot: Any, nodes: Sequence[Node]) -> None:
        for node in nodes:
            kind = type(node)
            if kind is Text:
                self.out.append(node.text)
            elif kind is Action:
                value = self.pipeline(dot, node.pipe)
                if not node.pipe.decl:
                    self.out.append(format_value(value))
            elif kind is If or kind is With:
                mark = len(self.vars)
                value = self.pipeline(dot, node.pipe)
                if is_true(value):
                    self.walk(value if kind is With else dot, node.body)
                elif node.else_body is not None:
                    self.walk(dot, node.else_body)
                del self.vars[mark:]
            elif kind is Range:
                self.range(dot, node)
            elif kind is Break:
                raise _Break
            elif kind is Continue:
                raise _Continue

    def range(self, dot: Any, node: Range) -> None:
        mark = len(self.vars)
        value = self.pipeline(dot, node.pipe)
        top = len(self.vars)
        decl = node.pipe.decl
        items = self.iteration(value, len(decl), node.pipe.pos)
        if items:
            for index, elem in items:
                inner = len(self.vars)
                if decl and node.pipe.is_assign:
                    if len(decl) > 1:
                        self.set_var(decl[0], index, node.pipe.pos)
                        self.set_var(decl[1], elem, node.pipe.pos)
                    else:
                        self.set_var(decl[0], elem, node.pipe.pos)
                elif decl:
                    self.vars[top - 1][1] = elem  # the last declared variable gets the element
                    if len(decl) > 1:
                        self.vars[top - 2][1] = index
                try:
                    self.walk(elem, node.body)
                except _Break:
                    break
                except _Continue:
                    pass
                finally:
                    del self.vars[inner:]
        elif node.else_body is not None:
            self.walk(dot, node.else_body)
        del self.vars[mark:]

    @staticmethod
    def iteration(value: Any, n_decl: int, pos: Pos) -> list[tuple[Any, Any]]:
        if value is None or value is MISSING:
            return []
        if isinstance(value, bool) or isinstance(value, (str, float)) or isinstance(value, GoStruct):
            raise TemplateError(f"range can't iterate over {format_value(value)}", *pos)
        if isinstance(value, int):  # Go 1.22: range over an integer
            if n_decl > 1:
                raise TemplateError(f"can't use {value} to iterate over more than one variable", *pos)
            return [(i, i) for i in range(value)]
        if isinstance(value, Mapping):
            return _sorted_items(value)
        if isinstance(value, (Sequence, bytes, bytearray)):
            return list(enumerate(value))
        raise TemplateError(f"range can't iterate over {format_value(value)}", *pos)

    # -- variables --
    def var(self, name: str, pos: Pos) -> Any:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                return self.vars[i][1]
        raise TemplateError(f"undefined variable: {name}", *pos)

    def set_var(self, name: str, value: Any, pos: Pos) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i][1] = value
                return
        raise TemplateError(f"undefined variable: {name}", *pos)

    # -- expressions --
    def pipeline(self, dot: Any, pipe: Pipe) -> Any:
        value = _NO_FINAL
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value)
        for name in pipe.decl:
            if pipe.is_assign:
                self.set_var(name, value, pipe.pos)
            else:
                self.vars.append([name, value])
        return value

    def command(self, dot: Any, cmd: Command, final: Any) -> Any:
        first, rest = cmd.args[0], cmd.args[1:]
        kind = type(first)
        if kind is Field:
            return self.field_chain(dot, dot, first.chain, rest, final, first.pos)
        if kind is Variable:
            value = self.var(first.name, first.pos)
            if not first.chain:
                self.not_a_function(cmd, final)
                return value
            return self.field_chain(dot, value, first.chain, rest, final, first.pos)
        if kind is Ident:
            return self.call(dot, first.name, rest, final, first.pos)
        if kind is Paren:
            if not first.chain:
                self.not_a_function(cmd, final)
                return self.pipeline(dot, first.pipe)
            value = self.pipeline(dot, first.pipe)
            return self.field_chain(dot, value, first.chain, rest, final, first.pos)
        self.not_a_function(cmd, final)
        if kind is Dot:
            return dot
        if first.value is None:
            raise TemplateError("nil is not a command", *first.pos)
        return first.value

    @staticmethod
    def not_a_function(cmd: Command, final: Any) -> None:
        if len(cmd.args) > 1 or final is not _NO_FINAL:
            raise TemplateError("can't give argument to non-function", *cmd.pos)

    def arg(self, dot: Any, node: Arg) -> Any:
        kind = type(node)
        if kind is Field:
            return self.field_chain(dot, dot, node.chain, (), _NO_FINAL, node.pos)
        if kind is Variable:
            value = self.var(node.name, node.pos)
            return self.field_chain(dot, value, node.chain, (), _NO_FINAL, node.pos) if node.chain else value
        if kind is Dot:
            return dot
        if kind is Ident:
            return self.call(dot, node.name, (), _NO_FINAL, node.pos)
        if kind is Paren:
            value = self.pipeline(dot, node.pipe)
            return self.field_chain(dot, value, node.chain, (), _NO_FINAL, node.pos) if node.chain else value
        return node.value

    def field_chain(
        self, dot: Any, receiver: Any, chain: tuple[str, ...], args: tuple[Arg, ...], final: Any, pos: Pos
    ) -> Any:
        for name in chain[:-1]:
            receiver = self.field(dot, receiver, name, (), _NO_FINAL, pos)
        return self.field(dot, receiver, chain[-1], args, final, pos)

    def field(self, dot: Any, receiver: Any, name: str, args: tuple[Arg, ...], final: Any, pos: Pos) -> Any:
        has_args = bool(args) or final is not _NO_FINAL
        if receiver is None or receiver is MISSING:
            value = MISSING
        elif isinstance(receiver, GoStruct):
            value = receiver.field(name)
        elif isinstance(receiver, Mapping):
            value = receiver.get(name, MISSING)
        elif isinstance(receiver, (str, bytes, bool, int, float, complex, Sequence)):
            raise TemplateError(f"can't evaluate field {name} in type {go_type_name(receiver)}", *pos)
        else:
            value = MISSING if name.startswith("_") else getattr(receiver, name, MISSING)
            if inspect.ismethod(value):  # a method: Go calls it, with the command's arguments
                argv = [self.arg(dot, a) for a in args] + ([] if final is _NO_FINAL else [final])
                return self.invoke(name, value, argv, pos)
        if has_args:
            raise TemplateError(f"{name} has arguments but cannot be invoked as function", *pos)
        return value

    def call(self, dot: Any, name: str, arg_nodes: tuple[Arg, ...], final: Any, pos: Pos) -> Any:
        fn = self.funcs.get(name)
        if fn is None:
            raise TemplateError(f'function "{name}" not defined', *pos)
        if fn is _and or fn is _or:
            return self.short_circuit(dot, fn is _or, name, arg_nodes, final, pos)
        argv = [self.arg(dot, a) for a in arg_nodes]
        if final is not _NO_FINAL:
            argv.append(final)
        return self.invoke(name, fn, argv, pos)

    def short_circuit(
        self, dot: Any, want: bool, name: str, arg_nodes: tuple[Arg, ...], final: Any, pos: Pos
    ) -> Any:
        # Go 1.18+: arguments are evaluated left to right only until the result is known, and the
        # deciding value itself (not a bool) is returned.
        thunks: list[Callable[[], Any]] = [lambda a=a: self.arg(dot, a) for a in arg_nodes]
        if final is not _NO_FINAL:
            thunks.append(lambda: final)
        if not thunks:
            raise TemplateError(f"wrong number of args for {name}: want at least 1 got 0", *pos)
        value = None
        for thunk in thunks:
            value = thunk()
            if is_true(value) == want:
                return value
        return value

    def invoke(self, name: str, fn: Callable[..., Any], argv: list[Any], pos: Pos) -> Any:
        sig = self._arity.get(name)
        if sig is None:
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                sig = None
            if sig is not None:
                self._arity[name] = sig
        if sig is not None:
            try:
                sig.bind(*argv)
            except TypeError:
                raise TemplateError(f"wrong number of args for {name}: got {len(argv)}", *pos) from None
        try:
            return fn(*argv)
        except (_Break, _Continue):
            raise
        except TemplateError as err:
            raise TemplateError(f"error calling {name}: {err.reason}", *pos) from None
        except Exception as err:  # a custom func failing is an execution error, as in Go
            raise TemplateError(f"error calling {name}: {err}", *pos) from err


# ---------------------------------------------------------------------------------------------------
# Tree queries and the two rewrites Ollama applies to templates


def _pipe_args(pipe: Pipe) -> Iterator[Arg]:
    for cmd in pipe.cmds:
        for arg in cmd.args:
            yield arg
            if isinstance(arg, Paren):
                yield from _pipe_args(arg.pipe)


def _identifiers(nodes: Sequence[Node]) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, Text) or isinstance(node, (Break, Continue)):
            continue
        for arg in _pipe_args(node.pipe):
            if isinstance(arg, (Field, Variable, Paren)):
                yield from arg.chain
        if isinstance(node, (If, With, Range)):
            yield from _identifiers(node.body)
            if node.else_body is not None:
                yield from _identifiers(node.else_body)


def _cut_after(nodes: tuple[Node, ...], name: str) -> tuple[Node, ...]:
    """Ollama's deleteNode: keep everything up to and including the first `.<name>` field, drop the rest.

    Walk order and granularity follow Ollama (template.go): conditions of if/with/range are not
    searched, and once the field is seen every later node is deleted, wherever it sits.
    """
    cut = False

    def walk_arg(arg: Arg) -> Arg | None:
        nonlocal cut
        if cut:
            return None
        if isinstance(arg, Field) and name in arg.chain:
            cut = True
            return arg
        if isinstance(arg, Paren):
            pipe = walk_pipe(arg.pipe)
            return None if pipe is None else replace(arg, pipe=pipe)
        return arg

    def walk_pipe(pipe: Pipe) -> Pipe | None:
        if cut:
            return None
        cmds = []
        for cmd in pipe.cmds:
            args = tuple(a for a in map(walk_arg, cmd.args) if a is not None)
            if not args:
                return None
            cmds.append(replace(cmd, args=args))
        return replace(pipe, cmds=tuple(cmds))

    def walk(node: Node) -> Node | None:
        if cut:
            return None
        if isinstance(node, Action):
            pipe = walk_pipe(node.pipe)
            return None if pipe is None else Action(pipe)
        if isinstance(node, (If, With, Range)):
            body = walk_list(node.body)
            else_body = None if node.else_body is None else walk_list(node.else_body)
            return replace(node, body=body, else_body=else_body)
        return node

    def walk_list(items: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(n for n in map(walk, items) if n is not None)

    return walk_list(nodes)


@dataclass(frozen=True, eq=False)
class GoTemplate:
    """A parsed template.  Immutable: the rewrites return new templates."""

    source: str
    root: tuple[Node, ...]
    funcs: Mapping[str, Callable[..., Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, *, funcs: Mapping[str, Callable[..., Any]] | None = None) -> GoTemplate:
        """Parse `text`; `funcs` adds (or overrides) template functions, as Go's Template.Funcs does."""
        extra = dict(funcs or {})
        return cls(text, _parse_nodes(text, BUILTIN_FUNCS | frozenset(extra)), extra)

    def execute(self, data: Any, *, today: datetime.date | None = None) -> str:
        """Render with `data` as both dot and `$`; `today` fixes what currentDate returns."""
        funcs = {**_builtins(today), **self.funcs}
        ex = _Exec(funcs, data)
        try:
            ex.walk(data, self.root)
        except RecursionError:
            raise TemplateError("template nesting too deep") from None
        return "".join(ex.out)

    @functools.cached_property
    def _vars(self) -> frozenset[str]:
        return frozenset(name.lower() for name in _identifiers(self.root))

    def vars(self) -> set[str]:
        """Lower-cased field names the template mentions (Ollama's Template.Vars), e.g. {"messages", "role"}."""
        return set(self._vars)

    def has_field(self, name: str) -> bool:
        return name.lower() in self._vars

    def truncated_after_field(self, name: str) -> GoTemplate:
        """The template cut right after the first `.<name>` (Ollama renders a legacy final turn this way)."""
        return replace(self, root=_cut_after(self.root, name))

    def with_appended_field(self, name: str) -> GoTemplate:
        """The template with `{{ .<name> }}` appended (Ollama's Parse does this for .Response)."""
        pipe = Pipe((), False, (Command((Field((name,), (0, 0)),), (0, 0)),), (0, 0))
        return replace(self, root=self.root + (Action(pipe),))


def parse_template(text: str, *, funcs: Mapping[str, Callable[..., Any]] | None = None) -> GoTemplate:
    """Parse a TEMPLATE; raises TemplateError (Ollama's create answers 400 with it)."""
    return GoTemplate.parse(text, funcs=funcs)
