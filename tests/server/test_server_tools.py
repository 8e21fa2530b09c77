"""Tools and thinking over real HTTP with the real clients (`ollama`, `openai`, `langchain_ollama`), on tiny
models whose TEMPLATE has a tools or a thinking branch.

A random tiny model never writes a tool call by itself, so the call tests force its answer with a `format`
schema of `const` values: the output is then exactly the JSON call `{"name": "get_weather", "arguments": ...}`,
which the model's template (bare-JSON calls, as Llama 3's) makes a tool call. The thinking model's template
opens `<think>` at the end of the prompt, so everything the model writes is reasoning until `</think>`."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from pydantic import BaseModel

from server.text.render import FALLBACK_TEMPLATES
from importer import CreateRequest, create_model
from server.routes.openai import _message_from_openai
from tests.server.text.test_templates_qwen3 import TEMPLATE as QWEN3_JINJA
from tests.server_thread import ServerThread, make_store, ndjson, write_pair
from tests.tiny_gguf import TinySpec, write_tiny_gguf

# Tool calls as bare JSON objects (Llama 3's way), in the tiny vocabulary's ChatML turns.
CALLS_TEMPLATE = """{{- if .Tools }}<|im_start|>system
Call a function by answering with {"name": <name>, "parameters": <arguments>}:
{{ range .Tools }}{{ .Function }}
{{ end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "assistant" }}<|im_start|>assistant
{{ if .ToolCalls }}{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}{{ .Content }}{{ end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>ipython
{{ .Content }}<|im_end|>
{{ else }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}"""

THINK_TEMPLATE = """{{- if .ThinkLevel }}<|im_start|>system
Reasoning: {{ .ThinkLevel }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ if $.Think }}<think>{{ end }}{{ end }}
{{- end }}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def tool_models_store(d):
    """A store with "tiny" (ChatML, no tools, no thinking), "calls" (CALLS_TEMPLATE: tools) and "thinker"
    (THINK_TEMPLATE), the last two a tiny target/draft pair at temperature 0: the API routes' tests share it."""
    from importer import CreateRequest, create_model
    from tests.server_thread import make_store, write_pair

    store = make_store(d)
    target, draft = write_pair(d)
    t, _ = store.add_file(target)
    dr, _ = store.add_file(draft)
    for name, template, params in [("calls", CALLS_TEMPLATE, {"num_predict": 160}),
                                   ("thinker", THINK_TEMPLATE, {"num_predict": 12})]:
        create_model(store, CreateRequest(model=name, files={"target.gguf": t}, draft_files={"draft.gguf": dr},
                                          template=template, parameters={"temperature": 0.0, **params}))
    return store


def forced(name: str, arguments: dict) -> dict:
    """A format schema whose only conforming output is this call."""
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": {"const": arguments}},
            "required": ["name", "arguments"]}


CALL = forced("get_weather", {"city": "Paris"})
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tools")
    store = make_store(d)  # "tiny": a ChatML chat template without tools or thinking
    target, draft = write_pair(d)
    t, _ = store.add_file(target)
    dr, _ = store.add_file(draft)
    for name, template, params in [("calls", CALLS_TEMPLATE, {"num_predict": 160}),
                                   ("qwen", FALLBACK_TEMPLATES["chatml"], {"num_predict": 8}),
                                   ("thinker", THINK_TEMPLATE, {"num_predict": 12})]:
        create_model(store, CreateRequest(model=name, files={"target.gguf": t}, draft_files={"draft.gguf": dr},
                                          template=template, parameters={"temperature": 0.0, **params}))
    write_tiny_gguf(d / "qwen3.gguf", TinySpec(arch="qwen2", seed=1, context_length=4096, chat_template=QWEN3_JINJA))
    q3, _ = store.add_file(d / "qwen3.gguf")
    create_model(store, CreateRequest(model="jinja", files={"qwen3.gguf": q3}, parameters={"temperature": 0.0}))
    with ServerThread(store) as server:
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=600) as c:
        yield c


def test_capabilities_follow_the_template(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url)
    assert client.show("tiny").capabilities == ["completion"]
    assert client.show("calls").capabilities == ["completion", "tools"]
    assert client.show("qwen").capabilities == ["completion", "tools"]
    assert client.show("thinker").capabilities == ["completion", "thinking"]
    assert client.show("jinja").capabilities == ["completion", "tools", "thinking"]


