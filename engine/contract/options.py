"""Request options as one typed record, parsed and validated once where a request enters.

Why a dataclass and not the JSON map: the map used to travel into the engine and be read again
there (with its own defaults and its own idea of which drafter "auto" meant), so the server and the
engine could disagree.  Now the edge builds an :class:`Options` (Ollama's ``Options.FromMap``
semantics, error texts included) and everything after it reads typed fields.

:class:`Options` is the single list of option names, types and defaults.  The JSON type table
(:data:`OPTION_TYPES`), the defaults (:data:`DEFAULT_OPTIONS`, :data:`SPECULATION_DEFAULTS`) and
the value checks (:func:`check_range`: choices from ``Literal`` annotations, bounds from field
metadata) are derived from it, not listed again.  The Modelfile's string parsing (``modelfile.params``)
validates against the same table.

Merge order for a request (Ollama's ``modelOptions``): the defaults <- the model's ``params`` layer
<- the request's ``options`` (:meth:`Options.merged`).  ``Options.explicit`` remembers which names
a layer above the defaults set, because Ollama's draft-depth rule depends on it
(``engine.contract.speculation_plan``).

Torch-free: the server imports this module.
"""
from __future__ import annotations

import json
import math
import struct
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = [
    "ParamError", "OptionRangeError", "Options", "DrafterChoice", "DraftSchedule", "AcceptanceRule", "RelaxedScope",
    "OPTION_TYPES", "OPTION_ALIASES", "OPTION_CHOICES", "DEFAULT_OPTIONS", "SPECULATION_DEFAULTS",
    "SPECULATION_OPTIONS", "DRAFTERS", "DRAFT_SCHEDULES", "ACCEPTANCE_RULES",
    "coerce_options", "check_range", "MAX_DRAFT_NUM_PREDICT", "float32", "INT64_MIN", "INT64_MAX",
]


class ParamError(ValueError):
    """Invalid parameter or option; ``str(err)`` is Ollama's message (or tandem's, same style)."""


class OptionRangeError(ParamError):
    """A well-typed option whose value tandem refuses (:func:`check_range`).

    Separate from a type error because the statuses differ: Ollama answers a wrong option type on
    generate/chat with 500, while these checks are tandem's own and are a client error (400).
    """


DrafterChoice = Literal["auto", "model", "mtp", "ngram", "suffix", "none"]
DraftSchedule = Literal["adaptive", "fixed"]
AcceptanceRule = Literal["strict", "match"]
RelaxedScope = Literal["all", "thinking"]
# How the engine holds the target's linear weights (engine.ops.linear documents each); "auto" = as the source
# is stored where a kernel keeps it exact (quantized codes, or f32 for a float source), else the engine's choice.
WeightFormat = Literal["auto", "f32", "bf16", "bf16-packed", "int8", "int4", "auto-int4", "qdot"]
# Which engine runs the model: tandem's own, or a vLLM server tandem starts or attaches to (engine.vllm).
EngineKind = Literal["auto", "native", "llamacpp", "vllm"]


#: The largest ``draft_num_predict``: deeper drafts are never worth verifying, and every drafted
#: token costs a drafter step, so an unbounded cap would let one request make decoding arbitrarily slow.
MAX_DRAFT_NUM_PREDICT = 64
# The draft model head's kept tokens: with the request's own tokens kept too, 16,384 drafts the same
# tokens as 32,768 on the benchmark's code, prose and rewrite (strict acceptance identical) and halves
# the head's reads (docs/bench/draft-vocab-qwen.md).
DEFAULT_DRAFT_VOCAB = 16384


def _speculation(default: Any, **bounds: float) -> Any:
    """A tandem speculation tunable: grouped (for /api/show) and optionally bounded."""
    return field(default=default, metadata={"speculation": True, **bounds})


