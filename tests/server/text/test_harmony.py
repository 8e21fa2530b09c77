"""gpt-oss's harmony output split into reasoning, answer and tool calls (Ollama's harmony parser)."""

from __future__ import annotations

import pytest

from server.text.harmony import (
    HarmonyHeader,
    HarmonyParser,
    harmony_function_names,
    parse_header,
    uses_harmony,
)

# What gpt-oss writes after the prompt's "<|start|>assistant" (the stop token <|return|>/<|call|> included,
# as a runner that keeps special tokens would show it).
ANSWER = ("<|channel|>analysis<|message|>The user asks for 2+2. That is 4.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>2 + 2 = **4**.<|return|>")
CALL = ("<|channel|>analysis<|message|>Need the weather; call get_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city":"Paris","unit":"celsius"}<|call|>')


def split(parser: HarmonyParser, text: str, step: int) -> tuple[str, str, list]:
    pieces = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)] + [parser.finish()]
    return ("".join(p.thinking for p in pieces), "".join(p.content for p in pieces),
            [c for p in pieces for c in p.calls])


@pytest.mark.parametrize("step", [1, 2, 3, 7, 10_000])
def test_analysis_then_final(step: int) -> None:
    assert split(HarmonyParser(), ANSWER, step) == ("The user asks for 2+2. That is 4.", "2 + 2 = **4**.", [])


@pytest.mark.parametrize("step", [1, 4, 10_000])
def test_analysis_then_a_tool_call(step: int) -> None:
    thinking, content, calls = split(HarmonyParser(["get_weather"]), CALL, step)
    assert thinking == "Need the weather; call get_weather."
    assert content == "" and calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_stop_tokens_stripped_and_call_ended_by_the_reply_end() -> None:
    # The runner stops at <|call|> / <|return|> without writing them: the open message ends with the reply.
    text = CALL.removesuffix("<|call|>")
    p = HarmonyParser(["get_weather"])
    piece = p.feed(text)
    assert piece.thinking and not piece.calls  # the call waits for its end
    assert p.finish().calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert split(HarmonyParser(), ANSWER.removesuffix("<|return|>"), 5)[1] == "2 + 2 = **4**."


def test_partial_markers_are_held_back() -> None:
    p = HarmonyParser()
    assert p.feed("<|channel|>final<|message|>Hello <|e").content == "Hello "
    assert p.feed("n").content == ""
    assert p.feed("d|>").content == ""
    # "<|" that turns out not to be a marker is released
    assert p.feed("<|start|>assistant<|channel|>final<|message|>a <|c").content == "a "  # <|call|>?
    assert p.feed("x").content == "<|cx"
    assert p.feed("<|b").content == "<|b"  # begins no marker


def test_several_calls_and_commentary_text() -> None:
    text = ("<|channel|>commentary<|message|>Checking both.<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Rome\"}<|call|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|end|>")
    thinking, content, calls = split(HarmonyParser(["get_weather", "get_time"]), text, 3)
    assert (thinking, content) == ("", "Checking both.")
    assert calls == [("get_weather", {"city": "Rome"}), ("get_time", {})]


def test_unknown_channels_and_stray_text() -> None:
    text = ("<|channel|>scratchpad<|message|>odd<|end|>stray text"
            "<|start|>assistant<|message|>no channel<|end|>")
    assert split(HarmonyParser(), text, 2) == ("", "oddno channel", [])  # answer text; outside text dropped


def test_bad_arguments_become_content() -> None:
    text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json<|call|>"
    assert split(HarmonyParser(["f"]), text, 1) == ("", "{not json", [])


def test_renamed_tools_map_back() -> None:
    names = harmony_function_names(["get-weather", "get.weather", "2fast", "python", "x y!"])
    assert names == {"get-weather": "get_weather", "get.weather": "get_weather_2", "2fast": "_2fast",
                     "python": "python", "x y!": "x_y"}
    text = "<|channel|>commentary to=functions.get_weather_2<|message|>{\"a\": 1}<|end|>"
    assert split(HarmonyParser(["get-weather", "get.weather"]), text, 4)[2] == [("get.weather", {"a": 1})]


def test_headers() -> None:
    assert parse_header("assistant<|channel|>commentary to=functions.f <|constrain|>json") == \
        HarmonyHeader("assistant", "commentary", "functions.f", "json")
    assert parse_header("assistant to=functions.f<|channel|>analysis<|constrain|>json") == \
        HarmonyHeader("assistant", "analysis", "functions.f", "json")
    assert parse_header("to=browser.search<|channel|>commentary") == \
        HarmonyHeader("tool", "commentary", "browser.search", "")
    assert parse_header("assistant<|channel|>final") == HarmonyHeader("assistant", "final")


def test_start_from_the_prompt() -> None:
    base = "<|start|>user<|message|>Hi<|end|>"
    p = HarmonyParser.for_prompt(base + "<|start|>assistant")
    assert p.feed("<|channel|>final<|message|>Hello<|return|>").content == "Hello"
    # a prefilled answer or reasoning: the reply continues that message
    p = HarmonyParser.for_prompt(base + "<|start|>assistant<|channel|>final<|message|>Once")
    assert p.feed(" upon").content == " upon"
    p = HarmonyParser.for_prompt(base + "<|start|>assistant<|channel|>analysis<|message|>Hmm")
    assert p.feed(", so").thinking == ", so"
    # a prompt without harmony (or that closed its last message) starts a new assistant message
    assert HarmonyParser.for_prompt("plain").feed("<|channel|>final<|message|>x").content == "x"


def test_uses_harmony() -> None:
    assert uses_harmony("<|start|>{{ .Role }}<|message|>{{ .Content }}<|end|>", "gptoss")
    assert uses_harmony("<|start|>x<|end|>", "qwen2", "gpt-oss")
    assert not uses_harmony("<|start|>x<|end|>", "qwen2")
    assert not uses_harmony("<|im_start|>x<|im_end|>", "gptoss")
