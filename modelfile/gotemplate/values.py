"""Go value semantics for templates: truth, type names, fmt printing, encoding/json, strconv quoting, printf.

Values the template sees: dicts (map lookups), GoStruct (a struct with named fields, optional String()
and JSON form), StringerMap (a map whose String() is its JSON), lists/tuples, str/int/float/bool/None.
Other Python objects expose their public attributes as fields and public methods as callable fields.
A missing field or map key evaluates to "no value" (MISSING).
"""

from __future__ import annotations

import base64
import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


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
