"""Modelfile parameters: Ollama's ``FormatParams`` for string values, against the option table.

The option table itself (names, types, defaults, value checks) is :class:`engine.contract.options.Options`;
this module keeps what is specific to the Modelfile and Go:

* :func:`format_params` - Ollama's ``api.FormatParams`` for string values (Modelfile
  ``PARAMETER`` lines, ``ollama run``'s ``/set parameter``): Go ``strconv`` parsing.
* :func:`parameters_from_commands` - the PARAMETER part of ``Modelfile.CreateRequest``.
* deprecated parameter names and the command names that are not parameters.

JSON ``options`` (requests, the stored params layer) are parsed by ``engine.contract.options``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from engine.contract.options import (
    INT64_MAX,
    INT64_MIN,
    OPTION_ALIASES,
    OPTION_TYPES,
    ParamError,
    check_range,
    float32,
)

__all__ = [
    "ParamError", "DEPRECATED_PARAMETERS", "COMMAND_NAMES",
    "format_params", "parameters_from_commands",
    "go_parse_int", "go_parse_float", "go_parse_bool",
]


#: Skipped with a warning when they appear as PARAMETER (Ollama's parser.go list).
DEPRECATED_PARAMETERS = ("penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only",
                         "use_mlock", "mirostat", "mirostat_tau", "mirostat_eta")

#: Command names that are not parameters (``Modelfile.CreateRequest``'s switch).
COMMAND_NAMES = frozenset({"model", "draft", "adapter", "template", "system", "license",
                           "renderer", "parser", "requires", "message"})


# --------------------------------------------------------------------------- Go strconv

_INT_RE = re.compile(r"[+-]?[0-9]+")


def go_parse_int(s: str) -> int | None:
    """``strconv.ParseInt(s, 10, 64)``; None on syntax or range error."""
    if not _INT_RE.fullmatch(s):
        return None
    v = int(s)
    return v if INT64_MIN <= v <= INT64_MAX else None


_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def go_parse_bool(s: str) -> bool | None:
    """``strconv.ParseBool``; None on error."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    return None


def _underscore_ok(s: str) -> bool:
    # strconv.underscoreOK: '_' only between digits (or after a base prefix).
    saw = "^"
    i = 0
    if s[:1] in ("+", "-"):
        s = s[1:]
    hexa = False
    if len(s) >= 2 and s[0] == "0" and s[1].lower() in "box":
        i = 2
        saw = "0"
        hexa = s[1].lower() == "x"
    while i < len(s):
        c = s[i]
        if "0" <= c <= "9" or (hexa and "a" <= c.lower() <= "f"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
        i += 1
    return saw != "_"


def _special_float(s: str) -> float | None:
    low = s.lower()
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    if low == "nan":
        return math.nan
    return None


def _read_float_ok(s: str) -> bool:
    # The syntax accepted by strconv.readFloat (decimal or hexadecimal with 'p' exponent).
    n = len(s)
    i = 1 if s[:1] in ("+", "-") else 0
    base, exp_char = 10, "e"
    if i + 2 < n and s[i] == "0" and s[i + 1] in "xX":
        base, exp_char = 16, "p"
        i += 2
    underscores = saw_dot = saw_digits = False
    while i < n:
        c = s[i]
        if c == "_":
            underscores = True
        elif c == ".":
            if saw_dot:
                break
            saw_dot = True
        elif "0" <= c <= "9" or (base == 16 and "a" <= c.lower() <= "f"):
            saw_digits = True
        else:
            break
        i += 1
    if not saw_digits:
        return False
    if i < n and s[i].lower() == exp_char:
        i += 1
        if i < n and s[i] in "+-":
            i += 1
        if i >= n or not "0" <= s[i] <= "9":
            return False
        while i < n and ("0" <= s[i] <= "9" or s[i] == "_"):
            underscores = underscores or s[i] == "_"
            i += 1
    elif base == 16:
        return False  # a hexadecimal mantissa needs a 'p' exponent
    if i != n:
        return False
    return not underscores or _underscore_ok(s)


def go_parse_float(s: str) -> float | None:
    """``strconv.ParseFloat(s, 32)`` as a Python float; None on syntax or range error.

    Accepts decimal and hexadecimal (``0x1.8p3``) forms, ``_`` digit separators,
    ``inf``/``infinity`` (signed) and ``nan`` in any case; rejects spaces, ``1.0f``, ``0x1``.
    """
    if not s:
        return None
    special = _special_float(s)
    if special is not None:
        return special
    if not _read_float_ok(s):
        return None
    clean = s.replace("_", "")
    x = float.fromhex(clean) if "x" in clean.lower() else float(clean)
    if math.isinf(x):
        return None  # ErrRange (e.g. 1e999)
    try:
        return float32(x)
    except OverflowError:
        return None  # ErrRange


# --------------------------------------------------------------------------- one PARAMETER

def _parse_string_value(name: str, raw: str) -> Any:
    kind = OPTION_TYPES[name]
    if kind is int:
        value = go_parse_int(raw)
        if value is None:
            raise ParamError(f"invalid int value [{raw}]")
    elif kind is float:
        value = go_parse_float(raw)
        if value is None:
            raise ParamError(f"invalid float value [{raw}]")
    elif kind is bool:
        value = go_parse_bool(raw)
        if value is None:
            raise ParamError(f"invalid bool value [{raw}]")
    elif kind is str:
        value = raw
    else:  # list[str]
        value = [raw]
    check_range(name, value, raw)
    return value


def _store(out: dict[str, Any], name: str, value: Any) -> None:
    if isinstance(value, list):
        out.setdefault(name, [])
        out[name] = out[name] + value   # stop accumulates
    else:
        out[name] = value               # scalars: last wins


def _add_string_param(out: dict[str, Any], warnings: list[str], name: str, raw: str) -> None:
    if name in DEPRECATED_PARAMETERS:
        warnings.append(f"warning: parameter {name} is deprecated")
        return
    canonical = OPTION_ALIASES.get(name, name)
    if canonical not in OPTION_TYPES:
        raise ParamError(f"unknown parameter '{name}'")
    _store(out, canonical, _parse_string_value(canonical, raw))


# --------------------------------------------------------------------------- API

def format_params(params: Mapping[str, Iterable[str] | str]) -> tuple[dict[str, Any], list[str]]:
    """Type string parameters like Ollama's ``FormatParams`` + ``CreateRequest``.

    Each value of each list is checked in order, as if it were its own PARAMETER line:
    scalars keep the last value, ``stop`` accumulates every value, deprecated names are
    skipped with a warning (``"warning: parameter X is deprecated"``), an unknown name
    raises ``ParamError("unknown parameter 'X'")``.  Names are case-sensitive;
    ``n_max`` is stored as ``draft_num_predict``.
    """
    out: dict[str, Any] = {}
    warnings: list[str] = []
    for name, values in params.items():
        for raw in ([values] if isinstance(values, str) else values):
            _add_string_param(out, warnings, name, raw)
    return out, warnings


def parameters_from_commands(commands: Iterable[Any]) -> tuple[dict[str, Any], list[str]]:
    """The typed ``parameters`` of a parsed Modelfile (every non-keyword command, in order)."""
    out: dict[str, Any] = {}
    warnings: list[str] = []
    for cmd in commands:
        if cmd.name in COMMAND_NAMES:
            continue
        _add_string_param(out, warnings, cmd.name, cmd.args)
    return out, warnings
