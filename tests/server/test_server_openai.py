"""The OpenAI-compatible API (/v1) with the real `openai` client over real HTTP, plus the raw SSE shape."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server_thread import SPEC_FIELDS, ServerThread, make_store


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("openai"))) as server:
        yield server


@pytest.fixture
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="ignored", max_retries=0, timeout=120)


MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]


def test_chat_completion(client: openai.OpenAI) -> None:
    c = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, temperature=0, seed=3)
    assert c.object == "chat.completion" and c.id.startswith("chatcmpl-") and c.model == "tiny"
    assert c.system_fingerprint == "fp_ollama"
    [choice] = c.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason == "length"
    assert isinstance(choice.message.content, str)
    assert c.usage.completion_tokens == 6 and c.usage.total_tokens == c.usage.prompt_tokens + 6
    spec = c.model_extra["speculative_decoding"]
    assert SPEC_FIELDS <= set(spec) and spec["drafter"] == "model+suffix"


def test_chat_completion_response_format(client: openai.OpenAI) -> None:
    c = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=200, temperature=0,
                                       response_format={"type": "json_object"})
    json.loads(c.choices[0].message.content)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    c = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=200, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    assert isinstance(json.loads(c.choices[0].message.content)["ok"], bool)
    assert c.choices[0].finish_reason == "stop"
    assert c.model_extra["speculative_decoding"]["drafter"] == "model+suffix"  # constrained requests keep speculation


def test_chat_completion_stream(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=0, seed=3)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.created for c in chunks}) == 1 and len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert SPEC_FIELDS <= set(finish[0].model_extra["speculative_decoding"])
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 6
    assert usage.model_extra["speculative_decoding"]["drafter"] == "model+suffix"


def test_completions(client: openai.OpenAI) -> None:
    c = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=5, temperature=0)
    assert c.object == "text_completion" and c.id.startswith("cmpl-")
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5
    assert SPEC_FIELDS <= set(c.model_extra["speculative_decoding"])
    chunks = list(client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=5, temperature=0,
                                            stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == c.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert "tiny:latest" in ids
    m = client.models.retrieve("tiny:latest")
    assert m.id == "tiny:latest" and m.object == "model" and m.owned_by == "library" and m.created > 0
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_errors(client: openai.OpenAI, srv: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MSGS)
    assert e.value.body["message"] == "model 'nope' not found" and e.value.body["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[])
    assert e.value.body["message"] == "[] is too short - 'messages'"
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    assert e.value.body["message"].startswith('unsupported JSON schema keyword "uniqueItems" at schema')
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}])
    with httpx.Client(base_url=srv.url) as h:
        r = h.post("/v1/chat/completions", content=b"{nope")
        assert r.status_code == 400
        assert r.json() == {"error": {"message": "invalid character 'n' looking for beginning of object key string",
                                      "type": "invalid_request_error", "param": None, "code": None}}
        r = h.post("/v1/chat/completions", json={"model": "tiny", "messages": MSGS, "temperature": "hot"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("json: cannot unmarshal string")


def test_raw_sse_and_tandem_options(srv: ServerThread) -> None:
    body = {"model": "tiny", "messages": MSGS, "stream": True, "max_tokens": 4,
            "options": {"draft_num_predict": 0}}  # tandem extension: any Ollama/tandem option
    with httpx.Client(base_url=srv.url, timeout=120) as h:
        with h.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[-1]["choices"][0]["finish_reason"] == "length" and events[-1]["choices"][0]["delta"] == {}
    assert events[-1]["speculative_decoding"]["drafter"] == "none"
