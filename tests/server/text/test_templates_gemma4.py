"""A Gemma 4 style chat template (``<|turn>role ... <turn|>``, a system turn carrying ``<|think|>``, assistant turns
as ``model`` with their thought channel stripped, tool calls in Gemma's ``call:name{...}`` syntax with
``<|"|>``-quoted strings, an empty thought channel after the generation prompt when thinking is off) renders
through server.text.render exactly as transformers' chat template renderer does for the same messages.

The template (tests/hf_tiny_gemma4.CHAT_TEMPLATE) is written for the tests in the constructs Gemma 4's own
template uses (macros that recurse, namespaces, ``dictsort``, ``split``, ``trim``, ``is mapping``/``is sequence`` tests, ``default``), not copied."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

from modelfile.gotemplate import GoTemplate  # noqa: E402
from server.text.render import (  # noqa: E402
    FALLBACK_TEMPLATES,
    JinjaChatTemplate,
    Message,
    Tool,
    ToolCall,
    fallback_template_for,
    render_chat,
)
from tests.hf_tiny_gemma4 import CHAT_TEMPLATE as GEMMA4_STYLE  # noqa: E402


WEATHER = Tool("get_weather", "Current weather", {"type": "object", "required": ["city"],
                                                  "properties": {"city": {"type": "string"},
                                                                 "metric": {"type": "boolean"}}})

CHATS = {
    "plain": [Message("user", "  Hi there \n")],
    "system and turns": [Message("system", "Be brief."), Message("user", "Hi"),
                         Message("assistant", "<|channel>thought\nshort<channel|>Hello!"), Message("user", "More")],
    "tool call": [Message("user", "Weather in Paris?"),
                  Message("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Paris", "metric": True,
                                                                                "days": [1, 2]}),)),
                  Message("tool", "18C", tool_name="get_weather")],
}


def _hf(messages: list[Message], **kwargs) -> str:
    """transformers' rendering of the same messages (as the dicts an HF user passes)."""
    from server.text.render import _hf_message

    out = render_jinja_template([[_hf_message(m) for m in messages]], chat_template=GEMMA4_STYLE, bos_token="<bos>",
                                eos_token="<eos>", **kwargs)
    return out[0][0] if isinstance(out, tuple) else out[0]


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("thinking", [None, False, True])
def test_gemma4_style_template_matches_transformers(name, thinking):
    messages = CHATS[name]
    tools = [WEATHER] if name == "tool call" else None
    extra = {} if thinking is None else {"enable_thinking": thinking}
    ours = JinjaChatTemplate(GEMMA4_STYLE).render(messages, add_generation_prompt=True, bos_token="<bos>",
                                                  eos_token="<eos>", tools=tools, **extra)
    theirs = _hf(messages, add_generation_prompt=True, tools=[t.to_dict() for t in tools] if tools else None, **extra)
    assert ours == theirs
    assert ours.startswith("<bos>") and ours.endswith("<|turn>model\n" + ("" if thinking else
                                                                          "<|channel>thought\n<channel|>"))


def test_gemma4_style_rendering_is_what_the_format_says():
    out = JinjaChatTemplate(GEMMA4_STYLE).render(CHATS["system and turns"], bos_token="<bos>")
    assert out == ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
                   "<|turn>user\nMore<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")


def test_gemma4_fallback_renders_the_turn_format():
    """A gemma4 GGUF without a chat template gets the Go fallback, which renders plain chats as the Jinja
    template does (less the BOS text: the tokenizer adds it)."""
    assert fallback_template_for("gemma4", {"<|turn>", "<turn|>", "<start_of_turn>"}) == FALLBACK_TEMPLATES["gemma4"]
    assert fallback_template_for("gemma4", set()) == FALLBACK_TEMPLATES["gemma4"]
    go = GoTemplate.parse(FALLBACK_TEMPLATES["gemma4"])
    for messages in ([Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"),
                      Message("user", "More")], [Message("user", "Hi")]):
        jinja = JinjaChatTemplate(GEMMA4_STYLE).render(messages, bos_token="<bos>")
        assert render_chat(go, messages) == jinja.removeprefix("<bos>")
