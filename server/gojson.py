"""Go-compatible JSON at the API boundary: request decoding with Go's error messages, typed fields,
RFC3339Nano times and compact JSON responses, so clients see the same texts Ollama's server gives."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import field
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from fastapi import Request
from fastapi.responses import Response

from server.text.json_scan import JsonScan


#: What a client is told about a failure the server did not expect (the details are logged).
INTERNAL_ERROR = "internal server error (see the server log)"


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with ``status`` (OpenAI routes reshape it)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def go_json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _decoder_message(doc: str, err: json.JSONDecodeError) -> str:
    """Go's encoding/json syntax error text for the same input (close enough for clients to match)."""
    pos = err.pos
    if pos >= len(doc.rstrip()):
        return "unexpected EOF"
    ch = doc[pos]
    shown = repr(ch)[1:-1] if ch != "'" else "\\'"
    if err.msg.startswith("Extra data"):
        return f"invalid character '{shown}' after top-level value"
    if err.msg.startswith("Expecting property name"):
        return f"invalid character '{shown}' looking for beginning of object key string"
    if err.msg.startswith("Expecting ':'"):
        return f"invalid character '{shown}' after object key"
    if err.msg.startswith("Expecting ','"):
        inside = "object key:value pair" if _innermost(doc, pos) == "{" else "array element"
        return f"invalid character '{shown}' after {inside}"
    if err.msg.startswith("Invalid control character"):
        return f"invalid character '{shown}' in string literal"
    if err.msg.startswith("Invalid \\escape") or err.msg.startswith("Invalid \\u"):
        return f"invalid character '{shown}' in string escape code"
    return f"invalid character '{shown}' looking for beginning of value"


def _innermost(doc: str, pos: int) -> str:
    """The container the text before ``pos`` leaves open ("{", "[" or "")."""
    scan = JsonScan()
    while scan.scan(doc, pos) >= 0:  # a value that closed before pos: go on with what follows
        pass
    return scan.innermost


#: How deeply a request body may nest. Go allows 10,000 levels; Python's decoder and the recursive
#: code after it (schemas, templates, the JSON encoder) hit the interpreter's recursion limit near
#: 1,000, so a body is refused well below that, where no real request ever nests.
MAX_BODY_DEPTH = 128

_CONSTANT_ERRORS = {"NaN": "invalid character 'N' looking for beginning of value",
                    "Infinity": "invalid character 'I' looking for beginning of value",
                    "-Infinity": "invalid character 'I' in numeric literal"}


class _BodyError(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _BodyError(_CONSTANT_ERRORS.get(name, "invalid character in numeric literal"))


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # Go: out of float64 range is a decode error, not Inf
        raise _BodyError(f"json: cannot unmarshal number {text} into Go value of type float64")
    return value


def decode_body(text: str) -> Any:
    """Decode a request body as Go's encoding/json would accept it: no NaN/Infinity literals, no
    number beyond float64, nesting bounded (:data:`MAX_BODY_DEPTH`) and no unpaired UTF-16
    surrogate in any string, each a 400 with a message, so that nothing later can fail on them with
    an internal error."""
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise ApiError(400, _decoder_message(text, e)) from None
    except _BodyError as e:
        raise ApiError(400, str(e)) from None
    except RecursionError:
        raise ApiError(400, f"request body nested too deeply (more than {MAX_BODY_DEPTH} levels)") from None
    except ValueError:  # an integer literal longer than Python converts (sys.get_int_max_str_digits)
        raise ApiError(400, "invalid number in request body: too many digits") from None
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, (list, dict)):
            if depth >= MAX_BODY_DEPTH:
                raise ApiError(400, f"request body nested too deeply (more than {MAX_BODY_DEPTH} levels)")
            if isinstance(value, dict):
                for key in value:
                    _check_text(key)
                stack.extend((v, depth + 1) for v in value.values())
            else:
                stack.extend((v, depth + 1) for v in value)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        raise ApiError(400, f"invalid string in request body: unpaired surrogate \\u{ord(bad):04x}") from None


async def read_json(request: Request, go_type: str) -> dict[str, Any]:
    """The request body as a JSON object: 400 `missing request body` when empty, Go's decoder text
    when malformed or not an object."""
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "missing request body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid character in request body: not UTF-8") from None
    body = decode_body(text)
    if not isinstance(body, dict):
        raise ApiError(400, f"json: cannot unmarshal {go_json_kind(body)} into Go value of type {go_type}")
    return body


def jfield(go: str, default: Any = None, *, json_name: str | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A request field: its Go type (for decoding and error texts) and JSON name (if not the field name)."""
    meta = {"go": go, "json": json_name}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _check_go(value: Any, go: str) -> bool:
    if go == "any":
        return True
    if go == "string":
        return isinstance(value, str)
    if go in ("bool", "*bool"):
        return isinstance(value, bool)
    if go == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if go == "float64":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if go == "[]int":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if go == "[]string":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if go.startswith("map["):
        return isinstance(value, dict)
    if go.startswith("[]"):
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    raise AssertionError(go)


T = TypeVar("T")


async def read_struct(request: Request, cls: type[T], go_type: str) -> T:
    """A route's request body as dataclass ``cls``, decoded as Go's decoder decodes it into ``go_type``
    (``package.Struct``): ``read_json``'s errors for a missing or malformed body, ``decode_struct``'s for a field."""
    return decode_struct(cls, await read_json(request, go_type), go_type.rpartition(".")[2])


def decode_struct(cls: type, body: dict[str, Any], struct: str) -> Any:
    """Build dataclass ``cls`` from a JSON object like Go's decoder: unknown keys ignored, null = zero
    value, a wrong type = 400 `json: cannot unmarshal X into Go struct field S.f of type T`."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        go = f.metadata.get("go")
        if go is None:
            continue
        key = f.metadata.get("json") or f.name
        if key not in body or body[key] is None:
            continue
        value = body[key]
        if not _check_go(value, go):
            bad = value
            if isinstance(value, list) and go.startswith("[]"):
                elem = go[2:]
                bad = next((v for v in value if not _check_go(v, elem if elem in ("int", "string") else "any")), value)
                go = elem if bad is not value else go
            kind = go_json_kind(bad)
            if kind == "number" and go == "int":
                kind = f"number {bad}"
            raise ApiError(400, f"json: cannot unmarshal {kind} into Go struct field {struct}.{key} of type {go}")
        values[f.name] = value
    return cls(**values)


def rfc3339(t: datetime | None = None) -> str:
    """Go's time.RFC3339Nano: fraction without trailing zeros, `Z` for UTC."""
    if t is None:
        ns = time.time_ns()
        t = datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc)
        frac = f"{ns % 1_000_000_000:09d}".rstrip("0")
    else:
        frac = f"{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    offset = t.utcoffset()
    if offset is None or offset.total_seconds() == 0:
        zone = "Z"
    else:
        minutes = int(offset.total_seconds() // 60)
        sign = "+" if minutes >= 0 else "-"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return f"{base}{'.' + frac if frac else ''}{zone}"


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json_bytes(obj), status_code=status, media_type="application/json; charset=utf-8")
