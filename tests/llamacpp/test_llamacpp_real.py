"""A real model through the llamacpp engine: Qwen2.5-Coder-1.5B-Instruct with its 0.5B as DRAFT, served with
``PARAMETER engine llamacpp``. tandem renders the tools into the prompt and parses the call back, exactly as for the
native engine; a JSON schema in ``format`` reaches llama-server's grammar; the answers carry speculation statistics."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from blobs import BlobStore
from engine.contract.llamacpp_launch import find_llama_server
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.realmodels import qwen_gguf
from tests.server.test_server_tools_real import WEATHER
from tests.server_thread import ServerThread

pytestmark = [pytest.mark.realmodel,
              pytest.mark.skipif(find_llama_server() is None, reason="llama-server not installed")]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    target, draft = qwen_gguf("1.5b"), qwen_gguf("0.5b")
    if target is None or draft is None:
        pytest.skip("Qwen2.5-Coder GGUFs not installed")
    store = BlobStore(tmp_path_factory.mktemp("models"))
    t, _ = store.add_file(target)
    d, _ = store.add_file(draft)
    create_model(store, CreateRequest(model="coder", files={"model.gguf": t}, draft_files={"draft.gguf": d},
                                      parameters={"engine": "llamacpp", "temperature": 0.0, "num_ctx": 2048,
                                                  "draft_schedule": "fixed"}))
    with ServerThread(store, Settings(num_thread=2, num_parallel=1)) as s:
        yield s


def test_a_tool_call_through_llama_cpp_is_parsed_and_its_result_used(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url, timeout=600)
    messages = [{"role": "system", "content": "You are a helpful assistant. When a tool result is given, answer "
                                              "the user's question with it in one sentence."},
                {"role": "user", "content": "What is the weather like in Paris right now?"}]
    first = client.chat(model="coder", messages=messages, tools=[WEATHER], options={"num_predict": 64})
    [call] = first.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments["city"].lower().startswith("paris")
    assert first.message.content == ""
    shown = httpx.get(f"{srv.url}/api/ps").json()
    [loaded] = shown["models"]
    assert loaded["engine"]["backend"] == "llamacpp" and loaded["engine"]["speculative_method"] == "draft-simple"
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_name": "get_weather", "content": "22 degrees Celsius, sunny"}]
    final = client.chat(model="coder", messages=messages, tools=[WEATHER], options={"num_predict": 64})
    assert not final.message.tool_calls and "22" in final.message.content


def test_a_json_schema_holds_through_llama_servers_grammar(srv: ServerThread) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "population_millions": {"type": "number"},
                                               "landmarks": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "population_millions", "landmarks"]}
    r = httpx.post(f"{srv.url}/api/chat", timeout=600, json={
        "model": "coder", "stream": False, "format": schema, "options": {"num_predict": 160, "temperature": 0},
        "messages": [{"role": "user", "content": "Describe Paris as JSON with two landmarks."}]}).json()
    answer = json.loads(r["message"]["content"])
    assert set(answer) == {"name", "population_millions", "landmarks"} and "paris" in answer["name"].lower()
    assert isinstance(answer["population_millions"], (int, float)) and all(isinstance(x, str) for x in answer["landmarks"])
    assert r["drafter"] == "model" and r["draft_n"] > 0 and r["draft_n_accepted"] > 0

    oai = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x").chat.completions.create(
        # greedy, and two landmarks asked for: sampled, the list ran past max_tokens now and then (cut JSON)
        model="coder", max_tokens=160, temperature=0, seed=1,
        messages=[{"role": "user", "content": "Describe Rome as JSON with two landmarks."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    assert set(json.loads(oai.choices[0].message.content)) == {"name", "population_millions", "landmarks"}