def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
        city: The city
    """
    return "sunny"


def test_ollama_client_tool_call_streamed_and_not(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url, timeout=600)
    r = client.chat(model="calls", messages=USER, tools=[get_weather], format=CALL)
    [call] = r.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert r.message.content == "" and r.done_reason == "stop"

    parts = list(client.chat(model="calls", messages=USER, tools=[get_weather], format=CALL, stream=True))
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and with_calls[0].message.tool_calls[0].function.arguments == {"city": "Paris"}
    assert "".join(p.message.content for p in parts) == ""
    assert parts[-1].done

    # The same JSON without tools is just the answer.
    plain = client.chat(model="calls", messages=USER, format=CALL)
    assert json.loads(plain.message.content) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert not plain.message.tool_calls


def test_native_shape_and_speculation(http: httpx.Client) -> None:
    r = http.post("/api/chat", json={"model": "calls", "messages": USER, "tools": [WEATHER], "format": CALL,
                                     "stream": False})
    msg = r.json()["message"]
    [call] = msg["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == 13
    assert call["function"] == {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}
    assert msg == {"role": "assistant", "content": "", "tool_calls": [call]}
    # tools do not turn speculation off: the draft model still drafts
    r = http.post("/api/chat", json={"model": "calls", "messages": USER, "tools": [WEATHER], "stream": False})
    out = r.json()
    assert out["drafter"] == "model+suffix" and out["draft_n"] > 0 and "tool_calls" not in out["message"]
    assert out["message"]["content"]  # random text, not a call: passed through as content


def test_tool_results_rendered_back(http: httpx.Client) -> None:
    history = USER + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "22C and sunny"}]
    r = http.post("/api/chat", json={"model": "qwen", "messages": history, "tools": [WEATHER],
                                     "_debug_render_only": True})
    text = next(v for k, v in r.json().items() if "debug" in k)["rendered_template"]
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tools, through Ollama's qwen2.5 template
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n22C and sunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")

    r = http.post("/api/chat", json={"model": "jinja", "messages": history, "tools": [WEATHER], "think": False,
                                     "_debug_render_only": True})
    text = next(v for k, v in r.json().items() if "debug" in k)["rendered_template"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n22C and sunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # think false: enable_thinking=False


def test_openai_tool_call_streamed_and_not(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=600)
    fmt = {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL}}
    c = client.chat.completions.create(model="calls", messages=USER, tools=[WEATHER], response_format=fmt,
                                       temperature=0)
    choice = c.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(client.chat.completions.create(model="calls", messages=USER, tools=[WEATHER],
                                                 response_format=fmt, temperature=0, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    [with_call] = [d for d in deltas if d.tool_calls]
    [tc] = with_call.tool_calls
    assert tc.index == 0 and tc.id.startswith("call_") and tc.type == "function"
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and deltas[0].role == "assistant"

    # The result goes back by tool_call_id; the request renders and runs.
    follow = client.chat.completions.create(model="calls", temperature=0, tools=[WEATHER], max_tokens=4, messages=USER + [
        {"role": "assistant", "content": None, "tool_calls": [c.choices[0].message.tool_calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "22C"}])
    assert follow.choices[0].finish_reason == "length"


def test_openai_tool_message_named_by_call_id() -> None:
    history = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18C"}]
    assistant, _ = _message_from_openai(history[0], history)
    tool, _ = _message_from_openai(history[1], history)
    assert assistant.tool_calls[0].arguments == {"city": "Rome"} and assistant.tool_calls[0].id == "call_abc"
    assert (tool.role, tool.tool_name, tool.tool_call_id, tool.content) == ("tool", "get_weather", "call_abc", "18C")


def test_langchain_bind_tools_and_structured_output(srv: ServerThread) -> None:
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model="calls", base_url=srv.url, temperature=0, format=CALL)
    msg = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]

    class Person(BaseModel):
        """A person."""

        name: str
        age: int

    llm = ChatOllama(model="calls", base_url=srv.url, temperature=0, format=forced("Person", {"name": "Ada", "age": 36}))
    assert llm.with_structured_output(Person, method="function_calling").invoke("Who?") == Person(name="Ada", age=36)


def raw_output(http: httpx.Client, prompt: str, n: int = 12) -> str:
    r = http.post("/api/generate", json={"model": "thinker", "prompt": prompt, "raw": True, "stream": False,
                                         "think": False, "options": {"num_predict": n}})
    return r.json()["response"]


def rendered(http: httpx.Client, body: dict) -> str:
    r = http.post("/api/chat", json={**body, "_debug_render_only": True})
    assert r.status_code == 200, r.text
    return next(v for k, v in r.json().items() if "debug" in k)["rendered_template"]


def test_thinking_on_chat_streamed_and_not(http: httpx.Client) -> None:
    body = {"model": "thinker", "messages": USER}
    prompt = rendered(http, body)  # think unset on a thinking model: it thinks (Ollama's default)
    assert prompt.endswith("<|im_start|>assistant\n<think>") and "Reasoning: medium" in prompt
    expected = raw_output(http, prompt).lstrip()
    assert expected and "</think>" not in expected

    out = http.post("/api/chat", json={**body, "stream": False}).json()
    assert out["message"] == {"role": "assistant", "content": "", "thinking": expected}
    parts = ndjson(http.post("/api/chat", json=body))
    assert "".join(p["message"].get("thinking", "") for p in parts) == expected
    assert all(p["message"]["content"] == "" for p in parts)
    assert sum(1 for p in parts if p["message"].get("thinking")) > 1  # streamed as it comes

    # think false: no <think> in the prompt and the answer is all content
    prompt = rendered(http, {**body, "think": False})
    assert prompt.endswith("<|im_start|>assistant\n") and "Reasoning" not in prompt
    out = http.post("/api/chat", json={**body, "think": False, "stream": False}).json()
    assert out["message"] == {"role": "assistant", "content": raw_output(http, prompt)}

    assert "Reasoning: high" in rendered(http, {**body, "think": "high"})
    # with a format too a thinking model thinks unless told not to (the format holds after the reasoning)
    assert rendered(http, {**body, "format": "json"}).endswith("<|im_start|>assistant\n<think>")
    assert rendered(http, {**body, "format": "json", "think": False}).endswith("<|im_start|>assistant\n")
    assert rendered(http, {**body, "format": "json", "think": True}).endswith("<|im_start|>assistant\n<think>")


def test_thinking_on_generate(http: httpx.Client) -> None:
    out = http.post("/api/generate", json={"model": "thinker", "prompt": "Weather in Paris?", "think": True,
                                           "stream": False}).json()
    prompt = "<|im_start|>system\nReasoning: medium<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n" \
             "<|im_start|>assistant\n<think>"
    assert out["thinking"] == raw_output(http, prompt).lstrip() and out["response"] == ""
    parts = ndjson(http.post("/api/generate", json={"model": "thinker", "prompt": "Weather in Paris?", "think": True}))
    assert "".join(p.get("thinking", "") for p in parts) == out["thinking"]


def test_openai_reasoning(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=600)
    c = client.chat.completions.create(model="thinker", messages=USER, reasoning_effort="low", temperature=0)
    msg = c.choices[0].message
    assert msg.content == "" and msg.model_extra["reasoning"]
    chunks = list(client.chat.completions.create(model="thinker", messages=USER, reasoning_effort="low",
                                                 temperature=0, stream=True))
    streamed = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning") or "" for ch in chunks if ch.choices)
    assert streamed == msg.model_extra["reasoning"]
    none = client.chat.completions.create(model="thinker", messages=USER, reasoning_effort="none", temperature=0)
    assert none.choices[0].message.content and "reasoning" not in (none.choices[0].message.model_extra or {})


@pytest.mark.parametrize("path,body,status,message", [
    ("/api/chat", {"model": "tiny", "messages": USER, "tools": [WEATHER]}, 400, '"tiny" does not support tools'),
    ("/api/chat", {"model": "tiny", "messages": USER, "think": True}, 400, '"tiny" does not support thinking'),
    ("/api/chat", {"model": "tiny", "messages": USER, "think": "high"}, 400, '"tiny" does not support thinking'),
    ("/api/generate", {"model": "tiny", "prompt": "x", "think": "low"}, 400, '"tiny" does not support thinking'),
    ("/api/chat", {"model": "thinker", "messages": USER, "think": "deep"}, 400,
     'invalid think value: "deep" (must be "high", "medium", "low", "max", true, or false)'),
    ("/api/generate", {"model": "thinker", "prompt": "x", "think": 1}, 400,
     'think must be a boolean or string ("high", "medium", "low", "max", true, or false)'),
    ("/api/chat", {"model": "calls", "messages": USER, "tools": [{"type": "function"}]}, 400,
     "invalid tool: a function with a name is required"),
])
def test_refusals_native(http: httpx.Client, path: str, body: dict, status: int, message: str) -> None:
    r = http.post(path, json={**body, "stream": False})
    assert (r.status_code, r.json()) == (status, {"error": message})


def test_refusals_openai(srv: ServerThread, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=600)
    for kwargs, message in [({"reasoning_effort": "high"}, '"tiny" does not support thinking'),
                            ({"tools": [WEATHER]}, '"tiny" does not support tools'),
                            ({"reasoning_effort": "bogus"}, 'invalid reasoning value: "bogus"')]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=USER, **kwargs)
        assert message in e.value.message
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "reasoning": {"effort": "low"}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # "none" turns thinking off, which every model can do
    ok = client.chat.completions.create(model="tiny", messages=USER, reasoning_effort="none", max_tokens=2)
    assert ok.choices[0].finish_reason == "length"
