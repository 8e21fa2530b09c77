"""The whole tool loop on a real model, with speculation on: Qwen2.5-Coder-1.5B-Instruct (its GGUF's Jinja
template has a tools branch and teaches `<tool_call>` JSON) with the 0.5B as DRAFT, greedy. The model calls
get_weather with a city, the call comes back parsed in `message.tool_calls`, the tool's result goes back as
a `role: tool` message, and the final answer uses it."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.realmodels import qwen_gguf
from tests.server_thread import ServerThread

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}


@pytest.mark.realmodel
def test_qwen_coder_calls_a_tool_and_uses_its_result(tmp_path) -> None:
    target, draft = qwen_gguf("1.5b"), qwen_gguf("0.5b")
    if target is None or draft is None:
        pytest.skip("Qwen2.5-Coder GGUFs not installed")
    store = BlobStore(tmp_path / "models")
    t, _ = store.add_file(target)
    d, _ = store.add_file(draft)
    create_model(store, CreateRequest(model="coder", files={"model.gguf": t}, draft_files={"draft.gguf": d},
                                      parameters={"temperature": 0.0, "num_ctx": 2048}))
    with ServerThread(store, Settings(num_thread=2)) as srv, httpx.Client(base_url=srv.url, timeout=600) as http:
        client = ollama.Client(host=srv.url, timeout=600)
        assert "tools" in client.show("coder").capabilities

        messages = [{"role": "system", "content": "You are a helpful assistant. When a tool result is given, answer "
                                                  "the user's question with it in one sentence."},
                    {"role": "user", "content": "What is the weather like in Paris right now?"}]
        r = http.post("/api/chat", json={"model": "coder", "messages": messages, "tools": [WEATHER],
                                         "stream": False, "options": {"num_predict": 64}})
        assert r.status_code == 200, r.text
        first = r.json()
        [call] = first["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert call["function"]["arguments"]["city"].lower().startswith("paris")
        assert call["id"].startswith("call_") and first["message"]["content"] == ""
        assert first["done_reason"] == "stop"
        assert first["drafter"] == "model+suffix" and first["draft_n"] > 0  # speculation stayed on

        messages += [first["message"], {"role": "tool", "tool_name": "get_weather",
                                        "content": "22 degrees Celsius, sunny"}]
        final = client.chat(model="coder", messages=messages, tools=[WEATHER], options={"num_predict": 64})
        assert not final.message.tool_calls
        assert "22" in final.message.content
        print("\nEXCHANGE", json.dumps({"call": first["message"], "stats": {k: first[k] for k in (
            "drafter", "draft_n", "draft_n_accepted", "eval_count")}, "final": final.message.content}, indent=1))
