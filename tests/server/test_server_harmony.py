"""gpt-oss models as Ollama serves them: the thinking capability from the model family, tools from the
template, think levels rendered as harmony's reasoning effort ("max" as "high"), and the output split by
harmony channel. tandem cannot run gpt-oss's weights, so the models here are tiny GGUFs that declare the
`gptoss` architecture (enough for /api/show and prompt rendering), and the split is checked on a real
gpt-oss transcript through the splitter a request gets."""

from __future__ import annotations

import httpx
import ollama
import pytest

import importer.create
from blobs.model import load_stored_model
from server.text.render import Message, Tool
from importer import CreateRequest, create_model
from server.prompting import ModelPrompting
from server.reply import ReplyPiece, ReplySplitter
from tests.server_thread import ServerThread, make_store
from tests.tiny_gguf import TinySpec, write_tiny_gguf

# The shape of Ollama's gpt-oss template, cut down: a harmony system turn with the reasoning effort and
# the tools as TypeScript, the messages, and the generation prompt "<|start|>assistant".
GO_TEMPLATE = """<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
{{- if .ThinkLevel }}

Reasoning: {{ .ThinkLevel }}
{{- end }}
{{- if .Tools }}

# Tools

## functions

namespace functions {
{{- range .Tools }}
type {{ .Function.Name }} = (_: any) => any;
{{- end }}
} // namespace functions
{{- end }}<|end|>
{{- range .Messages }}
{{- if eq .Role "assistant" }}
{{- if .Thinking }}<|start|>assistant<|channel|>analysis<|message|>{{ .Thinking }}<|end|>{{ end }}
{{- if .Content }}<|start|>assistant<|channel|>final<|message|>{{ .Content }}<|end|>{{ end }}
{{- else }}<|start|>{{ .Role }}<|message|>{{ .Content }}<|end|>
{{- end }}
{{- end }}<|start|>assistant"""

# The same from a GGUF's Jinja chat template (the HF gpt-oss template reads `reasoning_effort`).
JINJA_TEMPLATE = """<|start|>system<|message|>Reasoning: {{ reasoning_effort | default("medium") }}
{%- if tools %}

namespace functions {
{%- for t in tools %}
type {{ t.function.name }} = (_: any) => any;
{%- endfor %}
}
{%- endif %}<|end|>
{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get-weather", "description": "Get the weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TRANSCRIPT = ("<|channel|>analysis<|message|>Need the weather for Paris.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
              '{"city":"Paris"}<|call|>')


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("harmony")
    store = make_store(d)
    write_tiny_gguf(d / "oss.gguf", TinySpec(arch="gptoss", seed=3, chat_template=None))
    write_tiny_gguf(d / "oss-jinja.gguf", TinySpec(arch="gptoss", seed=3, chat_template=JINJA_TEMPLATE))
    write_tiny_gguf(d / "qwen-jinja.gguf", TinySpec(arch="qwen2", seed=3, chat_template=JINJA_TEMPLATE))
    oss, _ = store.add_file(d / "oss.gguf")
    oss_jinja, _ = store.add_file(d / "oss-jinja.gguf")
    qwen, _ = store.add_file(d / "qwen-jinja.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importer.create, "check_runnable", lambda summary, role: None)
        create_model(store, CreateRequest(model="oss", files={"oss.gguf": oss}, template=GO_TEMPLATE))
        create_model(store, CreateRequest(model="oss-jinja", files={"oss-jinja.gguf": oss_jinja}))
    create_model(store, CreateRequest(model="not-oss", files={"qwen-jinja.gguf": qwen}))
    with ServerThread(store) as server:
        yield server


def rendered(http: httpx.Client, body: dict) -> str:
    r = http.post("/api/chat", json={**body, "_debug_render_only": True})
    assert r.status_code == 200, r.text
    return r.json()["_debug_info"]["rendered_template"]


def test_capabilities(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url)
    assert client.show("oss").capabilities == ["completion", "tools", "thinking"]
    assert client.show("oss-jinja").capabilities == ["completion", "tools", "thinking"]
    # the Jinja template on another family: tools, but no thinking (no <think> tags, not gpt-oss)
    assert client.show("not-oss").capabilities == ["completion", "tools"]


@pytest.mark.parametrize("model", ["oss", "oss-jinja"])
def test_think_levels_are_the_reasoning_effort(srv: ServerThread, model: str) -> None:
    with httpx.Client(base_url=srv.url, timeout=600) as http:
        body = {"model": model, "messages": USER}
        assert "Reasoning: medium" in rendered(http, body)  # unset: gpt-oss thinks at its default effort
        assert "Reasoning: medium" in rendered(http, {**body, "think": True})
        for level in ("low", "medium", "high"):
            assert f"Reasoning: {level}" in rendered(http, {**body, "think": level})
        assert "Reasoning: high" in rendered(http, {**body, "think": "max"})  # harmony knows no "max"
        text = rendered(http, {**body, "tools": [WEATHER]})
        assert "type get_weather = " in text and text.endswith("<|start|>assistant")  # renamed for harmony
        r = http.post("/api/generate", json={"model": model, "prompt": "Hi", "think": "max",
                                             "_debug_render_only": True})
        assert "Reasoning: high" in r.json()["_debug_info"]["rendered_template"]
        # not-oss renders the same template but cannot think
        r = http.post("/api/chat", json={"model": "not-oss", "messages": USER, "think": "low"})
        assert (r.status_code, r.json()) == (400, {"error": '"not-oss" does not support thinking'})


@pytest.mark.parametrize("step", [1, 5, len(TRANSCRIPT)])
def test_reply_split_by_channel(srv: ServerThread, step: int) -> None:
    prompting = ModelPrompting(load_stored_model(srv.store, "oss"))
    assert prompting.harmony
    tools = [Tool.from_dict(WEATHER)]
    prompt = prompting.chat_prompt([Message("user", "Weather in Paris?")], tools, think=False)
    # think false does not stop gpt-oss reasoning, and Ollama's harmony parser still reports it
    splitter = ReplySplitter.for_request(prompting, prompt, tools, False)
    whole = ReplyPiece()
    for piece in [splitter.feed(TRANSCRIPT[i:i + step]) for i in range(0, len(TRANSCRIPT), step)] + [splitter.finish()]:
        whole.content += piece.content
        whole.thinking += piece.thinking
        whole.tool_calls += piece.tool_calls
    assert (whole.thinking, whole.content) == ("Need the weather for Paris.", "")
    [call] = whole.tool_calls
    assert (call.name, dict(call.arguments), call.index) == ("get-weather", {"city": "Paris"}, 0)  # the user's name
    assert call.id.startswith("call_")
    # raw prompts are not parsed; other models keep their own split
    assert ReplySplitter.for_request(prompting, "x", (), False, raw=True).passthrough
    other = ModelPrompting(load_stored_model(srv.store, "not-oss"))
    assert not other.harmony and ReplySplitter.for_request(other, prompt, (), None).passthrough