@dataclass(frozen=True)
class Options:
    """Every option a request can carry, typed, with Ollama's defaults.

    Ints are Go int64s, floats Go float32s (kept as the shortest decimal that rounds to the same
    float32).  ``main_gpu`` and ``use_mmap`` are unset (None) by default, as in Ollama.
    ``num_ctx`` is the 4096 tier (Ollama picks 4k/32k/256k from VRAM unless
    OLLAMA_CONTEXT_LENGTH is set).

    Speculation tunables (tandem's; ``draft_num_predict`` is Ollama's):

    ``draft_num_predict`` (alias ``n_max``)
        Cap on tokens drafted per round; 0 disables speculation.  Ollama's default is 4, but it is
        forced to 0 when the model has no DRAFT layer and neither the model's parameters nor the
        request set it (``engine.contract.speculation_plan``).
    ``draft_n_min``
        Fixed schedule: skip verification when fewer tokens than this were drafted (>= 0).
    ``draft_copy``
        In rounds where the output is copying its context (the n-gram drafter's copy cursor agrees
        with all of the last 8 tokens), draft the copy (free) instead of asking the draft model or MTP
        head; where 4-7 of 8 agree, the adaptive controllers choose between the copy and the model;
        elsewhere the model drafts as usual. Lossless either way. On by default: it costs nothing on a
        text that does not copy and is the largest gain on one that does (docs/measurements.md,
        ``draft_copy``); the request's statistics then name the drafter ``model+copy``.
    ``draft_suffix``
        Draft from what this model wrote in earlier requests (and, without a DRAFT, from the request's own text):
        ``engine.speculative.suffix``. On by default: a model without a DRAFT then speculates with the ``suffix``
        drafter (its depth cap 16 unless ``draft_num_predict`` is set), one with a DRAFT model or MTP head adds
        those outputs to its copy rounds (``model+suffix``). The adaptive controller prices every source, so text
        that matches nothing is decoded plainly. ``false``: neither (Ollama's rule: no speculation without a DRAFT).
    ``draft_p_min``
        Stop drafting when the drafter's top probability falls below this ([0, 1]).
    ``draft_vocab``
        Load-time: the draft model's output head keeps only this many tokens, the most frequent in a
        reference text and the request's own tokens (``engine.models.pruned_head``); 0 = the whole
        vocabulary. Cuts the drafter's reads; lossless either way (a token it cannot propose is still
        sampled by the target). Default 16384, chosen by measurement (docs/bench/draft-vocab-qwen.md).
    ``relaxed_top_n``
        0 = strict, lossless acceptance; N > 0 also accepts a draft ranked among the target's top
        N filtered candidates (lossy).
    ``relaxed_scope``
        Where ``relaxed_top_n`` applies: ``all`` positions, or only ``thinking`` ones (inside the
        model's reasoning block, found from its ``<think>``/``</think>`` tokens); the answer after
        the block is then decided by the strict, lossless rule.
    ``draft_schedule``
        ``adaptive`` (pick the depth that maximises committed tokens per second, up to the cap) or
        ``fixed`` (always draft up to the cap).
    ``drafter``
        ``auto`` = the model's DRAFT layer if it has one, else its MTP head when draft_num_predict is set
        explicitly (as Ollama does), else ``suffix`` (``draft_suffix``, on by default) or no speculation; ``model`` = the DRAFT layer; ``mtp`` =
        the target's multi-token-prediction head; ``ngram`` = prompt-lookup drafting, usable with
        any model; ``suffix`` = drafts from the model's earlier outputs and the request's own text (what
        ``auto`` picks without a DRAFT while ``draft_suffix`` is on); ``none`` = never speculate.
    ``draft_trace``
        Record the per-position verification trace.
    ``draft_acceptance``
        ``strict`` (rejection sampling, lossless) or ``match`` (llama.cpp's rule: accept when the
        target's own sample equals the draft), for measurements.

    ``explicit`` holds the names a layer above the defaults set (model parameters or request).
    """

    # Ollama api.Options (request-time)
    num_keep: int = 4
    seed: int = -1
    num_predict: int = -1
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_last_n: int = 64
    temperature: float = 0.8
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    # Ollama api.Runner (load-time)
    num_ctx: int = 4096
    num_batch: int = 512
    num_gpu: int = -1
    main_gpu: int | None = None
    use_mmap: bool | None = None
    num_thread: int = 0
    # tandem's load-time weight format of the target (``WeightFormat``); a change reloads the engine
    weight_format: WeightFormat = field(default="auto", metadata={"tandem": True})
    # tandem's load-time engine (``EngineKind``; the server's default is TANDEM_ENGINE); a change reloads
    engine: EngineKind = field(default="auto", metadata={"tandem": True})
    # the vllm engine's tensor and pipeline parallel sizes (vLLM's own flags); load-time
    tensor_parallel_size: int = field(default=1, metadata={"tandem": True, "min": 1})
    pipeline_parallel_size: int = field(default=1, metadata={"tandem": True, "min": 1})
    # speculative decoding
    draft_num_predict: int = _speculation(4, max=MAX_DRAFT_NUM_PREDICT)  # <= 0: no speculation
    draft_n_min: int = _speculation(0, min=0)
    draft_p_min: float = _speculation(0.0, min=0, max=1)
    draft_copy: bool = _speculation(True)
    draft_suffix: bool = _speculation(True)
    relaxed_top_n: int = _speculation(0, min=0)
    relaxed_scope: RelaxedScope = _speculation("all")
    draft_schedule: DraftSchedule = _speculation("adaptive")
    drafter: DrafterChoice = _speculation("auto")
    draft_trace: bool = _speculation(False)
    draft_acceptance: AcceptanceRule = _speculation("strict")
    draft_vocab: int = _speculation(DEFAULT_DRAFT_VOCAB, min=0)  # load-time: a change reloads the engine

    explicit: frozenset[str] = field(default=frozenset(), repr=False)

    def __post_init__(self) -> None:
        # An Options built directly (tests, benchmarks) gets the same value checks as one parsed
        # from JSON, so nothing downstream has to check again.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "explicit", frozenset(self.explicit))
        unknown = self.explicit - OPTION_TYPES.keys()
        if unknown:
            raise ParamError(f"unknown options in explicit: {', '.join(sorted(unknown))}")
        for name in _CHECKED:
            value = getattr(self, name)
            check_range(name, value, _show(value))

    @classmethod
    def from_map(cls, options: Mapping[str, Any] | None, *, unknown: list[str] | None = None) -> "Options":
        """The defaults with decoded JSON ``options`` applied (Ollama's ``Options.FromMap``).

        See :func:`coerce_options` for the accepted forms and error texts; every key it keeps is
        in ``explicit``.
        """
        return cls._with(coerce_options(options, unknown=unknown))

    @classmethod
    def merged(cls, model_params: Mapping[str, Any] | None,
               request_options: Mapping[str, Any] | None) -> "Options":
        """defaults <- the model's parameters <- the request's options (Ollama's ``modelOptions``).

        Both layers are decoded JSON (the stored params layer is JSON too) and go through
        :func:`coerce_options`: aliases are normalised, unknown keys dropped, ``null`` skipped.
        A request value replaces the model's (``stop`` included).
        """
        params = coerce_options(model_params)
        request = coerce_options(request_options)
        return cls._with({**params, **request})

    @classmethod
    def _with(cls, values: Mapping[str, Any]) -> "Options":
        return cls(**values, explicit=frozenset(values))

    def explicit_or(self, name: str, fallback: Any) -> Any:
        """The value the model's parameters or the request set for ``name``, else ``fallback`` (the server's
        setting): the option table's own default never overrides how the server was started."""
        return getattr(self, name) if name in self.explicit else fallback

    def effective_num_ctx(self, loaded: int) -> int:
        """The context a request runs in on an engine loaded with ``loaded`` positions: the request's own
        ``num_ctx`` where it set a smaller positive one (an engine serves smaller contexts without a reload,
        server.lifecycle.serves), else what was loaded. Every place that fits a prompt or caps a generation
        asks this, so the server's chat truncation and the engine's cut agree on one number."""
        wanted = self.explicit_or("num_ctx", 0)
        return min(wanted, loaded) if wanted > 0 else loaded

    def device(self) -> str:
        """Where the native engine loads the model, from Ollama's ``num_gpu`` (layers to offload) and ``main_gpu``:
        the CPU unless layers are asked for (``num_gpu`` > 0), then the whole model on GPU ``main_gpu`` (tandem
        does not split a model across devices). Ollama's default -1 ("as many as fit") stays on the CPU here:
        the engine's GPU path is dense bf16 through plain PyTorch, which no test runs, so it is a user's choice,
        never a default (issue 36)."""
        if "num_gpu" in self.explicit and self.num_gpu > 0:
            return f"cuda:{self.main_gpu or 0}"
        return "cpu"


