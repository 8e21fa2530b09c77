"""server.text.render: Ollama's prompt building with real library templates, HF Jinja templates and fallbacks.

The TEMPLATEs below are Ollama library templates reproduced from memory; the expected prompts were
worked out by hand from Go's trim rules and Ollama's template.Execute.
"""

from __future__ import annotations

import datetime

import pytest

from modelfile.gotemplate import GoTemplate, TemplateError
from server.text.render import (
    render_chat_window,
    DEFAULT_TEMPLATE,
    FALLBACK_TEMPLATES,
    InsertNotSupported,
    JinjaChatTemplate,
    Message,
    Tool,
    ToolCall,
    fallback_template_for,
    render_chat,
    render_generate,
    render_jinja_chat,
    supports_insert,
)

QWEN25_CODER = """{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>
{{- else if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""

LLAMA32 = """<|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023

{{ if .System }}{{ .System }}
{{- end }}
{{- if .Tools }}When you receive a tool call response, use the output to format an answer to the orginal user question.

You are a helpful assistant with tool calling capabilities.
{{- end }}<|eot_id|>
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>
{{- if and $.Tools $last }}

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.

{{ range $.Tools }}
{{- . }}
{{ end }}
{{ .Content }}<|eot_id|>
{{- else }}

{{ .Content }}<|eot_id|>
{{- end }}{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>
{{- if .ToolCalls }}
{{ range .ToolCalls }}
{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}

{{ .Content }}
{{- end }}{{ if not $last }}<|eot_id|>{{ end }}
{{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}
{{- end }}"""

GEMMA3 = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if or (eq .Role "user") (eq .Role "system") }}<start_of_turn>user
{{ .Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""

LEGACY_CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>"
)

# Qwen2.5-Instruct's tokenizer.chat_template (HF), reproduced from memory.
QWEN25_JINJA = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

SYSTEM = Message("system", "You are helpful.")
CHAT = [Message("user", "Hi"), Message("assistant", "Hello!"), Message("user", "How are you?")]

WEATHER = Tool(
    "get_weather",
    "Get the weather",
    {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]},
)
# api.Tool's String(): encoding/json in struct field order (type, required, properties), compact.
WEATHER_FUNCTION_JSON = (
    '{"name":"get_weather","description":"Get the weather","parameters":{"type":"object",'
    '"required":["city"],"properties":{"city":{"type":"string","description":"The city"}}}}'
)
WEATHER_TOOL_JSON = '{"type":"function","function":' + WEATHER_FUNCTION_JSON + "}"
TOOL_CHAT = [
    Message("user", "Weather in Paris?"),
    Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
    Message("tool", "18C", tool_name="get_weather"),
]

MESSAGES_ECHO = "{{ range .Messages }}<{{ .Role }}:{{ .Content }}>{{ end }}"


def go(text: str) -> GoTemplate:
    return GoTemplate.parse(text)


# ---- Ollama library templates ------------------------------------------------------------------------


QWEN_EXPECTED_WITH_SYSTEM = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nHow are you?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_qwen25_coder_chat() -> None:
    tmpl = go(QWEN25_CODER)
    assert render_chat(tmpl, CHAT) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(tmpl, [SYSTEM, *CHAT]) == QWEN_EXPECTED_WITH_SYSTEM


def test_qwen25_coder_tools() -> None:
    prompt = render_chat(go(QWEN25_CODER), TOOL_CHAT, tools=[WEATHER])
    assert prompt == (
        "<|im_start|>system\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": ' + WEATHER_FUNCTION_JSON + "}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_coder_generate_and_insert() -> None:
    tmpl = go(QWEN25_CODER)
    assert supports_insert(tmpl)
    assert render_generate(tmpl, prompt="def f(", suffix="    return 1") == (
        "<|fim_prefix|>def f(<|fim_suffix|>    return 1<|fim_middle|>"
    )
    assert render_generate(tmpl, prompt="Hi", system="S") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama32_chat() -> None:
    assert render_chat(go(LLAMA32), [SYSTEM, *CHAT]) == (
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n"
        "You are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama32_tools() -> None:
    prompt = render_chat(go(LLAMA32), [Message("user", "Weather in Paris?")], tools=[WEATHER])
    assert prompt == (
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n"
        "When you receive a tool call response, use the output to format an answer to the orginal user question.\n\n"
        "You are a helpful assistant with tool calling capabilities.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper arguments "
        "that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
        "Do not use variables.\n\n" + WEATHER_TOOL_JSON + "\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama32_tool_call_history() -> None:
    prompt = render_chat(go(LLAMA32), TOOL_CHAT, tools=[WEATHER])
    assert prompt.endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city":"Paris"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n18C<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_gemma3_chat() -> None:
    assert render_chat(go(GEMMA3), [SYSTEM, *CHAT]) == (
        "<start_of_turn>user\nYou are helpful.<end_of_turn>\n"
        "<start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert not supports_insert(go(GEMMA3))
    with pytest.raises(InsertNotSupported, match="does not support insert"):
        render_generate(go(GEMMA3), prompt="a", suffix="b")


# ---- legacy (.System/.Prompt/.Response) templates ---------------------------------------------------


def test_legacy_chat_renders_per_turn_and_cuts_at_response() -> None:
    assert render_chat(go(LEGACY_CHATML), [SYSTEM, *CHAT]) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>"
        "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_legacy_generate_and_prefill() -> None:
    tmpl = go(LEGACY_CHATML)
    assert render_generate(tmpl, prompt="Hi", system="S") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_generate(tmpl, prompt="Hi", response="Sure") == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure"
    )
    assert not supports_insert(tmpl)


def test_legacy_template_without_response_gets_it_appended() -> None:
    tmpl = go("[{{ .Prompt }}]")
    assert render_chat(tmpl, [Message("user", "a"), Message("assistant", "b"), Message("user", "c")]) == "[a]b[c]"


def test_legacy_system_mid_conversation_flushes_the_turn() -> None:
    tmpl = go("{{ if .System }}S:{{ .System }};{{ end }}U:{{ .Prompt }};A:{{ .Response }}|")
    msgs = [Message("user", "a"), Message("system", "s"), Message("user", "b"), Message("tool", "ignored")]
    assert render_chat(tmpl, msgs) == "U:a;A:|S:s;U:b;A:"


# ---- Ollama's Execute details -----------------------------------------------------------------------


def test_collate_merges_consecutive_roles_except_tool() -> None:
    tmpl = go("{{ .System }}|{{ range .Messages }}{{ .Role }}={{ .Content }};{{ end }}")
    msgs = [
        Message("system", "s1"), Message("system", "s2"), Message("user", "a"), Message("user", "b"),
        Message("assistant", "c"), Message("tool", "t1"), Message("tool", "t2"),
    ]
    assert render_chat(tmpl, msgs) == "s1\n\ns2|system=s1\n\ns2;user=a\n\nb;assistant=c;tool=t1;tool=t2;"


def test_image_tags() -> None:
    msgs = [
        Message("user", "look", images=[b"x"]),
        Message("assistant", "ok"),
        Message("user", "compare [img] and this", images=[b"y", b"z"]),
    ]
    assert render_chat(go(MESSAGES_ECHO), msgs) == (
        "<user:[img-0]look><assistant:ok><user:[img-2]compare [img-1] and this>"
    )
    # the images the engine gets are the tags' images, in tag order
    assert render_chat_window(go(MESSAGES_ECHO), msgs).images == [b"x", b"y", b"z"]


def test_truncation_drops_the_images_of_the_messages_it_drops() -> None:
    msgs = [
        Message("system", "be brief"),
        Message("user", "look", images=[b"old"]),
        Message("assistant", "ok"),
        Message("user", "and now", images=[b"new"]),
    ]
    window = render_chat_window(go(MESSAGES_ECHO), msgs, fits=lambda text: "look" not in text)
    assert window.text == "<system:be brief><assistant:ok><user:[img-0]and now>"
    assert window.images == [b"new"]


@pytest.mark.parametrize(
    "think, expected",
    [(None, "false//false"), (True, "true/medium/true"), (False, "false//true"), ("high", "true/high/true")],
)
def test_think_values(think: object, expected: str) -> None:
    tmpl = go("{{ .Think }}/{{ .ThinkLevel }}/{{ .IsThinkSet }}{{ range .Messages }}{{ end }}")
    assert render_chat(tmpl, CHAT, think=think) == expected
    assert render_generate(tmpl, prompt="p", think=think) == expected


def test_generate_with_history_and_system() -> None:
    history = [Message("user", "h"), Message("assistant", "ha")]
    assert render_generate(go(MESSAGES_ECHO), prompt="p", system="S", history=history) == (
        "<system:S><user:h><assistant:ha><user:p>"
    )


def test_truncation_keeps_system_and_last_message() -> None:
    msgs = [SYSTEM, Message("user", "u1"), Message("assistant", "a1"), Message("user", "u2")]
    tmpl = go(MESSAGES_ECHO)
    full = render_chat(tmpl, msgs)
    assert render_chat(tmpl, msgs, fits=lambda p: True) == full
    kept = "<system:You are helpful.><assistant:a1><user:u2>"
    assert render_chat(tmpl, msgs, fits=lambda p: len(p) <= len(kept)) == kept
    assert render_chat(tmpl, msgs, fits=lambda p: False) == "<system:You are helpful.><user:u2>"


def test_template_sees_go_shaped_values() -> None:
    tmpl = go(
        "{{ range .Tools }}{{ .Function.Name }}:{{ .Function.Parameters.Properties.city.Type }}"
        "|{{ json .Function.Parameters.Required }}{{ end }}"
        "{{ range .Messages }}{{ if .ToolCalls }}|{{ json . }}{{ end }}{{ if .ToolName }}|{{ .ToolName }}{{ end }}{{ end }}"
    )
    assert render_chat(tmpl, TOOL_CHAT, tools=[WEATHER]) == (
        'get_weather:string|["city"]'
        '|{"role":"assistant","content":"","tool_calls":[{"function":{"index":0,"name":"get_weather","arguments":{"city":"Paris"}}}]}'
        "|get_weather"
    )


def test_current_date_reaches_the_template() -> None:
    tmpl = go("Today: {{ currentDate }}{{ range .Messages }} {{ .Content }}{{ end }}")
    assert render_chat(tmpl, [Message("user", "x")], today=datetime.date(2025, 1, 2)) == "Today: 2025-01-02 x"


def test_message_and_tool_round_trip() -> None:
    raw = {
        "role": "Assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "function": {"index": 0, "name": "f", "arguments": {"a": 1}}}],
    }
    msg = Message.from_dict(raw)
    assert msg.role == "assistant"
    assert msg.tool_calls == [ToolCall("f", {"a": 1}, index=0, id="call_1")]
    assert msg.to_dict() == {**raw, "role": "assistant"}
    assert ToolCall.from_dict({"function": {"name": "g", "arguments": '{"b": 2}'}}).arguments == {"b": 2}
    tool = Tool.from_dict(WEATHER.to_dict())
    assert tool == WEATHER


# ---- Jinja (HF) chat templates ----------------------------------------------------------------------


def test_qwen_jinja_matches_ollama_template_for_plain_chat() -> None:
    messages = [SYSTEM, *CHAT]
    jinja = render_jinja_chat(QWEN25_JINJA, messages)
    assert jinja == QWEN_EXPECTED_WITH_SYSTEM
    assert jinja == render_chat(go(QWEN25_CODER), messages)
    assert jinja == render_chat(go(FALLBACK_TEMPLATES["chatml"]), messages)
    # without a system message HF adds Qwen's default, which Ollama ships as the model's SYSTEM
    default = Message("system", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    assert render_jinja_chat(QWEN25_JINJA, CHAT) == render_chat(go(QWEN25_CODER), [default, *CHAT])


def test_qwen_jinja_tool_calls_and_generation_prompt() -> None:
    prompt = render_jinja_chat(QWEN25_JINJA, TOOL_CHAT, tools=[WEATHER], add_generation_prompt=False)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' in prompt
    assert prompt.endswith("<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n")


def test_jinja_environment_matches_transformers() -> None:
    now = datetime.datetime(2024, 7, 1, 12, 0)
    tmpl = JinjaChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}\n{% endfor %}"
        "{% generation %}{{ strftime_now('%d %b %Y') }}{% endgeneration %}"
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}{{ eos_token }}",
        now=lambda: now,
    )
    out = tmpl.render([Message("user", "héllo <b>")], bos_token="<s>", eos_token="</s>")
    # trim_blocks drops the newline after a block tag; tojson keeps non-ASCII and HTML characters
    assert out == '<s>"héllo <b>"\n01 Jul 202401</s>'


def test_jinja_errors_become_template_errors() -> None:
    with pytest.raises(TemplateError, match="no tools here"):
        render_jinja_chat("{{ raise_exception('no tools here') }}", CHAT)
    with pytest.raises(TemplateError, match="chat template"):
        JinjaChatTemplate("{% for x in %}")
    with pytest.raises(TemplateError):  # the sandbox is immutable
        render_jinja_chat("{% set l = [] %}{{ l.append(1) }}", CHAT)


def test_jinja_extra_variables() -> None:
    out = render_jinja_chat("{{ 'on' if enable_thinking else 'off' }}", CHAT, extra={"enable_thinking": False})
    assert out == "off"


# ---- fallbacks ----------------------------------------------------------------------------------------


def test_fallback_selection() -> None:
    gemma_vocab = {"<bos>", "<start_of_turn>", "<end_of_turn>"}
    assert fallback_template_for("gemma3", gemma_vocab) == FALLBACK_TEMPLATES["gemma"]
    assert fallback_template_for("gemma3", set()) == FALLBACK_TEMPLATES["gemma"]
    assert fallback_template_for("llama", {"<|im_start|>", "<|im_end|>"}) == FALLBACK_TEMPLATES["chatml"]
    llama3_vocab = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
    assert fallback_template_for("llama", llama3_vocab) == FALLBACK_TEMPLATES["llama3"]
    assert fallback_template_for("qwen2", set()) == FALLBACK_TEMPLATES["chatml"]
    assert fallback_template_for("llama", {"<s>", "</s>"}) == DEFAULT_TEMPLATE


def test_fallback_templates_render() -> None:
    messages = [SYSTEM, Message("user", "Hi")]
    assert render_chat(go(FALLBACK_TEMPLATES["gemma"]), messages) == (
        "<start_of_turn>user\nYou are helpful.<end_of_turn>\n<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    assert render_chat(go(FALLBACK_TEMPLATES["llama3"]), messages) == (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render_chat(go(FALLBACK_TEMPLATES["chatml"]), messages) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_generate(go(DEFAULT_TEMPLATE), prompt="raw text", system="ignored by the template") == "raw text"
