"""Parameter typing (Ollama's FormatParams / Options.FromMap) and tandem's speculation tunables."""
from __future__ import annotations

import math

import pytest

from modelfile import (DEFAULT_OPTIONS, OPTION_TYPES, SPECULATION_DEFAULTS, Command, ParamError,
                       coerce_options, format_params, parse, parameters_from_commands)
from modelfile.params import (OPTION_ALIASES, effective_draft_num_predict, go_parse_bool,
                              go_parse_float, go_parse_int, resolve_options, resolve_speculation)


def perr(fn, *args, **kwargs):
    with pytest.raises(ParamError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------- the table

def test_option_types_table():
    ints = {"num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "num_ctx", "num_batch",
            "num_gpu", "num_thread", "draft_num_predict", "main_gpu", "draft_n_min", "relaxed_top_n"}
    floats = {"temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
              "frequency_penalty", "draft_p_min"}
    bools = {"use_mmap", "draft_trace"}
    strs = {"draft_schedule", "drafter"}
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


def test_speculation_defaults():
    assert SPECULATION_DEFAULTS == {
        "draft_num_predict": 4, "draft_n_min": 0, "draft_p_min": 0.0, "relaxed_top_n": 0,
        "draft_schedule": "adaptive", "drafter": "auto", "draft_trace": False}
    # every default passes its own validation
    typed = coerce_options(SPECULATION_DEFAULTS)
    assert typed == SPECULATION_DEFAULTS


# --------------------------------------------------------------------------- Go strconv

@pytest.mark.parametrize("s,v", [("0", 0), ("42", 42), ("-7", -7), ("+7", 7), ("007", 7),
                                 ("9223372036854775807", 2**63 - 1),
                                 ("-9223372036854775808", -(2**63))])
def test_go_parse_int_ok(s, v):
    assert go_parse_int(s) == v


@pytest.mark.parametrize("s", ["", "abc", "1.0", "1e3", " 1", "1 ", "1_000", "0x10", "+", "-",
                               "++1", "9223372036854775808", "-9223372036854775809", "１"])
def test_go_parse_int_bad(s):
    assert go_parse_int(s) is None


@pytest.mark.parametrize("s,v", [
    ("0.7", 0.7), ("1", 1.0), ("-1.5", -1.5), ("+2", 2.0), (".5", 0.5), ("5.", 5.0),
    ("1e3", 1000.0), ("1E-2", 0.01), ("1_000.5", 1000.5), ("0x1p-2", 0.25), ("0X1.8P1", 3.0),
    ("0x_1p4", 16.0), ("inf", math.inf), ("+Inf", math.inf), ("-infinity", -math.inf),
    ("INFINITY", math.inf), ("3.4028234e38", 3.4028235e38), ("1e-50", 0.0),
    ("0.1234567891", 0.12345679),   # float32 precision, shortest decimal
])
def test_go_parse_float_ok(s, v):
    assert go_parse_float(s) == v


@pytest.mark.parametrize("s", ["nan", "NaN", "nAn"])
def test_go_parse_float_nan(s):
    assert math.isnan(go_parse_float(s))


@pytest.mark.parametrize("s", ["", "abc", "1.0f", " 1", "1 ", "1,5", "1..2", "1.2.3", "e3", "1e",
                               "1e+", "+nan", "-nan", "infin", "in", "0x1", "0x", "0x1.8", "_1",
                               "1__0", "1_", "1_.5", "1._5", "1e_3", "3.5e38", "-1e39", "1e999",
                               "0x1p200", "٣"])
def test_go_parse_float_bad(s):
    assert go_parse_float(s) is None


@pytest.mark.parametrize("s,v", [("1", True), ("t", True), ("T", True), ("TRUE", True),
                                 ("true", True), ("True", True), ("0", False), ("f", False),
                                 ("F", False), ("FALSE", False), ("false", False), ("False", False)])
def test_go_parse_bool_ok(s, v):
    assert go_parse_bool(s) is v


@pytest.mark.parametrize("s", ["", "yes", "no", "on", "tRUE", "TRue", "2", " true", "true "])
def test_go_parse_bool_bad(s):
    assert go_parse_bool(s) is None


# --------------------------------------------------------------------------- format_params

def test_format_params_types():
    out, warnings = format_params({
        "temperature": ["0.7"], "top_k": ["40"], "use_mmap": ["true"], "stop": ["<|a|>", "<|b|>"],
        "seed": ["-1"], "num_ctx": ["8192"], "min_p": ["0.05"]})
    assert out == {"temperature": 0.7, "top_k": 40, "use_mmap": True, "stop": ["<|a|>", "<|b|>"],
                   "seed": -1, "num_ctx": 8192, "min_p": 0.05}
    assert type(out["top_k"]) is int and type(out["temperature"]) is float
    assert warnings == []


def test_single_stop_is_still_a_list():
    assert format_params({"stop": ["</s>"]}) == ({"stop": ["</s>"]}, [])
    assert format_params({"stop": "</s>"}) == ({"stop": ["</s>"]}, [])


@pytest.mark.parametrize("name,value,message", [
    ("top_k", "abc", "invalid int value [abc]"),
    ("num_ctx", "4096.0", "invalid int value [4096.0]"),
    ("seed", " 1", "invalid int value [ 1]"),
    ("seed", "", "invalid int value []"),
    ("temperature", "hot", "invalid float value [hot]"),
    ("top_p", "1.0f", "invalid float value [1.0f]"),
    ("top_p", "1e39", "invalid float value [1e39]"),
    ("use_mmap", "yes", "invalid bool value [yes]"),
    ("numa", "true", "unknown parameter 'numa'"),
    ("num_gqa", "1", "unknown parameter 'num_gqa'"),
    ("Temperature", "1", "unknown parameter 'Temperature'"),
    ("", "x", "unknown parameter ''"),
])
def test_format_params_errors(name, value, message):
    assert perr(format_params, {name: [value]}) == message


def test_deprecated_skipped_with_warning():
    out, warnings = format_params({"penalize_newline": ["true"], "mirostat": ["2"],
                                   "temperature": ["1"]})
    assert out == {"temperature": 1.0}
    assert warnings == ["warning: parameter penalize_newline is deprecated",
                        "warning: parameter mirostat is deprecated"]
    for name in ("low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock", "mirostat_tau",
                 "mirostat_eta"):
        assert format_params({name: ["whatever"]}) == (
            {}, [f"warning: parameter {name} is deprecated"])


def test_repeated_scalars_last_wins_but_each_is_checked():
    assert format_params({"temperature": ["0.1", "0.9"]}) == ({"temperature": 0.9}, [])
    assert perr(format_params, {"temperature": ["x", "0.9"]}) == "invalid float value [x]"


# --------------------------------------------------------------------------- from a Modelfile

def test_parameters_from_commands():
    cmds = parse('FROM llama3\nPARAMETER temperature 0.5\nPARAMETER stop "<|eot_id|>"\n'
                 'SYSTEM hi\nPARAMETER top_k 1\nPARAMETER stop </s>\nPARAMETER temperature 0.25\n'
                 'MESSAGE user hello\nPARAMETER use_mlock true\nLICENSE MIT\nDRAFT ./d\n')
    params, warnings = parameters_from_commands(cmds)
    assert params == {"temperature": 0.25, "stop": ["<|eot_id|>", "</s>"], "top_k": 1}
    assert warnings == ["warning: parameter use_mlock is deprecated"]


def test_parameters_from_commands_errors_in_order():
    cmds = [Command("model", "x"), Command("top_k", "x1"), Command("numa", "true")]
    assert perr(parameters_from_commands, cmds) == "invalid int value [x1]"
    # the empty-name quirk of the parser ends up here
    cmds = parse("FROM x\nPARAMETER  temperature 1\n")
    assert perr(parameters_from_commands, cmds) == "unknown parameter ''"


# --------------------------------------------------------------------------- speculation params

def test_speculation_params_from_modelfile():
    cmds = parse("FROM m\nPARAMETER n_max 8\nPARAMETER draft_n_min 2\nPARAMETER draft_p_min 0.25\n"
                 "PARAMETER relaxed_top_n 3\nPARAMETER draft_schedule fixed\n"
                 "PARAMETER drafter ngram\nPARAMETER draft_trace 1\n")
    assert parameters_from_commands(cmds) == ({
        "draft_num_predict": 8, "draft_n_min": 2, "draft_p_min": 0.25, "relaxed_top_n": 3,
        "draft_schedule": "fixed", "drafter": "ngram", "draft_trace": True}, [])


def test_alias_and_canonical_last_wins():
    assert format_params({"draft_num_predict": ["2"], "n_max": ["6"]}) == ({"draft_num_predict": 6}, [])
    assert format_params({"n_max": ["6"], "draft_num_predict": ["0"]}) == ({"draft_num_predict": 0}, [])


@pytest.mark.parametrize("name,value,message", [
    ("n_max", "four", "invalid int value [four]"),
    ("draft_n_min", "-1", "invalid draft_n_min value [-1]: must be >= 0"),
    ("relaxed_top_n", "-3", "invalid relaxed_top_n value [-3]: must be >= 0"),
    ("relaxed_top_n", "1.5", "invalid int value [1.5]"),
    ("draft_p_min", "1.5", "invalid draft_p_min value [1.5]: must be between 0 and 1"),
    ("draft_p_min", "-0.1", "invalid draft_p_min value [-0.1]: must be between 0 and 1"),
    ("draft_p_min", "nan", "invalid draft_p_min value [nan]: must be between 0 and 1"),
    ("draft_p_min", "high", "invalid float value [high]"),
    ("draft_schedule", "greedy", 'invalid draft_schedule value [greedy]: must be "adaptive" or "fixed"'),
    ("draft_schedule", "Fixed", 'invalid draft_schedule value [Fixed]: must be "adaptive" or "fixed"'),
    ("drafter", "eagle", 'invalid drafter value [eagle]: must be one of "auto", "model", "mtp", '
                         '"ngram", or "none"'),
    ("draft_trace", "on", "invalid bool value [on]"),
])
def test_speculation_param_errors(name, value, message):
    assert perr(format_params, {name: [value]}) == message


@pytest.mark.parametrize("value", ["0", "1", "0.5", "1e-3"])
def test_draft_p_min_bounds_inclusive(value):
    assert format_params({"draft_p_min": [value]})[0]["draft_p_min"] == float(value)


@pytest.mark.parametrize("drafter", ["auto", "model", "mtp", "ngram", "none"])
def test_all_drafters_accepted(drafter):
    assert format_params({"drafter": [drafter]}) == ({"drafter": drafter}, [])


# --------------------------------------------------------------------------- coerce_options (JSON)

def test_coerce_options_types():
    out = coerce_options({"temperature": 0, "top_p": 0.95, "top_k": 20.9, "num_predict": -1.7,
                          "seed": 42, "use_mmap": False, "stop": ["a", "b"], "n_max": 3,
                          "drafter": "mtp", "draft_trace": True, "draft_p_min": 1})
    assert out == {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "num_predict": -1, "seed": 42,
                   "use_mmap": False, "stop": ["a", "b"], "draft_num_predict": 3,
                   "drafter": "mtp", "draft_trace": True, "draft_p_min": 1.0}
    assert type(out["temperature"]) is float and type(out["top_k"]) is int


def test_coerce_options_unknown_dropped_and_reported():
    unknown = []
    out = coerce_options({"numa": True, "penalize_newline": True, "top_k": 5, "Top_K": 1},
                         unknown=unknown)
    assert out == {"top_k": 5}
    assert unknown == ["numa", "penalize_newline", "Top_K"]


def test_coerce_options_null_and_empty():
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
     'invalid drafter value [fast]: must be one of "auto", "model", "mtp", "ngram", or "none"'),
    ({"draft_schedule": "ADAPTIVE"},
     'invalid draft_schedule value [ADAPTIVE]: must be "adaptive" or "fixed"'),
    ({"draft_p_min": 1.5}, "invalid draft_p_min value [1.5]: must be between 0 and 1"),
    ({"draft_n_min": -2}, "invalid draft_n_min value [-2]: must be >= 0"),
    ({"relaxed_top_n": -1.0}, "invalid relaxed_top_n value [-1.0]: must be >= 0"),
])
def test_coerce_options_errors(options, message):
    assert perr(coerce_options, options) == message


