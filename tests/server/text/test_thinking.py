"""Reasoning told apart from the answer: the tags inferred from Go and Jinja templates as Ollama infers them,
and the streamed split, fed whole and one character at a time (the same result either way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelfile.gotemplate import parse_template
from server.text.render import FALLBACK_TEMPLATES
from server.text.thinking import ThinkingParser, infer_thinking_tags, jinja_thinking_tags


def split(output: str, chunks: list[str] | None = None, opened: bool = False) -> tuple[str, str]:
    parser = ThinkingParser("<think>", "</think>", opened=opened)
    thinking, content = [], []
    for chunk in chunks if chunks is not None else [output]:
        t, c = parser.feed(chunk)
        thinking.append(t)
        content.append(c)
    t, c = parser.finish()
    return "".join(thinking) + t, "".join(content) + c


CASES = [
    # (output, prompt opened <think>, thinking, content)
    ("<think>\nAdd them.\n</think>\n\n4", False, "Add them.\n", "4"),
    ("  <think>Add them.</think>4", False, "Add them.", "4"),
    ("4, no reasoning", False, "", "4, no reasoning"),
    ("\nAdd them.\n</think>\n\n4", True, "Add them.\n", "4"),  # the prompt ended with <think>
    ("Hmm, <tool_call>{\"name\": \"f\"}</tool_call> no.</think>Done", True,
     "Hmm, <tool_call>{\"name\": \"f\"}</tool_call> no.", "Done"),
    ("cut off in the middle </thi", True, "cut off in the middle </thi", ""),
    ("<thin", False, "", "<thin"),
    ("<think>a</think>b</think>c", False, "a", "b</think>c"),
]


@pytest.mark.parametrize("output,opened,thinking,content", CASES)
def test_split_whole_and_one_char_at_a_time(output, opened, thinking, content) -> None:
    assert split(output, opened=opened) == (thinking, content)
    assert split(output, list(output), opened=opened) == (thinking, content)


def test_reasoning_streams_before_the_closing_tag_arrives() -> None:
    parser = ThinkingParser("<think>", "</think>")
    assert parser.feed("<think>") == ("", "")
    assert parser.feed("Let me see") == ("Let me see", "")
    assert parser.feed(" </th") == (" ", "")  # maybe the closing tag: held
    assert parser.feed("ink>  Paris") == ("", "Paris")


QWEN3_GO = """{{- if or .System .Tools }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if (and $.IsThinkSet (and .Thinking (or $last (gt $i $.LastUserIndex)))) -}}
<think>{{ .Thinking }}</think>
{{ end -}}
{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}
{{- end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ if and $.IsThinkSet (not $.Think) -}}
<think>

</think>

{{ end -}}
{{ end }}
{{- end }}"""


def test_tags_inferred_from_go_templates() -> None:
    assert infer_thinking_tags(parse_template(QWEN3_GO)) == ("<think>", "</think>")
    spaced = """{{- range $i, $_ := .Messages }}{{ if .Thinking }}
        Thought: {{ .Thinking }}  End of thought.
    {{ end }}{{ end }}"""
    assert infer_thinking_tags(parse_template(spaced)) == ("Thought:", "End of thought.")
    # .Thinking outside a range over .Messages, or under another range, says nothing
    assert infer_thinking_tags(parse_template("{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}")) == ("", "")
    nested = "{{ range .Messages }}{{ range .Other }}<think>{{ .Thinking }}</think>{{ end }}{{ end }}"
    assert infer_thinking_tags(parse_template(nested)) == ("", "")
    for name, text in FALLBACK_TEMPLATES.items():
        assert infer_thinking_tags(parse_template(text)) == ("", ""), name


def test_tags_of_jinja_templates() -> None:
    qwen3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
    assert jinja_thinking_tags(qwen3) == ("<think>", "</think>")
    assert jinja_thinking_tags("{% for m in messages %}{{ m.content }}{% endfor %}") == ("", "")


def test_prompt_opens_thinking() -> None:
    assert ThinkingParser.prompt_opens("<|im_start|>assistant\n<think>\n", "<think>")
    assert not ThinkingParser.prompt_opens("<|im_start|>assistant\n<think>\n\n</think>\n\n", "<think>")
