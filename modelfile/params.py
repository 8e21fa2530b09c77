"""Model parameters and request options: Ollama's table plus tandem's speculation tunables.

Three entry points share one table (:data:`OPTION_TYPES`) and one set of checks:

* :func:`format_params` - Ollama's ``api.FormatParams`` for string values (Modelfile
  ``PARAMETER`` lines, ``ollama run``'s ``/set parameter``): Go ``strconv`` parsing.
* :func:`parameters_from_commands` - the PARAMETER part of ``Modelfile.CreateRequest``.
* :func:`coerce_options` - Ollama's ``api.Options.FromMap`` for JSON ``options``.

Merge order for a request (Ollama's): ``DEFAULT_OPTIONS`` and ``SPECULATION_DEFAULTS``
<- the model's ``params`` layer <- the request's ``options``; then
:func:`resolve_speculation` / :func:`effective_draft_num_predict` decide the drafter and
the draft depth cap.  :func:`resolve_options` does all of that in one call.
"""
from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "ParamError", "OPTION_TYPES", "OPTION_ALIASES", "DEPRECATED_PARAMETERS",
    "DEFAULT_OPTIONS", "SPECULATION_DEFAULTS", "SPECULATION_OPTIONS", "LOAD_TIME_OPTIONS",
    "DRAFT_SCHEDULES", "DRAFTERS", "COMMAND_NAMES",
    "format_params", "parameters_from_commands", "coerce_options",
    "resolve_speculation", "effective_draft_num_predict", "resolve_options",
    "go_parse_int", "go_parse_float", "go_parse_bool",
]


class ParamError(ValueError):
    """Invalid parameter or option; ``str(err)`` is Ollama's message (or tandem's, same style)."""


# --------------------------------------------------------------------------- the table

#: Every known option and its type: ``int`` (Go int64), ``float`` (Go float32, kept as
#: the shortest decimal that rounds to the same float32), ``bool``, ``list[str]``, ``str``.
OPTION_TYPES: dict[str, Any] = {
    # Ollama api.Options (request-time)
    "num_keep": int,
    "seed": int,
    "num_predict": int,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "repeat_last_n": int,
    "temperature": float,
    "repeat_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "stop": list[str],
    # Ollama api.Runner (load-time)
    "num_ctx": int,
    "num_batch": int,
    "num_gpu": int,
    "main_gpu": int,
    "use_mmap": bool,
    "num_thread": int,
    # speculative decoding (draft_num_predict is Ollama's; the rest are tandem's)
    "draft_num_predict": int,
    "draft_n_min": int,
    "draft_p_min": float,
    "relaxed_top_n": int,
    "draft_schedule": str,
    "drafter": str,
    "draft_trace": bool,
}

#: Accepted alternative names, normalised to the canonical one in every output.
OPTION_ALIASES: dict[str, str] = {"n_max": "draft_num_predict"}

#: Skipped with a warning when they appear as PARAMETER (Ollama's parser.go list).
DEPRECATED_PARAMETERS = ("penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only",
                         "use_mlock", "mirostat", "mirostat_tau", "mirostat_eta")

#: Command names that are not parameters (``Modelfile.CreateRequest``'s switch).
COMMAND_NAMES = frozenset({"model", "draft", "adapter", "template", "system", "license",
                           "renderer", "parser", "requires", "message"})

#: Options that only take effect when the model is (re)loaded.
LOAD_TIME_OPTIONS = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap",
                               "num_thread"})

#: Ollama's ``api.DefaultOptions()``.  ``stop``, ``main_gpu`` and ``use_mmap`` are unset
#: by default and therefore absent.  ``num_ctx`` is the 4096 tier (Ollama picks 4k/32k/256k
#: from VRAM unless OLLAMA_CONTEXT_LENGTH is set).  The speculation keys live in
#: :data:`SPECULATION_DEFAULTS`.
DEFAULT_OPTIONS: dict[str, Any] = {
    "num_keep": 4,
    "seed": -1,
    "num_predict": -1,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "temperature": 0.8,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "num_ctx": 4096,
    "num_batch": 512,
    "num_gpu": -1,
    "num_thread": 0,
}

DRAFT_SCHEDULES = ("adaptive", "fixed")
DRAFTERS = ("auto", "model", "mtp", "ngram", "none")

