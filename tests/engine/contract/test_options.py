"""engine.contract.options (the typed option record, Ollama's Options.FromMap) and engine.contract.speculation_plan
(the one speculation rule, shared by the engine and /api/show)."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from engine.contract.options import (
    DEFAULT_OPTIONS,
    OPTION_ALIASES,
    OPTION_TYPES,
    SPECULATION_DEFAULTS,
    Options,
    ParamError,
    coerce_options,
)
from engine.contract.speculation_plan import SpeculationPlan, plan_speculation
from modelfile import format_params


def perr(fn, *args, **kwargs):
    with pytest.raises(ParamError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def set_values(options: Options) -> dict:
    """The explicitly set fields of an Options, as the JSON-shaped dict coerce_options returns."""
    return {k: list(v) if k == "stop" else v for k in options.explicit for v in [getattr(options, k)]}


# --------------------------------------------------------------------------- the table

def test_option_types_table():
    ints = {"num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "num_ctx", "num_batch",
            "num_gpu", "num_thread", "draft_num_predict", "main_gpu", "draft_n_min", "relaxed_top_n",
            "draft_vocab", "tensor_parallel_size", "pipeline_parallel_size"}
    floats = {"temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
              "frequency_penalty", "draft_p_min"}
    bools = {"use_mmap", "draft_trace", "draft_copy", "draft_suffix"}
    strs = {"draft_schedule", "drafter", "draft_acceptance", "relaxed_scope", "weight_format", "engine"}
    assert {k for k, v in OPTION_TYPES.items() if v is int} == ints
    assert {k for k, v in OPTION_TYPES.items() if v is float} == floats
    assert {k for k, v in OPTION_TYPES.items() if v is bool} == bools
    assert {k for k, v in OPTION_TYPES.items() if v is str} == strs
    assert OPTION_TYPES["stop"] == list[str]
    assert len(OPTION_TYPES) == len(ints | floats | bools | strs) + 1
    assert OPTION_ALIASES == {"n_max": "draft_num_predict"}


def test_default_options():
    assert DEFAULT_OPTIONS == {
        "num_keep": 4, "seed": -1, "num_predict": -1, "top_k": 40, "top_p": 0.9, "min_p": 0.0,
        "typical_p": 1.0, "repeat_last_n": 64, "temperature": 0.8, "repeat_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "num_ctx": 4096, "num_batch": 512,
        "num_gpu": -1, "num_thread": 0}
    # the record's own defaults are the same values; stop, main_gpu and use_mmap are unset
    o = Options()
    assert {k: getattr(o, k) for k in DEFAULT_OPTIONS} == DEFAULT_OPTIONS
    assert (o.stop, o.main_gpu, o.use_mmap, o.explicit) == ((), None, None, frozenset())


def test_speculation_defaults():
    assert SPECULATION_DEFAULTS == {
        "draft_num_predict": 4, "draft_n_min": 0, "draft_p_min": 0.0, "relaxed_top_n": 0,
        "relaxed_scope": "all", "draft_schedule": "adaptive", "drafter": "auto", "draft_trace": False,
        "draft_acceptance": "strict", "draft_copy": True, "draft_suffix": True, "draft_vocab": 16384}
    # every default passes its own validation
    typed = coerce_options(SPECULATION_DEFAULTS)
    assert typed == SPECULATION_DEFAULTS
    assert set_values(Options.from_map(SPECULATION_DEFAULTS)) == SPECULATION_DEFAULTS


def test_options_module_is_torch_free():
    code = ("import sys, engine.contract.options, engine.contract.speculation_plan, modelfile; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --------------------------------------------------------------------------- Options.from_map (JSON)

def test_from_map_types():
    raw = {"temperature": 0, "top_p": 0.95, "top_k": 20.9, "num_predict": -1.7,
           "seed": 42, "use_mmap": False, "stop": ["a", "b"], "n_max": 3,
           "drafter": "mtp", "draft_trace": True, "draft_p_min": 1}
    expected = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "num_predict": -1, "seed": 42,
                "use_mmap": False, "stop": ["a", "b"], "draft_num_predict": 3,
                "drafter": "mtp", "draft_trace": True, "draft_p_min": 1.0}
    out = coerce_options(raw)
    assert out == expected
    assert type(out["temperature"]) is float and type(out["top_k"]) is int
    o = Options.from_map(raw)
    assert set_values(o) == expected and o.explicit == frozenset(expected)
    assert type(o.temperature) is float and type(o.top_k) is int and o.stop == ("a", "b")
    assert o.num_ctx == 4096 and o.draft_schedule == "adaptive"  # the rest are the defaults


def test_from_map_unknown_dropped_and_reported():
    unknown = []
    o = Options.from_map({"numa": True, "penalize_newline": True, "top_k": 5, "Top_K": 1},
                         unknown=unknown)
    assert set_values(o) == {"top_k": 5}
    assert unknown == ["numa", "penalize_newline", "Top_K"]


def test_from_map_null_and_empty():
    assert set_values(Options.from_map({"top_k": None, "temperature": 0.5})) == {"temperature": 0.5}
    assert Options.from_map({}) == Options()
    assert Options.from_map(None) == Options()
    assert coerce_options({"top_k": None, "temperature": 0.5}) == {"temperature": 0.5}
    assert coerce_options({}) == {}
    assert coerce_options(None) == {}


@pytest.mark.parametrize("options,message", [
    ({"top_k": "40"}, 'option "top_k" must be of type integer'),
    ({"top_k": True}, 'option "top_k" must be of type integer'),
    ({"top_k": [1]}, 'option "top_k" must be of type integer'),
    ({"n_max": "4"}, 'option "n_max" must be of type integer'),
    ({"temperature": "0.5"}, 'option "temperature" must be of type float32'),
    ({"temperature": False}, 'option "temperature" must be of type float32'),
    ({"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
    ({"use_mmap": "true"}, 'option "use_mmap" must be of type boolean'),
    ({"draft_trace": 0}, 'option "draft_trace" must be of type boolean'),
    ({"stop": 5}, 'option "stop" must be of type array'),
    ({"stop": {"a": 1}}, 'option "stop" must be of type array'),
    ({"stop": ["a", 1]}, 'option "stop" must be of an array of strings'),
    ({"drafter": 1}, 'option "drafter" must be of type string'),
    ({"draft_schedule": None, "drafter": "fast"},
     'invalid drafter value [fast]: must be one of "auto", "model", "mtp", "ngram", "suffix", or "none"'),
    ({"draft_schedule": "ADAPTIVE"},
     'invalid draft_schedule value [ADAPTIVE]: must be "adaptive" or "fixed"'),
    ({"draft_p_min": 1.5}, "invalid draft_p_min value [1.5]: must be between 0 and 1"),
    ({"draft_n_min": -2}, "invalid draft_n_min value [-2]: must be >= 0"),
    ({"relaxed_top_n": -1.0}, "invalid relaxed_top_n value [-1.0]: must be >= 0"),
    ({"draft_acceptance": "lossy"}, 'invalid draft_acceptance value [lossy]: must be "strict" or "match"'),
    ({"draft_acceptance": 1}, 'option "draft_acceptance" must be of type string'),
])
def test_from_map_errors(options, message):
    assert perr(Options.from_map, options) == message
    assert perr(coerce_options, options) == message


def test_from_map_single_stop_string():
    assert Options.from_map({"stop": "\n\n"}).stop == ("\n\n",)
    assert coerce_options({"stop": "\n\n"}) == {"stop": ["\n\n"]}


def test_from_map_does_not_mutate_input():
    opts = {"stop": ["a"], "n_max": 2}
    Options.from_map(opts)
    assert opts == {"stop": ["a"], "n_max": 2}


def test_draft_acceptance_is_an_option():
    """It used to be dropped as unknown at the edge (works only in-process); now JSON and
    PARAMETER both set it."""
    unknown = []
    assert Options.from_map({"draft_acceptance": "match"}, unknown=unknown).draft_acceptance == "match"
    assert unknown == []
    params, _ = format_params({"draft_acceptance": ["match"]})
    assert Options.merged(params, {}).draft_acceptance == "match"
    assert Options().draft_acceptance == "strict"


def test_direct_construction_is_validated():
    """Options built in-process (tests, benchmarks) get the same value checks."""
    assert perr(Options, drafter="medusa") == (
        'invalid drafter value [medusa]: must be one of "auto", "model", "mtp", "ngram", "suffix", or "none"')
    assert perr(Options, draft_p_min=math.nan) == "invalid draft_p_min value [NaN]: must be between 0 and 1"
    assert Options(stop=["a"]).stop == ("a",)


# --------------------------------------------------------------------------- Options.merged

def test_merged_order_and_explicit():
    params, _ = format_params({"temperature": ["0.2"], "stop": ["</s>"], "n_max": ["6"]})
    merged = Options.merged(params, {"temperature": 0.9, "top_k": 3.0})
    assert merged.temperature == 0.9 and merged.top_k == 3 and merged.stop == ("</s>",)
    assert merged.draft_num_predict == 6
    assert merged.num_ctx == 4096 and merged.draft_schedule == "adaptive"
    assert merged.explicit == {"temperature", "stop", "draft_num_predict", "top_k"}
    # a stored params layer may use the alias; the request's stop replaces the model's
    merged = Options.merged({"n_max": 2, "stop": ["x"], "unknown": 1}, {"stop": ["y"]})
    assert (merged.draft_num_predict, merged.stop) == (2, ("y",))
    assert perr(Options.merged, {}, {"top_k": "1"}) == 'option "top_k" must be of type integer'


# --------------------------------------------------------------------------- the speculation rule

def plan_of(merged: dict, explicit: bool, has_draft: bool, drafter: str, has_mtp: bool) -> tuple[str, int]:
    options = Options(**{**merged, "drafter": drafter},
                      explicit=frozenset({"draft_num_predict"} if explicit else ()))
    plan = plan_speculation(options, has_draft_layer=has_draft, has_mtp_head=has_mtp)
    return plan.drafter, plan.cap


@pytest.mark.parametrize("merged,explicit,has_draft,drafter,has_mtp,expected", [
    # default 4 with a DRAFT layer; without one an explicit cap takes the MTP head (Ollama's rule) and otherwise
    # the suffix drafter drafts (draft_suffix), its own default cap 16 unless the cap is set
    ({}, False, True, "auto", False, ("model", 4)),
    ({}, False, False, "auto", False, ("suffix", 16)),
    ({"draft_num_predict": 4}, False, False, "auto", True, ("suffix", 16)),
    ({"draft_num_predict": 6}, True, False, "auto", True, ("mtp", 6)),
    ({"draft_num_predict": 6}, True, False, "auto", False, ("suffix", 6)),
    ({"draft_suffix": False}, False, False, "auto", False, ("none", 0)),
    ({"draft_num_predict": 6, "draft_suffix": False}, True, False, "auto", False, ("none", 0)),
    ({"draft_num_predict": 8}, True, True, "auto", False, ("model", 8)),
    ({"draft_num_predict": 0}, True, True, "auto", False, ("none", 0)),
    ({"draft_num_predict": -3}, True, True, "auto", False, ("none", 0)),
    ({"draft_num_predict": 4}, False, True, "none", False, ("none", 0)),
    # an explicitly chosen drafter keeps the default cap
    ({"draft_num_predict": 4}, False, False, "ngram", False, ("ngram", 4)),
    ({"draft_num_predict": 2}, True, False, "mtp", True, ("mtp", 2)),
    ({"draft_num_predict": 4}, False, True, "model", False, ("model", 4)),
    ({"draft_num_predict": 0}, True, False, "ngram", False, ("none", 0)),
])
def test_plan_speculation(merged, explicit, has_draft, drafter, has_mtp, expected):
    assert plan_of(merged, explicit, has_draft, drafter, has_mtp) == expected


def test_plan_reads_drafter_from_options():
    plan = plan_speculation(Options.from_map({"drafter": "ngram", "draft_num_predict": 5}),
                            has_draft_layer=False, has_mtp_head=False)
    assert (plan.drafter, plan.cap) == ("ngram", 5)


def test_plan_from_merged_layers():
    """What resolve_options used to answer: the params layer's cap counts as explicit."""
    params, _ = format_params({"temperature": ["0.2"], "stop": ["</s>"], "n_max": ["6"]})
    plan = plan_speculation(Options.merged(params, {"temperature": 0.9}), has_draft_layer=True, has_mtp_head=False)
    assert (plan.drafter, plan.cap) == ("model", 6)
    # no DRAFT layer, nothing set -> the suffix drafter; a PARAMETER draft_suffix false -> speculation off;
    # the request can pick n-gram drafting
    assert plan_speculation(Options.merged({}, {}), has_draft_layer=False, has_mtp_head=False).drafter == "suffix"
    assert plan_speculation(Options.merged({"draft_suffix": False}, {}), has_draft_layer=False,
                            has_mtp_head=False).cap == 0
    plan = plan_speculation(Options.merged({}, {"drafter": "ngram"}), has_draft_layer=False, has_mtp_head=False)
    assert (plan.drafter, plan.cap) == ("ngram", 4)
    plan = plan_speculation(Options.merged({}, {"n_max": 3}), has_draft_layer=False, has_mtp_head=True)
    assert (plan.drafter, plan.cap) == ("mtp", 3)
    # an MTP head alone with the default cap: not the head (the engine used to pick it), the suffix drafter
    plan = plan_speculation(Options.merged({}, {}), has_draft_layer=False, has_mtp_head=True)
    assert (plan.drafter, plan.cap) == ("suffix", 16)