def test_coerce_options_single_stop_string():
    assert coerce_options({"stop": "\n\n"}) == {"stop": ["\n\n"]}


def test_coerce_options_does_not_mutate_input():
    opts = {"stop": ["a"], "n_max": 2}
    coerce_options(opts)
    assert opts == {"stop": ["a"], "n_max": 2}


# --------------------------------------------------------------------------- draft depth resolution

@pytest.mark.parametrize("merged,explicit,has_draft,drafter,has_mtp,expected", [
    # Ollama's rule: default 4, forced to 0 without a DRAFT layer unless set explicitly
    ({}, False, True, "auto", False, ("model", 4)),
    ({}, False, False, "auto", False, ("none", 0)),
    ({"draft_num_predict": 4}, False, False, "auto", True, ("none", 0)),
    ({"draft_num_predict": 6}, True, False, "auto", True, ("mtp", 6)),
    ({"draft_num_predict": 6}, True, False, "auto", False, ("none", 0)),
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
def test_resolve_speculation(merged, explicit, has_draft, drafter, has_mtp, expected):
    assert resolve_speculation(merged, explicit, has_draft, drafter, has_mtp_head=has_mtp) == expected
    assert effective_draft_num_predict(merged, explicit, has_draft, drafter,
                                       has_mtp_head=has_mtp) == expected[1]


def test_resolve_speculation_reads_drafter_from_options():
    assert resolve_speculation({"drafter": "ngram", "draft_num_predict": 5}, True, False) == ("ngram", 5)


def test_resolve_options_merge_order():
    params, _ = format_params({"temperature": ["0.2"], "stop": ["</s>"], "n_max": ["6"]})
    merged = resolve_options(params, {"temperature": 0.9, "top_k": 3.0}, has_draft_layer=True)
    assert merged["temperature"] == 0.9 and merged["top_k"] == 3 and merged["stop"] == ["</s>"]
    assert merged["draft_num_predict"] == 6 and merged["drafter"] == "model"
    assert merged["num_ctx"] == 4096 and merged["draft_schedule"] == "adaptive"
    # no DRAFT layer, nothing set -> speculation off; the request can pick n-gram drafting
    assert resolve_options({}, {}, has_draft_layer=False)["draft_num_predict"] == 0
    merged = resolve_options({}, {"drafter": "ngram"}, has_draft_layer=False)
    assert (merged["drafter"], merged["draft_num_predict"]) == ("ngram", 4)
    merged = resolve_options({}, {"n_max": 3}, has_draft_layer=False, has_mtp_head=True)
    assert (merged["drafter"], merged["draft_num_predict"]) == ("mtp", 3)
