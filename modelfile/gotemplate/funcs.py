"""The builtin template functions: text/template's (and, or, eq, index, slice, printf, html, ...) plus Ollama's
json and currentDate."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote_plus

from .values import MISSING, TemplateError, format_value, go_json, go_sprintf, go_type_name, is_true

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