def test_plan_carries_the_tunables():
    options = Options.from_map({"drafter": "model", "draft_schedule": "fixed", "draft_p_min": 0.5,
                                "draft_n_min": 2, "relaxed_top_n": 3, "draft_trace": True,
                                "draft_acceptance": "match", "relaxed_scope": "thinking", "draft_copy": True})
    plan = plan_speculation(options, has_draft_layer=True, has_mtp_head=False)
    assert plan == SpeculationPlan(drafter="model", cap=4, rule="match", schedule="fixed", p_min=0.5,
                                   n_min=2, relaxed_top_n=3, trace=True, relaxed_scope="thinking", copy=True,
                                   suffix=True, suffix_cap=4)
    assert plan.as_options() == {
        "draft_num_predict": 4, "draft_n_min": 2, "draft_p_min": 0.5, "relaxed_top_n": 3,
        "relaxed_scope": "thinking", "draft_schedule": "fixed", "drafter": "model", "draft_trace": True, "draft_acceptance": "match",
        "draft_copy": True, "draft_suffix": True, "draft_vocab": 16384}
    # only a draft model or MTP head has copy rounds: n-gram lookup already is the copy, and none drafts nothing
    for drafter in ("ngram", "none"):
        other = plan_speculation(Options.from_map({"drafter": drafter, "draft_copy": True}),
                                 has_draft_layer=True, has_mtp_head=False)
        assert (other.drafter, other.copy) == (drafter, False)
    assert list(plan.as_options()) == list(SPECULATION_DEFAULTS)


def test_effective_num_ctx_is_the_smaller_context_a_request_asked_for() -> None:
    """One rule for every route and runtime: a positive num_ctx the model or request set, capped at what the
    engine loaded; the table's default (4096) and values <= 0 never narrow a loaded context."""
    assert Options().effective_num_ctx(8192) == 8192  # the default 4096 was not asked for
    assert Options.from_map({"num_ctx": 512}).effective_num_ctx(4096) == 512
    assert Options.from_map({"num_ctx": 16384}).effective_num_ctx(4096) == 4096
    assert Options.from_map({"num_ctx": 0}).effective_num_ctx(4096) == 4096
    assert Options.from_map({"num_ctx": -1}).effective_num_ctx(4096) == 4096
    assert Options.from_map({"num_thread": 3}).explicit_or("num_thread", 8) == 3
    assert Options().explicit_or("num_thread", 8) == 8
