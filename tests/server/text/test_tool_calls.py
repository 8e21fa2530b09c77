"""Tool calls parsed out of streamed output in each model format: fed whole and one character at a time
(the same content and calls either way), text that only looks like a call released as content, and the
format learned from Go and Jinja templates as Ollama learns it."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelfile.gotemplate import parse_template
from server.text.render import FALLBACK_TEMPLATES
from server.text.tool_calls import (
    FUNCTIONGEMMA,
    GEMMA4,
    JSON_OBJECT,
    LLAMA3,
    QWEN,
    ToolCallFormat,
    ToolCallParser,
    format_for_go_template,
    format_for_jinja_template,
    gemma_arguments,
    go_tool_call_tag,
)

NAMES = ("get_weather", "get_time")
PARIS = ("get_weather", {"city": "Paris"})


def parse(fmt: ToolCallFormat, chunks: list[str]) -> tuple[str, list[tuple[str, dict]], list[int]]:
    parser = ToolCallParser(fmt, NAMES)
    content, calls = [], []
    for chunk in chunks:
        text, found = parser.feed(chunk)
        content.append(text)
        calls += found
    text, found = parser.finish()
    content.append(text)
    calls += found
    return "".join(content), [(c.name, c.arguments) for c in calls], [c.index for c in calls]


CASES = [
    # (format, output, content, calls)
    (QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [PARIS]),
    (QWEN, 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     "Let me check. ", [PARIS, ("get_time", {"tz": "CET"})]),
    (QWEN, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),  # cut off by EOS
    (QWEN, 'The <tool_ tag is not a call, nor is <tool_call> here.', "The <tool_ tag is not a call, nor is "
                                                                     "<tool_call> here.", []),
    (QWEN, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', '<tool_call>{"name": "rm_rf", '
                                                                       '"arguments": {}}</tool_call>', []),
    (QWEN, 'a "}" {brace} <tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
     'a "}" {brace} ', [PARIS]),
    # Qwen2.5-Coder answers calls as (fenced) bare JSON too, which counts only at the start of the answer
    (QWEN, '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', "", [PARIS]),
    (QWEN, '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    (QWEN, '```json\n{"city": "Paris"}\n```', '```json\n{"city": "Paris"}\n```', []),
    (QWEN, '```python\nprint(1)\n```', '```python\nprint(1)\n```', []),
    (QWEN, 'See: {"name": "get_weather", "arguments": {"city": "Paris"}}',
     'See: {"name": "get_weather", "arguments": {"city": "Paris"}}', []),
    # wrapped in doubled braces, as Qwen2.5-Coder's shipped template teaches (server.text.template_errata)
    (QWEN, '<tool_call>\n{{"name": "get_weather", "arguments": {"city": "Paris"}}}\n</tool_call>', "", [PARIS]),
    (QWEN, '{{"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [PARIS]),
    (QWEN, '<tool_call>{{"city": "Paris"}}</tool_call>', '<tool_call>{{"city": "Paris"}}</tool_call>', []),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (LLAMA3, '\n[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time"}]', "",
     [PARIS, ("get_time", {})]),
    (LLAMA3, 'It is sunny. {"name": "get_weather", "parameters": {"city": "Paris"}}',
     'It is sunny. {"name": "get_weather", "parameters": {"city": "Paris"}}', []),
    (JSON_OBJECT, '{"answer": 42, "note": "{not a call}"}', '{"answer": 42, "note": "{not a call}"}', []),
    (JSON_OBJECT, '{"get_weather": {"city": "Paris"}}', "", [PARIS]),
    (JSON_OBJECT, '{"name": "get_weather", "arguments": {"city": "Par', '{"name": "get_weather", "arguments": '
                                                                      '{"city": "Par', []),
    (ToolCallFormat("[TOOL_CALLS]"), 'ok [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     "ok ", [PARIS]),
    (FUNCTIONGEMMA, '<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>', "",
     [PARIS]),
    (FUNCTIONGEMMA, 'Sure.<start_function_call>call:get_time{tz:<escape>CET, Europe<escape>,hours:24,dst:true}'
                    '<end_function_call>', "Sure.", [("get_time", {"tz": "CET, Europe", "hours": 24, "dst": True})]),
    (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "", [PARIS]),
    (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:[1,2],opts:{metric:true}}<tool_call|>'
             '<|tool_call>call:get_time{}<tool_call|>', "",
     [("get_weather", {"city": "Paris", "days": [1, 2], "opts": {"metric": True}}), ("get_time", {})]),
    (GEMMA4, 'I use <|tool_call> as text', "I use <|tool_call> as text", []),
]


@pytest.mark.parametrize("fmt,output,content,calls", CASES)
def test_calls_parsed_whole_and_one_char_at_a_time(fmt, output, content, calls) -> None:
    whole = parse(fmt, [output])
    assert whole[:2] == (content, calls)
    assert whole[2] == list(range(len(calls)))  # indexes count the calls of the answer
    assert parse(fmt, list(output)) == whole


def test_text_is_released_as_soon_as_it_cannot_be_a_call() -> None:
    parser = ToolCallParser(QWEN, NAMES)
    assert parser.feed("Hello <to") == ("Hello ", [])  # "<to" may start the tag: held
    assert parser.feed("day") == ("<today", [])  # it did not
    assert parser.feed(' <tool_call>{"name": "get_weather", ') == (" ", [])
    text, calls = parser.feed('"arguments": {"city": "Paris"}}</tool_call>')
    assert text == "" and [(c.name, c.arguments) for c in calls] == [PARIS]

    bare = ToolCallParser(LLAMA3, NAMES)
    assert bare.feed("  ") == ("", [])
    assert bare.feed("Sunny") == ("  Sunny", [])  # not a JSON answer: everything after is content at once
    assert bare.feed(' {"name": "get_weather"}') == (' {"name": "get_weather"}', [])


def test_gemma_arguments() -> None:
    assert gemma_arguments("{a:<escape>x, y<escape>,b:-1.5,c:null,d:[<escape>p<escape>,2]}", "<escape>") == {
        "a": "x, y", "b": -1.5, "c": None, "d": ["p", 2]}
    assert gemma_arguments('{city:"Paris",unit:celsius}', "<escape>") == {"city": "Paris", "unit": "celsius"}
    assert gemma_arguments("{a:<escape>open", "<escape>") is None


QWEN25_GO = FALLBACK_TEMPLATES["chatml"]  # Ollama's qwen2.5 template
LLAMA32_GO = """{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>
{{- if .ToolCalls }}
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}
{{ .Content }}
{{- end }}{{ if not $last }}<|eot_id|>{{ end }}
{{- end }}{{ end }}"""
MISTRAL_GO = """{{- range .Messages }}{{- if .ToolCalls }}[TOOL_CALLS] [{{- range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}{{- end }}]</s>{{ else }}{{ .Content }}{{ end }}{{- end }}"""


def test_format_learned_from_go_templates() -> None:
    assert go_tool_call_tag(parse_template(QWEN25_GO)) == "<tool_call>"
    assert format_for_go_template(parse_template(QWEN25_GO)) == QWEN
    assert go_tool_call_tag(parse_template(LLAMA32_GO)) == "{"
    assert format_for_go_template(parse_template(LLAMA32_GO)) == LLAMA3
    assert go_tool_call_tag(parse_template(MISTRAL_GO)) == "[TOOL_CALLS] ["
    assert go_tool_call_tag(parse_template("{{ .Prompt }}")) == "{"  # no .ToolCalls: bare JSON


def test_format_learned_from_jinja_templates() -> None:
    qwen3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
    assert format_for_jinja_template(qwen3) == QWEN
    assert format_for_jinja_template("{{ '<start_function_call>call:' }}") == FUNCTIONGEMMA
    assert format_for_jinja_template("{{ '<|tool_call>call:' + name }}") == GEMMA4
    assert format_for_jinja_template("{% if tools %}{{ tools | tojson }}{% endif %}") == LLAMA3


def test_a_shipped_template_that_teaches_doubled_braces_is_corrected() -> None:
    """Qwen2.5-Coder's GGUF template shows its tool-call example as {{"name": ...}} inside a Jinja string (so
    verbatim): the model copies it. The prompt tandem renders shows single braces, as Ollama's template does."""
    from server.text.render import JinjaChatTemplate, Message, Tool
    from server.text.template_errata import corrected_chat_template

    shipped = ('{%- if tools %}{{- "<|im_start|>system\\n<tools>" }}{%- for t in tools %}{{ t | tojson }}{%- endfor %}'
               '{{- "</tools>\\n<tool_call>\\n{{\\"name\\": <function-name>, \\"arguments\\": '
               '<args-json-object>}}\\n</tool_call><|im_end|>\\n" }}{%- endif %}'
               '{%- for m in messages %}{{ "<|im_start|>" + m.role + "\\n" + m.content + "<|im_end|>\\n" }}'
               '{%- endfor %}')
    tool = Tool("get_weather", "", {"type": "object", "properties": {}})
    before = JinjaChatTemplate(shipped).render([Message("user", "hi")], tools=[tool])
    after = JinjaChatTemplate(corrected_chat_template(shipped)).render([Message("user", "hi")], tools=[tool])
    assert '{{"name": <function-name>' in before
    assert '\n{"name": <function-name>, "arguments": <args-json-object>}\n' in after
    assert corrected_chat_template("{{ messages }}") == "{{ messages }}"
