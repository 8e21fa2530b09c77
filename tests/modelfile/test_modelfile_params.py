"""Modelfile parameter typing (Ollama's FormatParams, Go strconv) against engine.contract.options' table.

JSON options (Options.FromMap), the table itself and the speculation rule: tests/engine/contract/test_options.py.
"""
from __future__ import annotations

import math

import pytest

from modelfile import (
    Command,
    ParamError,
    format_params,
    parameters_from_commands,
    parse,
)
from modelfile.params import go_parse_bool, go_parse_float, go_parse_int


def perr(fn, *args, **kwargs):
    with pytest.raises(ParamError) as info:
        fn(*args, **kwargs)
    return str(info.value)


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
                         '"ngram", "suffix", or "none"'),
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


def test_draft_acceptance_is_a_parameter():
    cmds = parse("FROM m\nPARAMETER draft_acceptance match\n")
    assert parameters_from_commands(cmds) == ({"draft_acceptance": "match"}, [])
    assert perr(format_params, {"draft_acceptance": ["lossy"]}) == (
        'invalid draft_acceptance value [lossy]: must be "strict" or "match"')


def test_relaxed_scope_is_a_parameter():
    cmds = parse("FROM m\nPARAMETER relaxed_scope thinking\n")
    assert parameters_from_commands(cmds) == ({"relaxed_scope": "thinking"}, [])
    assert perr(format_params, {"relaxed_scope": ["answer"]}) == (
        'invalid relaxed_scope value [answer]: must be "all" or "thinking"')
