"""Qwen3's chat template (the Jinja template Qwen3 checkpoints ship in tokenizer_config.json, which llama.cpp's
converter stores as the GGUF's ``tokenizer.chat_template``; the same for the dense and the MoE models) rendered
by tandem's JinjaChatTemplate exactly as transformers' apply_chat_template renders it: system prompts, the
thinking switch, earlier turns' reasoning (given as a message's thinking or inline <think>), tools, tool calls
and tool responses."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.text.render import JinjaChatTemplate, Message, Tool, ToolCall

pytest.importorskip("transformers")

TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()

WEATHER = Tool("get_weather", "Get the weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                                  "required": ["city"]})
CASES = {
    "system-and-user": ([Message("system", "You are terse."), Message("user", "Hi")], {}),
    "no-thinking": ([Message("user", "Hi")], {"enable_thinking": False}),
    "thinking-on": ([Message("user", "Hi")], {"enable_thinking": True}),
    "history-with-reasoning": ([
        Message("user", "2+2?"),
        Message("assistant", "4", thinking="Add them."),
        Message("user", "and 3+3?"),
        Message("assistant", "<think>\nAdd again.\n</think>\n\n6"),
        Message("user", "thanks"),
    ], {}),
    "last-assistant-turn": ([Message("user", "2+2?"), Message("assistant", "4", thinking="Add them.")],
                            {"add_generation_prompt": False}),
    "tools": ([
        Message("system", "Use tools."),
        Message("user", "Weather in Paris and Rome?"),
        Message("assistant", "Checking.", tool_calls=[ToolCall("get_weather", {"city": "Paris"}),
                                                     ToolCall("get_weather", {"city": "Rome"})]),
        Message("tool", "18C", tool_name="get_weather"),
        Message("tool", "21C", tool_name="get_weather"),
    ], {"tools": [WEATHER]}),
}


def _hf(messages: list[Message]) -> list[dict]:
    """The same conversation as a transformers user writes it (OpenAI-style tool calls)."""
    out = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.content}
        if m.thinking:
            d["reasoning_content"] = m.thinking
        if m.tool_calls:
            d["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                               for c in m.tool_calls]
        out.append(d)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_qwen3_template_renders_as_transformers(case: str) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages, kw = CASES[case]
    kw = dict(kw)
    tools = kw.pop("tools", None)
    add_gen = kw.pop("add_generation_prompt", True)
    ours = JinjaChatTemplate(TEMPLATE).render(messages, add_generation_prompt=add_gen, tools=tools, **kw)
    theirs, _ = render_jinja_template(conversations=[_hf(messages)], chat_template=TEMPLATE,
                                      tools=[t.to_dict() for t in tools] if tools else None,
                                      add_generation_prompt=add_gen, **kw)
    assert ours == theirs[0]
    assert ours.count("<|im_start|>") == ours.count("<|im_end|>") + (1 if add_gen else 0)
    if kw.get("enable_thinking") is False:
        assert ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    if case == "history-with-reasoning":  # reasoning of turns before the last query is dropped
        assert "Add them." not in ours and "Add again." not in ours
