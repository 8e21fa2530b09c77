"""Anthropic's Messages API (/v1/messages) with the real `anthropic` client over real HTTP, plus the raw SSE
events and the error shape.

The tool-call tests force the tiny model's answer with a structured-output schema of `const` values (as
test_server_tools does with `format`): the output is then exactly the JSON call, which the `calls` model's
template makes a tool call. The `thinker` model's template opens `<think>`, so a thinking reply is all
reasoning."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

from server.gojson import INTERNAL_ERROR, ApiError
from server.routes.anthropic import _sse_response
from server.routes.anthropic_request import chat_messages_of
from tests.server.test_server_tools import forced, tool_models_store
from tests.server_thread import SPEC_FIELDS, ServerThread

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"name": "get_weather", "description": "Get the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# Sent raw: the newest `anthropic` clients dropped the sampling fields from create(), the server still reads
# them (older clients and Claude Code send them); `options` is tandem's extension for any Ollama/tandem option.
GREEDY = {"temperature": 0, "options": {"seed": 3}}
# Anthropic's structured outputs (`output_config.format`), sent raw so that older clients work too.
CALL = {**GREEDY, "output_config": {"format": {"type": "json_schema",
                                               "schema": forced("get_weather", {"city": "Paris"})}}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tool_models_store(tmp_path_factory.mktemp("anthropic"))) as server:
        yield server


@pytest.fixture
def client(srv: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="ignored", max_retries=0, timeout=600)


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=600) as c:
        yield c


def sse(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of a raw SSE answer; the name and the data's `type` always agree."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name
            events.append((name, data))
    return events


def test_message(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="tiny", max_tokens=6, messages=[{"role": "user", "content": "Say hi"}],
                               extra_body=GREEDY)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "tiny"
    [block] = m.content
    assert block.type == "text" and block.text
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 6 and m.usage.input_tokens > 0
    spec = m.model_extra["speculative_decoding"]
    assert SPEC_FIELDS <= set(spec) and spec["drafter"] == "model+suffix"


def test_stream_equals_message(client: anthropic.Anthropic) -> None:
    kwargs = dict(model="tiny", max_tokens=6, messages=[{"role": "user", "content": "Say hi"}], extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.content[0].text == text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 6 and final.usage.input_tokens == whole.usage.input_tokens


def test_raw_stream_events(http: httpx.Client) -> None:
    body = {"model": "tiny", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Say hi"}]}
    with http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for n, d in events if n == "content_block_delta")
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": start["usage"]["input_tokens"], "output_tokens": 4}
    assert SPEC_FIELDS <= set(delta["speculative_decoding"])


def test_system_prompt_and_count_tokens(client: anthropic.Anthropic) -> None:
    msgs = [{"role": "user", "content": "Say hi"}]
    plain = client.messages.count_tokens(model="tiny", messages=msgs).input_tokens
    as_string = client.messages.count_tokens(model="tiny", messages=msgs, system="You are terse.").input_tokens
    as_blocks = client.messages.count_tokens(model="tiny", messages=msgs,
                                             system=[{"type": "text", "text": "You are terse."}]).input_tokens
    assert as_string == as_blocks > plain > 0
    m = client.messages.create(model="tiny", max_tokens=3, messages=msgs, system="You are terse.", extra_body=GREEDY)
    assert m.usage.input_tokens == as_string  # the same prompt, rendered and counted once each way
    same = client.messages.create(model="tiny", max_tokens=3, messages=msgs, extra_body=GREEDY,
                                  system=[{"type": "text", "text": "You are terse."}])
    assert same.content[0].text == m.content[0].text


def test_tool_use_streamed_and_not(client: anthropic.Anthropic, http: httpx.Client) -> None:
    m = client.messages.create(model="calls", max_tokens=200, messages=USER, tools=[WEATHER], extra_body=CALL)
    assert m.stop_reason == "tool_use"
    [call] = m.content  # the call alone: no text around it
    assert call.type == "tool_use" and call.id.startswith("toolu_") and call.name == "get_weather"
    assert call.input == {"city": "Paris"}

    with client.messages.stream(model="calls", max_tokens=200, messages=USER, tools=[WEATHER],
                                extra_body=CALL) as stream:
        final = stream.get_final_message()
    [streamed] = final.content
    assert streamed.type == "tool_use" and streamed.input == {"city": "Paris"} and final.stop_reason == "tool_use"

    body = {"model": "calls", "max_tokens": 200, "messages": USER, "tools": [WEATHER], "stream": True, **CALL}
    with http.stream("POST", "/v1/messages", json=body) as r:
        events = sse(r)
    [(_, start)] = [e for e in events if e[0] == "content_block_start"]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert [d for n, d in events if n == "message_delta"][0]["delta"]["stop_reason"] == "tool_use"

    # The result goes back as a tool_result block answering the call's id; the turn renders and runs.
    history = USER + [
        {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "22C"}]}]
    follow = client.messages.create(model="calls", max_tokens=4, tools=[WEATHER], messages=history, extra_body=GREEDY)
    assert follow.stop_reason == "max_tokens" and follow.usage.input_tokens > m.usage.input_tokens


def test_tool_choice(client: anthropic.Anthropic, http: httpx.Client) -> None:
    # "none": the tools are not offered, so the same JSON is just the answer.
    m = client.messages.create(model="calls", max_tokens=200, messages=USER, tools=[WEATHER],
                               tool_choice={"type": "none"}, extra_body=CALL)
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"]
    assert json.loads(m.content[0].text) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    m = client.messages.create(model="calls", max_tokens=200, messages=USER, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"}, extra_body=CALL)
    assert m.stop_reason == "tool_use"
    r = http.post("/v1/messages", json={"model": "calls", "max_tokens": 5, "messages": USER, "tools": [WEATHER],
                                        "tool_choice": {"type": "tool", "name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_tool_result_conversion() -> None:
    msgs = chat_messages_of(USER + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look it up.", "signature": ""},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "no network"}],
             "is_error": True},
            {"type": "text", "text": "Try again?"}]}])
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "user"]
    assistant, tool, user = msgs[1:]
    # a system message mid-conversation (Ollama's own tool-route test sends one) passes through, as Ollama's does
    mid = chat_messages_of(USER + [{"role": "system", "content": [{"type": "text", "text": "Budget update."}]}])
    assert [(m.role, m.content) for m in mid[1:]] == [("system", "Budget update.")]
    assert (assistant.content, assistant.thinking) == ("Checking.", "Look it up.")
    [call] = assistant.tool_calls
    assert (call.id, call.name, dict(call.arguments)) == ("toolu_1", "get_weather", {"city": "Paris"})
    assert (tool.tool_name, tool.tool_call_id, tool.content) == ("get_weather", "toolu_1", "Error: no network")
    assert user.content == "Try again?"


def test_thinking(client: anthropic.Anthropic, http: httpx.Client) -> None:
    kwargs = dict(model="thinker", max_tokens=12, messages=USER, extra_body=GREEDY,
                  thinking={"type": "enabled", "budget_tokens": 1024})
    m = client.messages.create(**kwargs)
    [block] = m.content  # the template opens <think>: everything is reasoning
    assert block.type == "thinking" and block.thinking and m.stop_reason == "max_tokens"
    with client.messages.stream(**kwargs) as stream:
        streamed = "".join(e.thinking for e in stream if e.type == "thinking")
    assert streamed == block.thinking

    off = client.messages.create(**{**kwargs, "thinking": {"type": "disabled"}})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text

    # A thinking block sent back is the assistant's reasoning; the turn renders and runs.
    follow = client.messages.create(**{**kwargs, "messages": USER + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": block.thinking, "signature": ""},
                                          {"type": "text", "text": "Sunny."}]},
        {"role": "user", "content": "And tomorrow?"}]})
    assert follow.content[0].type == "thinking"

    r = http.post("/v1/messages", json={**kwargs, "model": "tiny"})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": '"tiny" does not support thinking'}}


def test_errors(client: anthropic.Anthropic, http: httpx.Client) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=5, messages=USER)
    assert e.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "model 'nope' not found"}}
    with pytest.raises(anthropic.NotFoundError):  # a stream that cannot start is a plain HTTP error too
        with client.messages.stream(model="nope", max_tokens=5, messages=USER) as stream:
            stream.get_final_message()

    r = http.post("/v1/messages", json={"model": "tiny", "messages": USER})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: field required"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}
    ok = {"model": "tiny", "max_tokens": 5, "messages": USER}
    bad = [{**ok, "max_tokens": "5"}, {**ok, "max_tokens": 0},
           {**ok, "messages": [{"role": "tool", "content": "x"}]},  # a tool result is a user block
           {**ok, "messages": [{"role": "user", "content": [image]}]},  # tandem runs text models
           {**ok, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}]  # a server tool
    for body in [b"{nope"] + [json.dumps(b).encode() for b in bad]:
        r = http.post("/v1/messages", content=body)
        assert r.status_code == 400, body
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert "Traceback" not in r.text
    r = http.post("/v1/messages/count_tokens", json={"model": "nope", "messages": USER})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_error_after_the_stream_began() -> None:
    """A failure once events went out is Anthropic's `error` event; an unexpected one says nothing of itself."""

    async def collect(failure: Exception) -> list[dict]:
        async def events():
            yield {"event": "ping", "data": "{}"}
            raise failure

        response = await _sse_response(events())
        return [e async for e in response.body_iterator]

    [_, crashed] = asyncio.run(collect(ApiError(500, "engine crashed")))
    assert crashed["event"] == "error"
    assert json.loads(crashed["data"]) == {"type": "error", "error": {"type": "api_error", "message": "engine crashed"}}
    [_, unexpected] = asyncio.run(collect(RuntimeError("/secret/path")))
    assert json.loads(unexpected["data"])["error"] == {"type": "api_error", "message": INTERNAL_ERROR}