#: tandem's speculation tunables - the one documented place for their defaults.
#:
#: ``draft_num_predict`` (alias ``n_max``)
#:     Cap on tokens drafted per round; 0 disables speculation.  Ollama's default is 4,
#:     but it is forced to 0 when the model has no DRAFT layer and neither the model's
#:     parameters nor the request set it (see :func:`resolve_speculation`).
#: ``draft_n_min``
#:     Fixed schedule: skip verification when fewer tokens than this were drafted (>= 0).
#: ``draft_p_min``
#:     Stop drafting when the drafter's top probability falls below this ([0, 1]).
#: ``relaxed_top_n``
#:     0 = strict, lossless acceptance; N > 0 also accepts a draft ranked among the
#:     target's top N filtered candidates (lossy).
#: ``draft_schedule``
#:     ``adaptive`` (pick the depth that maximises committed tokens per second, up to
#:     the cap) or ``fixed`` (always draft up to the cap).
#: ``drafter``
#:     ``auto`` = the model's DRAFT layer if it has one, else no speculation (or its MTP
#:     head when draft_num_predict is set explicitly, as Ollama does); ``model`` = the
#:     DRAFT layer; ``mtp`` = the target's multi-token-prediction head; ``ngram`` =
#:     prompt-lookup drafting, usable with any model; ``none`` = never speculate.
#: ``draft_trace``
#:     Record the per-position verification trace.
SPECULATION_DEFAULTS: dict[str, Any] = {
    "draft_num_predict": 4,
    "draft_n_min": 0,
    "draft_p_min": 0.0,
    "relaxed_top_n": 0,
    "draft_schedule": "adaptive",
    "drafter": "auto",
    "draft_trace": False,
}
SPECULATION_OPTIONS = frozenset(SPECULATION_DEFAULTS)

_JSON_TYPE_NAMES = {int: "integer", float: "float32", bool: "boolean", str: "string"}


# --------------------------------------------------------------------------- Go strconv

_INT_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def go_parse_int(s: str) -> int | None:
    """``strconv.ParseInt(s, 10, 64)``; None on syntax or range error."""
    if not _INT_RE.fullmatch(s):
        return None
    v = int(s)
    return v if _INT64_MIN <= v <= _INT64_MAX else None


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


def _float32(x: float) -> float:
    """Round to float32 (raises OverflowError when out of range), then return the
    shortest decimal that rounds to the same float32 (what Go prints for a float32)."""
    packed = struct.pack("<f", x)
    f = struct.unpack("<f", packed)[0]
    if not math.isfinite(f):
        return f
    for digits in range(1, 10):
        r = float(f"{f:.{digits}g}")
        try:
            if struct.pack("<f", r) == packed:
                return r
        except OverflowError:
            continue
    return f  # pragma: no cover - 9 significant digits always round-trip


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
        return _float32(x)
    except OverflowError:
        return None  # ErrRange


# --------------------------------------------------------------------------- checks

def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _check_range(name: str, value: Any, shown: str) -> None:
    """tandem's value checks (Ollama has none for its own options)."""
    if name in ("draft_n_min", "relaxed_top_n"):
        if value < 0:
            raise ParamError(f"invalid {name} value [{shown}]: must be >= 0")
    elif name == "draft_p_min":
        if not 0.0 <= value <= 1.0:
            raise ParamError(f"invalid {name} value [{shown}]: must be between 0 and 1")
    elif name == "draft_schedule":
        if value not in DRAFT_SCHEDULES:
            raise ParamError(f'invalid {name} value [{shown}]: must be "adaptive" or "fixed"')
    elif name == "drafter":
        if value not in DRAFTERS:
            raise ParamError(f'invalid {name} value [{shown}]: must be one of "auto", "model", '
                             f'"mtp", "ngram", or "none"')


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
    _check_range(name, value, raw)
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


def _coerce_json(key: str, name: str, val: Any) -> Any:
    kind = OPTION_TYPES[name]
    if kind is int:
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise ParamError(f'option "{key}" must be of type integer')
        if isinstance(val, float):
            if math.isnan(val):
                raise ParamError(f'option "{key}" must be of type integer')
            if math.isinf(val) or not _INT64_MIN <= val < 2.0 ** 63:
                value = _INT64_MAX if val > 0 else _INT64_MIN   # saturate
            else:
                value = int(val)                                 # truncate toward zero
        else:
            value = min(max(val, _INT64_MIN), _INT64_MAX)
    elif kind is float:
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise ParamError(f'option "{key}" must be of type float32')
        try:
            value = _float32(float(val))
        except OverflowError:
            value = math.copysign(math.inf, val)  # Go's float32 conversion overflows to Inf
    elif kind is bool:
        if not isinstance(val, bool):
            raise ParamError(f'option "{key}" must be of type boolean')
        value = val
    elif kind is str:
        if not isinstance(val, str):
            raise ParamError(f'option "{key}" must be of type string')
        value = val
    else:  # list[str]
        if isinstance(val, str):
            val = [val]   # tandem extension: a single stop string
        if not isinstance(val, (list, tuple)):
            raise ParamError(f'option "{key}" must be of type array')
        if not all(isinstance(item, str) for item in val):
            raise ParamError(f'option "{key}" must be of an array of strings')
        value = list(val)
    _check_range(name, value, _show(val))
    return value