def _json_kind(hint: Any) -> Any:
    """The JSON type of a field: ``int``, ``float``, ``bool``, ``str`` or ``list[str]``."""
    origin = get_origin(hint)
    if origin is Literal:
        return type(get_args(hint)[0])
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return _json_kind(inner)
    if origin is tuple:
        return list[str]
    return hint


def _choices(hint: Any) -> tuple[Any, ...] | None:
    return get_args(hint) if get_origin(hint) is Literal else None


_HINTS = get_type_hints(Options)
_FIELDS = [f for f in fields(Options) if f.name != "explicit"]

#: Every known option and its JSON type: ``int`` (Go int64), ``float`` (Go float32), ``bool``,
#: ``list[str]``, ``str``.
OPTION_TYPES: dict[str, Any] = {f.name: _json_kind(_HINTS[f.name]) for f in _FIELDS}

#: Accepted alternative names, normalised to the canonical one in every output.
OPTION_ALIASES: dict[str, str] = {"n_max": "draft_num_predict"}

#: The allowed values of the string options (from their ``Literal`` annotations).
OPTION_CHOICES: dict[str, tuple[Any, ...]] = {
    f.name: c for f in _FIELDS if (c := _choices(_HINTS[f.name])) is not None}
DRAFTERS: tuple[str, ...] = OPTION_CHOICES["drafter"]
DRAFT_SCHEDULES: tuple[str, ...] = OPTION_CHOICES["draft_schedule"]
ACCEPTANCE_RULES: tuple[str, ...] = OPTION_CHOICES["draft_acceptance"]

