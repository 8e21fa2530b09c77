"""Generation over real HTTP (server/routes/generate.py and the pipeline behind it): /api/generate and
/api/chat, their request errors, streamed and collected answers, model layers and templates, loading and
keep_alive, metrics, and a client or engine that goes away mid-request.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import datetime, timezone

import httpx
import pytest

from tests.server_thread import (
    SPEC_FIELDS,
    ServerThread,
    make_store,
    ndjson,
    parse_time,
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("generate"))) as server:
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


# --- request errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("body,status,error", [
    ({}, 400, "model is required"),
    ({"model": "nope"}, 404, "model 'nope' not found"),
    ({"model": "tiny", "prompt": 1}, 400, "json: cannot unmarshal number into Go struct field GenerateRequest.prompt of type string"),
    ({"model": "tiny", "prompt": "hi", "options": {"top_k": "many"}}, 500, 'option "top_k" must be of type integer'),
    ({"model": "tiny", "prompt": "hi", "options": {"temperature": True}}, 500, 'option "temperature" must be of type float32'),
    ({"model": "tiny", "prompt": "hi", "options": {"stop": 3}}, 500, 'option "stop" must be of type array'),
    ({"model": "tiny", "prompt": "hi", "top_logprobs": 21}, 400, "top_logprobs must be between 0 and 20"),
    ({"model": "tiny", "prompt": "hi", "raw": True, "system": "x"}, 400, "raw mode does not support template, system, or context"),
    ({"model": "tiny", "prompt": "hi", "keep_alive": "5"}, 400, 'time: missing unit in duration "5"'),
    ({"model": "tiny", "prompt": "hi", "think": True}, 400, '"tiny" does not support thinking'),
    ({"model": "tiny", "prompt": "hi", "images": ["aGk="]}, 400, '"tiny" does not support vision'),
    ({"model": "tiny", "prompt": "hi", "suffix": "end"}, 400, '"tiny" does not support insert'),
])
def test_generate_errors(http: httpx.Client, body: dict, status: int, error: str) -> None:
    r = http.post("/api/generate", json=body)
    assert (r.status_code, r.json()) == (status, {"error": error})


def test_chat_errors_and_format(http: httpx.Client) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"messages": msgs}, 400, "model is required"),
        ({"model": "no/such:model", "messages": msgs}, 404, "model 'no/such:model' not found"),
        ({"model": "tiny", "messages": msgs, "options": {"num_ctx": "big"}}, 500, 'option "num_ctx" must be of type integer'),
        ({"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400,
         "json: cannot unmarshal number into Go struct field Message.content of type string"),
        ({"model": "tiny", "messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
         '"tiny" does not support tools'),
    ]
    for body, status, error in cases:
        r = http.post("/api/chat", json=body)
        assert (r.status_code, r.json()) == (status, {"error": error}), body
    # format: constrained decoding (engine.sampling.constrain) makes even the random tiny model answer JSON.
    opts = {"temperature": 0, "num_predict": 200}
    r = http.post("/api/chat", json={"model": "tiny", "messages": msgs, "format": "json", "stream": False,
                                     "options": opts})
    assert r.status_code == 200, r.text
    json.loads(r.json()["message"]["content"])
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "format": schema, "stream": False,
                                         "options": opts})
    assert r.status_code == 200, r.text
    out = json.loads(r.json()["response"])
    assert list(out) == ["name", "age"] and isinstance(out["name"], str) and isinstance(out["age"], int)
    assert r.json()["done_reason"] == "stop"
    for fmt, error in [("xml", 'invalid format: "xml"; expected "json" or a JSON schema'),
                       ({"type": "string", "pattern": "(a)\\1"},
                        'unsupported JSON schema keyword "pattern" at schema: backreferences are not supported '
                        "(at offset 5 of /(a)\\1/)")]:
        r = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "format": fmt})
        assert (r.status_code, r.json()) == (400, {"error": error})


# --- generation ---------------------------------------------------------------------------------------


def test_generate_stream_and_not(http: httpx.Client) -> None:
    body = {"model": "tiny", "prompt": "def hello():", "options": {"num_predict": 10, "seed": 7}}
    with http.stream("POST", "/api/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        chunks = ndjson(r)
    *parts, final = chunks
    assert all(c["done"] is False and c["model"] == "tiny" for c in parts)
    assert final["done"] is True and final["response"] == "" and final["done_reason"] in ("stop", "length")
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration"):
        assert isinstance(final[key], int) and final[key] > 0, key
    assert final["total_duration"] >= final["eval_duration"]
    assert isinstance(final["context"], list) and len(final["context"]) >= final["prompt_eval_count"]
    assert SPEC_FIELDS <= set(final) and final["drafter"] == "model+suffix"
    assert final["eval_count"] == 10 and final["done_reason"] == "length"
    parse_time(final["created_at"])
    streamed = "".join(c["response"] for c in parts)

    r = http.post("/api/generate", json={**body, "stream": False})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    one = r.json()
    assert one["done"] is True and one["response"] == streamed  # greedy: same text either way
    assert SPEC_FIELDS <= set(one) and one["draft_n_accepted"] <= one["draft_n"]

    # `context` continues a conversation; raw mode returns no context
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "more", "context": one["context"], "stream": False})
    assert r.status_code == 200 and r.json()["prompt_eval_count"] > len(one["context"])
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "raw text", "raw": True, "stream": False})
    assert r.status_code == 200 and "context" not in r.json()

    # speculation can be switched off per request; Ollama's fields stay the same
    r = http.post("/api/generate", json={**body, "stream": False, "options": {**body["options"], "draft_num_predict": 0}})
    plain = r.json()
    assert plain["drafter"] == "none" and plain["draft_n"] == 0 and plain["response"] == streamed


def test_generate_logprobs(http: httpx.Client) -> None:
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False, "logprobs": True,
                                         "top_logprobs": 2, "options": {"num_predict": 3}})
    lps = r.json()["logprobs"]
    assert len(lps) == 3 and all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in lps)


def test_chat_with_model_layers(http: httpx.Client) -> None:
    r = http.post("/api/create", json={"model": "tiny-sys", "from": "tiny", "system": "Be brief.", "stream": False,
                                       "messages": [{"role": "user", "content": "earlier"},
                                                    {"role": "assistant", "content": "reply"}]})
    assert r.status_code == 200
    r = http.post("/api/chat", json={"model": "tiny-sys", "messages": [{"role": "user", "content": "now"}],
                                     "_debug_render_only": True})
    text = r.json()["_debug_info"]["rendered_template"]
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nearlier<|im_end|>\n"
                    "<|im_start|>assistant\nreply<|im_end|>\n<|im_start|>user\nnow<|im_end|>\n<|im_start|>assistant\n")
    r = http.post("/api/chat", json={"model": "tiny-sys", "_debug_render_only": True,
                                     "messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": "now"}]})
    text = r.json()["_debug_info"]["rendered_template"]
    # Ollama's order: MESSAGE layers, then the request; the model's SYSTEM only when the request has none
    assert text == ("<|im_start|>user\nearlier<|im_end|>\n<|im_start|>assistant\nreply<|im_end|>\n"
                    "<|im_start|>system\nmine<|im_end|>\n<|im_start|>user\nnow<|im_end|>\n<|im_start|>assistant\n")
    r = http.post("/api/generate", json={"model": "tiny-sys", "prompt": "p", "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n")

    msgs = [{"role": "user", "content": "hello"}]
    with http.stream("POST", "/api/chat", json={"model": "tiny-sys", "messages": msgs}) as r:
        chunks = ndjson(r)
    *parts, final = chunks
    assert all(c["message"]["role"] == "assistant" and not c["done"] for c in parts)
    assert final["done"] and final["message"] == {"role": "assistant", "content": ""} and "context" not in final
    assert SPEC_FIELDS <= set(final) and final["eval_count"] == 8  # the model's num_predict parameter
    one = http.post("/api/chat", json={"model": "tiny-sys", "messages": msgs, "stream": False}).json()
    assert one["message"]["content"] == "".join(c["message"]["content"] for c in parts)


def test_insert_capability_and_template_override(http: httpx.Client) -> None:
    fim = "<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>"
    r = http.post("/api/create", json={"model": "tiny-fim", "from": "tiny", "template": fim, "stream": False})
    assert r.status_code == 200
    assert http.post("/api/show", json={"model": "tiny-fim"}).json()["capabilities"] == ["completion", "insert"]
    assert http.post("/api/show", json={"model": "tiny-fim"}).json()["template"] == fim
    r = http.post("/api/generate", json={"model": "tiny-fim", "prompt": "def f(", "suffix": "return x",
                                         "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"] == "<PRE> def f( <SUF>return x <MID>"
    r = http.post("/api/generate", json={"model": "tiny-fim", "prompt": "def f(", "suffix": "return x",
                                         "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "template": "[{{ .System }}|{{ .Prompt }}]",
                                         "system": "S", "_debug_render_only": True})
    assert r.json()["_debug_info"]["rendered_template"] == "[S|hi]"
    r = http.post("/api/create", json={"model": "bad-tpl", "from": "tiny", "template": "{{ .Prompt", "stream": False})
    assert r.status_code == 400 and r.json()["error"].startswith("template error")


def test_load_unload_and_ps(http: httpx.Client) -> None:
    r = http.post("/api/generate", json={"model": "tiny"})
    assert r.json()["done_reason"] == "load" and r.json()["done"] is True
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    left = (parse_time(m["expires_at"]) - datetime.now(timezone.utc)).total_seconds()
    assert 240 < left <= 300
    assert m["size_vram"] == 0 and m["context_length"] == 4096 and m["size"] > 0 and m["engine"]["pid"] > 0
    assert m["details"]["family"] == "qwen2" and m["engine"]["draft_architecture"] == "qwen2"

    r = http.post("/api/chat", json={"model": "tiny", "messages": [], "keep_alive": "10m"})
    assert r.json()["done_reason"] == "load" and r.json()["message"] == {"role": "assistant", "content": ""}
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    assert 540 < (parse_time(m["expires_at"]) - datetime.now(timezone.utc)).total_seconds() <= 600
    r = http.post("/api/generate", json={"model": "tiny", "keep_alive": -1})
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    assert parse_time(m["expires_at"]).year > 2200

    r = http.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"
    time.sleep(0.2)
    assert all(m["name"] != "tiny:latest" for m in http.get("/api/ps").json()["models"])


def test_keep_alive_zero_unloads_after_request(http: httpx.Client) -> None:
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "keep_alive": 0, "stream": False,
                                         "options": {"num_predict": 2}})
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while any(m["name"] == "tiny:latest" for m in http.get("/api/ps").json()["models"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_metrics(http: httpx.Client) -> None:
    # a fixed depth drafts every step: this request alone puts draft rounds on the counters
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "count me", "stream": False,
                                         "options": {"num_predict": 8, "draft_schedule": "fixed"}})
    rounds = r.json()["draft_rounds"]
    assert rounds > 0
    assert http.post("/api/generate", json={"model": "no-such-model", "prompt": "x"}).status_code == 404
    text = http.get("/metrics").text
    assert 'tandem_requests_total{endpoint="/api/generate",method="POST",status="200"}' in text
    assert 'tandem_requests_total{endpoint="/api/generate",method="POST",status="404"}' in text

    def value(name: str) -> float:
        m = re.search(rf'^{name}{{model="tiny:latest"}} ([0-9.e+]+)$', text, re.M)
        assert m, name
        return float(m.group(1))

    assert value("tandem_generated_tokens_total") > 0 and value("tandem_prompt_tokens_total") > 0
    assert value("tandem_draft_tokens_total") >= value("tandem_draft_accepted_tokens_total")
    assert value("tandem_draft_tokens_total") > 0
    assert value("tandem_draft_rounds_total") >= rounds
    assert "tandem_request_duration_seconds_bucket" in text


def _engine_pid(http: httpx.Client) -> int:
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    return m["engine"]["pid"]


# Greedy decoding of the tiny random model repeats one token and never samples EOS: this runs for a
# long time (tens of seconds) unless it is cancelled.
def test_a_chat_asking_for_a_smaller_context_drops_whole_old_messages(http: httpx.Client) -> None:
    """The engine is loaded with 4096 positions; a chat asking for num_ctx 512 is truncated by the server
    against 512 (the oldest whole messages dropped, as Ollama's chatPrompt does), so the engine cuts nothing
    in the middle of a message."""
    assert http.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False}).status_code == 200
    [loaded] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    assert loaded["context_length"] == 4096
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"message {i}: " + " ".join(f"w{i}x{j}" for j in range(40))} for i in range(15)]

    def prompt_tokens(msgs: list[dict], num_ctx: int) -> int:
        r = http.post("/api/chat", json={"model": "tiny", "messages": msgs, "stream": False,
                                         "options": {"num_ctx": num_ctx, "num_predict": 1}})
        assert r.status_code == 200, r.text
        return r.json()["prompt_eval_count"]

    whole = prompt_tokens(messages, 4096)
    assert whole > 1024  # the conversation does not fit in 512
    cut = prompt_tokens(messages, 512)
    assert cut < 512
    # what the engine received is the rendered conversation of its newest messages, whole
    suffixes = {k: prompt_tokens(messages[-k:], 4096) for k in range(1, len(messages))}
    assert cut in suffixes.values()
    kept = max(k for k, n in suffixes.items() if n < 512)
    assert suffixes[kept] == cut  # as many of the newest messages as fit


LONG = {"model": "tiny", "prompt": "write a lot", "options": {"num_predict": 4000, "temperature": 0}}


def test_client_disconnect_cancels_generation(http: httpx.Client, srv: ServerThread) -> None:
    with http.stream("POST", "/api/generate", json=LONG) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["done"] is False
        json.loads(next(lines))
    # the connection is closed: the engine must stop at its next round and free the model
    t = time.monotonic()
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "next", "stream": False,
                                         "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["eval_count"] == 2
    assert time.monotonic() - t < 10  # 4000 tokens would take far longer
    gen = re.search(r'^tandem_generated_tokens_total{model="tiny:latest"} ([0-9.e+]+)$',
                    http.get("/metrics").text, re.M)
    assert gen and float(gen.group(1)) < 1000


def test_engine_killed_mid_request(http: httpx.Client) -> None:
    http.post("/api/generate", json={"model": "tiny"})  # make sure it is loaded
    pid = _engine_pid(http)
    with http.stream("POST", "/api/generate", json=LONG) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["done"] is False
        os.kill(pid, signal.SIGKILL)
        rest = [json.loads(line) for line in lines if line.strip()]
    assert rest and "error" in rest[-1] and "engine process exited unexpectedly" in rest[-1]["error"]
    assert all("error" not in x for x in rest[:-1])
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "again", "stream": False})
    assert r.status_code == 200 and r.json()["done"] is True
    assert _engine_pid(http) != pid


def test_engine_killed_before_request(http: httpx.Client) -> None:
    http.post("/api/generate", json={"model": "tiny"})
    pid = _engine_pid(http)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    r = http.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert r.status_code == 200 and r.json()["done"] is True
    assert _engine_pid(http) != pid


def test_server_healthy_at_the_end(http: httpx.Client) -> None:
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "still there?", "stream": False})
    assert r.status_code == 200 and r.json()["done"]