def coerce_options(options: Mapping[str, Any] | None, *,
                   unknown: list[str] | None = None) -> dict[str, Any]:
    """Validate request ``options`` (decoded JSON) like Ollama's ``Options.FromMap``.

    Returns only known keys, typed: int fields take JSON integers and floats (truncated
    toward zero) but not booleans or strings; float fields take any JSON number; bool
    fields only booleans; ``stop`` a list of strings (or one string); string fields
    strings.  ``null`` values are skipped.  ``n_max`` becomes ``draft_num_predict``
    (if both are given, the later key wins).  Unknown keys are dropped and, when
    ``unknown`` is a list, appended to it.  Raises :class:`ParamError` with Ollama's
    text, e.g. ``option "top_k" must be of type integer``.
    """
    out: dict[str, Any] = {}
    if not options:
        return out
    if not isinstance(options, Mapping):
        raise ParamError("options must be an object")
    for key, val in options.items():
        name = OPTION_ALIASES.get(key, key)
        if name not in OPTION_TYPES:
            if unknown is not None:
                unknown.append(key)
            continue
        if val is None:
            continue
        out[name] = _coerce_json(key, name, val)
    return out


def resolve_speculation(merged_options: Mapping[str, Any], params_or_request_set_it: bool,
                        has_draft_layer: bool, drafter: str | None = None, *,
                        has_mtp_head: bool = False) -> tuple[str, int]:
    """Decide ``(drafter, depth cap)`` for one request.

    ``merged_options`` is defaults <- model params <- request options;
    ``params_or_request_set_it`` says whether ``draft_num_predict`` (or ``n_max``) came
    from the model's parameters or the request rather than from the defaults.
    The drafter is one of ``model``, ``mtp``, ``ngram``, ``none``; the cap is 0 exactly
    when the drafter is ``none``.

    * ``none`` or a cap <= 0 -> ``("none", 0)``.
    * ``auto``: the DRAFT layer if the model has one; otherwise Ollama's rule applies
      (cap forced to 0 unless set explicitly) and an explicit cap uses the model's MTP
      head when it has one; otherwise no speculation.
    * ``model``/``mtp``/``ngram``: that drafter, with the default cap 4 unless set; the
      engine reports an error if the model cannot provide it.
    """
    if drafter is None:
        drafter = merged_options.get("drafter", SPECULATION_DEFAULTS["drafter"])
    cap = int(merged_options.get("draft_num_predict", SPECULATION_DEFAULTS["draft_num_predict"]))
    if drafter == "auto":
        if has_draft_layer:
            drafter = "model"
        elif params_or_request_set_it and has_mtp_head:
            drafter = "mtp"
        else:
            drafter = "none"
    if drafter == "none" or cap <= 0:
        return "none", 0
    return drafter, cap


def effective_draft_num_predict(merged_options: Mapping[str, Any], params_or_request_set_it: bool,
                                has_draft_layer: bool, drafter: str | None = None, *,
                                has_mtp_head: bool = False) -> int:
    """The draft depth cap to use (0 = no speculation); see :func:`resolve_speculation`."""
    return resolve_speculation(merged_options, params_or_request_set_it, has_draft_layer,
                               drafter, has_mtp_head=has_mtp_head)[1]


def resolve_options(model_params: Mapping[str, Any] | None, request_options: Mapping[str, Any] | None,
                    *, has_draft_layer: bool, has_mtp_head: bool = False) -> dict[str, Any]:
    """Full option set for a request: defaults <- model params <- request options.

    ``model_params`` are already typed (from :func:`format_params` or a stored params
    layer, aliases allowed); ``request_options`` is raw JSON and goes through
    :func:`coerce_options`.  The result has ``drafter`` resolved to the drafter actually
    used and ``draft_num_predict`` to the effective cap.
    """
    params = {OPTION_ALIASES.get(k, k): v for k, v in (model_params or {}).items()
              if OPTION_ALIASES.get(k, k) in OPTION_TYPES}
    request = coerce_options(request_options)
    merged = {**DEFAULT_OPTIONS, **SPECULATION_DEFAULTS, **params, **request}
    explicit = "draft_num_predict" in params or "draft_num_predict" in request
    drafter, cap = resolve_speculation(merged, explicit, has_draft_layer,
                                       has_mtp_head=has_mtp_head)
    merged["drafter"] = drafter
    merged["draft_num_predict"] = cap
    return merged