#: Ollama's ``api.DefaultOptions()``; the unset ones (``stop``, ``main_gpu``, ``use_mmap``) absent.
DEFAULT_OPTIONS: dict[str, Any] = {
    f.name: f.default for f in _FIELDS
    if not f.metadata.get("speculation") and not f.metadata.get("tandem") and f.default is not None
    and f.default != ()}

#: tandem's speculation tunables and their defaults (documented on :class:`Options`).
SPECULATION_DEFAULTS: dict[str, Any] = {f.name: f.default for f in _FIELDS if f.metadata.get("speculation")}
SPECULATION_OPTIONS = frozenset(SPECULATION_DEFAULTS)

_BOUNDS: dict[str, Mapping[str, Any]] = {
    f.name: f.metadata for f in _FIELDS if "min" in f.metadata or "max" in f.metadata}
_CHECKED = tuple(OPTION_CHOICES) + tuple(_BOUNDS)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# --------------------------------------------------------------------------- checks

def _quoted_choices(choices: tuple[Any, ...]) -> str:
    quoted = [f'"{c}"' for c in choices]
    if len(quoted) == 2:
        return f"{quoted[0]} or {quoted[1]}"
    return "one of " + ", ".join(quoted[:-1]) + f", or {quoted[-1]}"


def check_range(name: str, value: Any, shown: str) -> None:
    """tandem's value checks (Ollama has none for its own options); ``shown`` is the value as the
    caller wrote it, for the message."""
    choices = OPTION_CHOICES.get(name)
    if choices is not None:
        if value not in choices:
            raise OptionRangeError(f"invalid {name} value [{shown}]: must be {_quoted_choices(choices)}")
        return
    bounds = _BOUNDS.get(name)
    if bounds is None:
        return
    low, high = bounds.get("min"), bounds.get("max")
    if low is not None and high is not None:
        if not low <= value <= high:
            raise OptionRangeError(f"invalid {name} value [{shown}]: must be between {low} and {high}")
    elif low is not None and not value >= low:
        raise OptionRangeError(f"invalid {name} value [{shown}]: must be >= {low}")
    elif high is not None and not value <= high:
        raise OptionRangeError(f"invalid {name} value [{shown}]: must be <= {high}")


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def float32(x: float) -> float:
    """Round to float32 (raises OverflowError when out of range), then return the shortest
    decimal that rounds to the same float32 (what Go prints for a float32)."""
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


# --------------------------------------------------------------------------- JSON (FromMap)

def _coerce_json(key: str, name: str, val: Any) -> Any:
    kind = OPTION_TYPES[name]
    if kind is int:
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise ParamError(f'option "{key}" must be of type integer')
        if isinstance(val, float):
            if math.isnan(val):
                raise ParamError(f'option "{key}" must be of type integer')
            if math.isinf(val) or not INT64_MIN <= val < 2.0 ** 63:
                value = INT64_MAX if val > 0 else INT64_MIN   # saturate
            else:
                value = int(val)                               # truncate toward zero
        else:
            value = min(max(val, INT64_MIN), INT64_MAX)
    elif kind is float:
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise ParamError(f'option "{key}" must be of type float32')
        try:
            value = float32(float(val))
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
    check_range(name, value, _show(val))
    return value


def coerce_options(options: Mapping[str, Any] | None, *,
                   unknown: list[str] | None = None) -> dict[str, Any]:
    """Validate decoded JSON ``options`` like Ollama's ``Options.FromMap``; the typed values set.

    Returns only known keys, typed, in the input's order: int fields take JSON integers and floats
    (truncated toward zero) but not booleans or strings; float fields take any JSON number; bool
    fields only booleans; ``stop`` a list of strings (or one string); string fields strings.
    ``null`` values are skipped.  ``n_max`` becomes ``draft_num_predict`` (if both are given, the
    later key wins).  Unknown keys are dropped and, when ``unknown`` is a list, appended to it.
    Raises :class:`ParamError` with Ollama's text, e.g. ``option "top_k" must be of type integer``.
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
