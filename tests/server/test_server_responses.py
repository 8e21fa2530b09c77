"""OpenAI's Responses API (/v1/responses) with the real `openai` client over real HTTP: text, streamed and not,
instructions, the token limit, function calls and their results, structured output, reasoning, errors; the
raw events and the whole response are checked against the client's own types, strictly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from server.gojson import INTERNAL_ERROR, ApiError
from server.reply import ReplyPiece
from server.routes.responses import ResponsesRequest, _chat_history, _messages, _options, _response_object
from server.routes.responses_output import OutputBuilder
from tests.server.test_server_tools import CALL, WEATHER, tool_models_store
from tests.server_thread import SPEC_FIELDS, ServerThread

# The Responses API's flattened function tool.
TOOL = {"type": "function", **WEATHER["function"]}
CALL_FORMAT = {"format": {"type": "json_schema", "name": "call", "schema": CALL}}
SEEDED = {"options": {"seed": 3}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tool_models_store(tmp_path_factory.mktemp("responses"))) as server:
        yield server


@pytest.fixture
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="ignored", max_retries=0, timeout=600)


def raw_events(srv: ServerThread, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE stream as sent, each event validated against the client's event union (strictly: every field
    the type requires is there) and its `event:` line matching its type."""
    with httpx.Client(base_url=srv.url, timeout=600) as h, h.stream("POST", "/v1/responses",
                                                                      json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names, datas = lines[0::2], lines[1::2]
    events = [json.loads(d.removeprefix("data: ")) for d in datas]
    assert [n.removeprefix("event: ") for n in names] == [e["type"] for e in events]
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_streamed_and_not(client: openai.OpenAI, srv: ServerThread) -> None:
    kwargs: dict[str, Any] = dict(model="tiny", input="Say hi", max_output_tokens=6, temperature=0,
                                  extra_body=SEEDED)
    r = client.responses.create(**kwargs)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # 6 tokens, no stop
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.status == "incomplete" and msg.content[0].type == "output_text"
    assert r.output_text == msg.content[0].text and r.output_text
    assert r.usage.output_tokens == 6 and r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 6 and r.temperature == 0 and r.tools == [] and r.tool_choice == "auto"
    spec = r.model_extra["speculative_decoding"]
    assert SPEC_FIELDS <= set(spec) and spec["drafter"] == "model+suffix"

    events = list(client.responses.create(**kwargs, stream=True))
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * (len(types) - 8) + [
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.incomplete"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    final = events[-1].response
    assert final.output_text == r.output_text and final.usage.output_tokens == 6 and final.id == events[0].response.id
    assert SPEC_FIELDS <= set(final.model_extra["speculative_decoding"])

    # the raw stream, and the whole response, pass the client's types strictly
    # (how many deltas carry the text depends on how many tokens each speculative round committed, which the adaptive
    # depth decides from measured times: the same text may come in another number of pieces)
    raw = raw_events(srv, {"model": "tiny", "input": "Say hi", "max_output_tokens": 6, "temperature": 0, **SEEDED})
    assert _deltas_once([e["type"] for e in raw]) == _deltas_once(types)
    assert "".join(e["delta"] for e in raw if e["type"] == "response.output_text.delta") == r.output_text
    whole = httpx.post(srv.url + "/v1/responses", json={"model": "tiny", "input": "Say hi", "max_output_tokens": 6,
                                                        "temperature": 0, **SEEDED}, timeout=600).json()
    assert Response.model_validate(whole).output_text == r.output_text


def _deltas_once(types: list[str]) -> list[str]:
    """Event types with each run of text deltas counted once."""
    return [t for i, t in enumerate(types) if t != "response.output_text.delta" or i == 0 or types[i - 1] != t]


def test_instructions_are_a_system_message(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model="tiny", max_output_tokens=4, temperature=0, extra_body=SEEDED)
    bare = client.responses.create(input="Say hi", **kwargs)
    told = client.responses.create(input="Say hi", instructions="You are terse.", **kwargs)
    developer = client.responses.create(input=[{"role": "developer", "content": "You are terse."},
                                               {"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}],
                                        **kwargs)
    assert told.usage.input_tokens > bare.usage.input_tokens
    assert told.instructions == "You are terse."
    # instructions and a developer message render the same prompt
    assert (developer.usage.input_tokens, developer.output_text) == (told.usage.input_tokens, told.output_text)


def test_function_call_and_its_output(client: openai.OpenAI, srv: ServerThread) -> None:
    r = client.responses.create(model="calls", input="Weather in Paris?", tools=[TOOL], text=CALL_FORMAT,
                                temperature=0)
    assert r.status == "completed"
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"} and r.output_text == ""
    assert r.tools[0].name == "get_weather" and r.tools[0].type == "function"

    raw = raw_events(srv, {"model": "calls", "input": "Weather in Paris?", "tools": [TOOL], "text": CALL_FORMAT,
                           "temperature": 0})
    [done] = [e for e in raw if e["type"] == "response.function_call_arguments.done"]
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    assert [e["type"] for e in raw if "text" in e["type"]] == []  # no message: the answer is the call
    item = raw[-1]["response"]["output"][0]
    assert raw[-1]["type"] == "response.completed" and item["type"] == "function_call"
    assert item["name"] == "get_weather" and done["item_id"] == item["id"]

    # The result goes back as function_call_output by call_id, after the call item itself.
    follow = client.responses.create(model="calls", tools=[TOOL], max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "22C and sunny"}])
    assert follow.status == "incomplete" and follow.usage.input_tokens > r.usage.input_tokens


def test_input_items_become_chat_messages() -> None:
    req = ResponsesRequest(model="m", instructions="Be brief.", input=[
        {"role": "user", "content": "Weather in Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Ask the tool."}]},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_abc", "output": "18C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C in Rome."}]}])
    messages, images = _messages(_chat_history(req))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"] and not images
    assert messages[0].content == "Be brief."
    call = messages[2]
    assert call.thinking == "Ask the tool." and call.content == ""
    assert (call.tool_calls[0].name, dict(call.tool_calls[0].arguments)) == ("get_weather", {"city": "Rome"})
    assert (messages[3].tool_name, messages[3].content) == ("get_weather", "18C")
    assert messages[4].content == "18C in Rome."


def test_json_schema_and_json_object(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = client.responses.create(model="tiny", input="Say hi", temperature=0, max_output_tokens=200,
                                text={"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": True}})
    assert r.status == "completed" and r.incomplete_details is None
    assert isinstance(json.loads(r.output_text)["ok"], bool) and r.output[0].status == "completed"
    assert r.text.format.type == "json_schema"
    # the client's stream helper accumulates the same response
    with client.responses.stream(model="tiny", input="Say hi", temperature=0, max_output_tokens=200, text={
            "format": {"type": "json_schema", "name": "r", "schema": schema}}) as stream:
        assert stream.get_final_response().output_text == r.output_text
    r = client.responses.create(model="tiny", input="Say hi", temperature=0, max_output_tokens=200,
                                text={"format": {"type": "json_object"}})
    json.loads(r.output_text)


def test_reasoning(client: openai.OpenAI, srv: ServerThread) -> None:
    r = client.responses.create(model="thinker", input="Weather in Paris?", reasoning={"effort": "low"},
                                temperature=0)
    reasoning, message = r.output  # the template opens <think>: all 12 tokens are reasoning
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    [summary] = reasoning.summary
    assert summary.type == "summary_text" and summary.text
    assert message.type == "message" and r.output_text == "" and r.status == "incomplete"
    assert r.usage.output_tokens_details.reasoning_tokens > 0 and r.reasoning.effort == "low"

    raw = raw_events(srv, {"model": "thinker", "input": "Weather in Paris?", "reasoning": {"effort": "low"},
                           "temperature": 0})
    deltas = [e["delta"] for e in raw if e["type"] == "response.reasoning_summary_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == summary.text
    [done] = [e for e in raw if e["type"] == "response.reasoning_summary_text.done"]
    assert done["text"] == summary.text

    off = client.responses.create(model="thinker", input="Weather in Paris?", reasoning={"effort": "none"},
                                  temperature=0)
    assert [item.type for item in off.output] == ["message"] and off.output_text


def test_errors(client: openai.OpenAI, srv: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="nope", input="hi")
    assert e.value.body["message"] == "model 'nope' not found" and e.value.body["type"] == "not_found_error"
    refused = [
        (dict(model="tiny", input="hi", previous_response_id="resp_1"), "previous_response_id is not supported"),
        (dict(model="tiny", input="hi", max_output_tokens=0), "Invalid 'max_output_tokens'"),
        (dict(model="tiny", input="hi", tools=[TOOL]), '"tiny" does not support tools'),
        (dict(model="tiny", input="hi", tools=[{"type": "web_search"}]), "unsupported tool type: web_search"),
        (dict(model="tiny", input="hi", reasoning={"effort": "high"}), '"tiny" does not support thinking'),
        (dict(model="tiny", input=[]), "input is required"),
        (dict(model="tiny", input=[{"type": "item_reference", "id": "x"}]), "unsupported input item type"),
        (dict(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://example.com/cat.png"}]}]), "invalid image input"),
        (dict(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]),
         '"tiny" does not support vision'),
        (dict(model="tiny", input="hi", text={"format": {"type": "json_schema", "name": "x",
                                                         "schema": {"type": "array", "uniqueItems": True}}}),
         'unsupported JSON schema keyword "uniqueItems"'),
    ]
    for kwargs, message in refused:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**kwargs)
        assert message in e.value.body["message"], (kwargs, e.value.body)
        assert e.value.body["type"] == "invalid_request_error"
    with httpx.Client(base_url=srv.url) as h:
        r = h.post("/v1/responses", content=b"{nope")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = h.post("/v1/responses", json={"model": "tiny", "input": "hi", "temperature": "hot"})
        assert r.status_code == 400 and r.json() == {"error": {
            "message": "json: cannot unmarshal string into Go struct field ResponsesRequest.temperature of type float64",
            "type": "invalid_request_error", "param": None, "code": None}}


def test_a_failure_mid_stream_is_an_error_event() -> None:
    req = ResponsesRequest(model="m", input="hi")
    out = OutputBuilder(_response_object(req, [], _options(req), None))
    events = out.start() + out.feed(ReplyPiece(content="Hel")) + out.fail(ApiError(500, "the engine stopped"))
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)
    error, failed = events[-2:]
    assert error == {"type": "error", "sequence_number": len(events) - 2, "code": "server_error",
                     "message": "the engine stopped", "param": None}
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "the engine stopped"}
    assert failed["response"]["output"][0]["content"] == []  # the message never finished


def test_a_bug_mid_stream_shows_no_exception_text(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: OutputBuilder, piece: ReplyPiece, tokens: int = 0) -> list:
        raise RuntimeError("secret /internal/path")

    monkeypatch.setattr(OutputBuilder, "feed", broken)
    events = list(client.responses.create(model="tiny", input="hi", max_output_tokens=2, stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[2].message == INTERNAL_ERROR and events[2].code == "server_error"
    assert events[3].response.status == "failed" and events[3].response.error.message == INTERNAL_ERROR
    with pytest.raises(openai.InternalServerError) as e:
        client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    assert e.value.body["message"] == INTERNAL_ERROR


@pytest.mark.parametrize("body", [
    {"input": {"role": "user"}}, {"input": 3}, {"input": ["hi"]}, {"input": [{"role": ["user"], "content": "x"}]},
    {"input": [{"role": "tool", "content": "x"}]}, {"input": [{"role": "user", "content": 3}]},
    {"input": [{"role": "user", "content": ["x"]}]}, {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": 7}]},
    {"input": [{"type": {"x": 1}}]}, {"input": "hi", "tools": [{"type": "function"}]},
    {"input": "hi", "tools": ["f"]}, {"input": "hi", "tool_choice": 5},
    {"input": "hi", "text": {"format": {"type": "json_schema"}}}, {"input": "hi", "text": {"format": "json"}},
    {"input": "hi", "reasoning": {"effort": 5}}, {"input": "hi", "instructions": ["x"]},
    {"input": "hi", "max_output_tokens": -1},
])
def test_malformed_requests_are_client_errors(srv: ServerThread, body: dict[str, Any]) -> None:
    r = httpx.post(srv.url + "/v1/responses", json={"model": "calls", **body}, timeout=600)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and "Traceback" not in error["message"]
