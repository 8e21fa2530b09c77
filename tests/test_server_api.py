"""The native API over real HTTP: a uvicorn server in a background thread, tiny GGUF models (a qwen2
target and a 1-layer drafter with the same vocabulary), the real engine process behind them.

Also the shared helpers of the server tests (`ServerThread`, `make_store`; `HFMock` lives in tests/hf_mock.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import uvicorn

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.app import create_app
from server.settings import Settings, parse_host
from tests.hf_mock import HFMock
from tests.tiny_gguf import TinySpec, write_tiny_gguf

# --- helpers shared by the server test modules -----------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """`create_app` served by uvicorn on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, store: BlobStore, settings: Settings | None = None, engine_factory: Callable | None = None):
        self.port = free_port()
        self.settings = dataclasses.replace(settings or Settings(num_thread=1), host=parse_host(f"127.0.0.1:{self.port}"))
        self.store = store
        self.app = create_app(store, self.settings, engine_factory)
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def scheduler(self):
        return self.app.state.ctx.scheduler

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(30)


def write_pair(d: Path) -> tuple[Path, Path]:
    """A tiny qwen2 target and a 1-layer drafter sharing its vocabulary (4096-token context, so long
    generations need no context shift)."""
    target, draft = d / "target.gguf", d / "draft.gguf"
    if not target.exists():
        write_tiny_gguf(target, TinySpec(arch="qwen2", seed=1, context_length=4096))
        write_tiny_gguf(draft, TinySpec(arch="qwen2", n_layer=1, seed=2, context_length=4096))
    return target, draft


def make_store(d: Path, name: str = "tiny") -> BlobStore:
    """A store with `name`: the pair, greedy sampling and a short default num_predict."""
    target, draft = write_pair(d)
    store = BlobStore(d / "models")
    t, _ = store.add_file(target)
    dr, _ = store.add_file(draft)
    create_model(store, CreateRequest(model=name, files={"target.gguf": t}, draft_files={"draft.gguf": dr},
                                      parameters={"temperature": 0.0, "num_predict": 8}))
    return store


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


def parse_time(value: str) -> datetime:
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value)
    assert m, value
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + (m.group(2) or ".0")[:7] + zone)


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("api")
    with ServerThread(make_store(d)) as server:
        server.dir = d
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


SPEC_FIELDS = {"drafter", "draft_n", "draft_n_accepted", "draft_rounds", "acceptance_rate", "mean_accepted_length",
               "acceptance_by_position", "mean_depth"}


# --- server basics -----------------------------------------------------------------------------------


def test_root_routes_and_version(http: httpx.Client) -> None:
    r = http.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running" and r.headers["x-tandem-version"]
    assert http.head("/").status_code == 200
    r = http.get("/api/nope")
    assert r.status_code == 404 and r.text == "404 page not found"
    r = http.get("/api/generate")
    assert r.status_code == 405 and r.text == "405 method not allowed"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", http.get("/api/version").json()["version"])


def test_host_check_and_cors(http: httpx.Client) -> None:
    assert http.get("/", headers={"Host": "evil.example"}).status_code == 403
    assert http.get("/", headers={"Host": "api.localhost:11434"}).status_code == 200
    assert http.get("/", headers={"Host": "10.1.2.3"}).status_code == 200
    r = http.get("/api/version", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert http.get("/api/version", headers={"Origin": "https://evil.example"}).status_code == 403
    r = http.options("/api/chat", headers={"Origin": "vscode-webview://abc", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204 and "POST" in r.headers["access-control-allow-methods"]


# --- request errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method,path", [("POST", "/api/generate"), ("POST", "/api/chat"), ("POST", "/api/show"),
                                         ("POST", "/api/create"), ("POST", "/api/copy"), ("DELETE", "/api/delete"),
                                         ("POST", "/api/pull")])
def test_body_errors(http: httpx.Client, method: str, path: str) -> None:
    r = http.request(method, path)
    assert (r.status_code, r.json()) == (400, {"error": "missing request body"})
    r = http.request(method, path, content=b'{"model": "tiny",}')
    assert r.status_code == 400
    assert r.json()["error"] == "invalid character '}' looking for beginning of object key string"
    r = http.request(method, path, content=b'{"model": "tiny"')
    assert (r.status_code, r.json()["error"]) == (400, "unexpected EOF")
    r = http.request(method, path, content=b"[1, 2]")
    assert r.status_code == 400 and r.json()["error"].startswith("json: cannot unmarshal array into Go value of type")


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
                       ({"type": "string", "pattern": "a+"}, 'unsupported JSON schema keyword "pattern" at schema')]:
        r = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "format": fmt})
        assert (r.status_code, r.json()) == (400, {"error": error})


def test_blobs(http: httpx.Client, srv: ServerThread) -> None:
    data = b"tandem blob test " + os.urandom(8)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = http.head(f"/api/blobs/{digest}")
    assert r.status_code == 404
    for bad in ("sha256:123", "md5:" + "0" * 64, "sha256-" + "g" * 64):
        assert http.head(f"/api/blobs/{bad}").status_code == 400
        r = http.post(f"/api/blobs/{bad}", content=data)
        assert (r.status_code, r.json()) == (400, {"error": "invalid digest format"})
    wrong = "sha256:" + "0" * 64
    r = http.post(f"/api/blobs/{wrong}", content=data)
    assert r.status_code == 400
    assert r.json()["error"] == f'digest mismatch, expected "{wrong}", got "{digest}"'
    assert not srv.store.has_blob(wrong)
    r = http.post(f"/api/blobs/{digest}", content=data)
    assert r.status_code == 201 and r.content == b""
    assert http.post(f"/api/blobs/{digest}", content=data).status_code == 200
    assert http.head(f"/api/blobs/{digest}").status_code == 200
    assert srv.store.read_blob(digest) == data


# --- create / tags / show / copy / delete ------------------------------------------------------------


def _file_digests(srv: ServerThread) -> tuple[str, str]:
    target, draft = write_pair(srv.dir)
    sha = lambda p: "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    return sha(target), sha(draft)


def test_create_json_form(http: httpx.Client, srv: ServerThread) -> None:
    t, d = _file_digests(srv)
    r = http.post("/api/create", json={"model": "made", "files": {"target.gguf": t}, "draft_files": {"draft.gguf": d},
                                       "parameters": {"draft_num_predict": 3, "stop": ["<|im_end|>"]},
                                       "system": "Be brief."})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    statuses = [x["status"] for x in ndjson(r)]
    assert "parsing GGUF" in statuses and statuses[-2:] == ["writing manifest", "success"]
    assert any(s.startswith("using existing layer sha256:") for s in statuses)
    r = http.post("/api/create", json={"model": "made2", "from": "made", "stream": False})
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    show = http.post("/api/show", json={"model": "made2"}).json()
    assert show["system"] == "Be brief." and show["speculation"]["draft"]["family"] == "qwen2"
    assert show["speculation"]["parameters"] == {"draft_num_predict": 3}
    assert show["speculation"]["effective"]["draft_num_predict"] == 3

    cases = [
        ({"model": "x"}, 400, "neither 'from' or 'files' was specified"),
        ({"model": "x", "files": {"a.gguf": "sha256:12"}}, 400, "invalid digest format"),
        ({"model": "x", "files": {"/abs.gguf": t}}, 400, "file path must be relative"),
        ({"model": "x", "files": {"a.gguf": t}, "draft_quantize": "q8_0"}, 400, "draft_quantize requires draft_files"),
        ({"model": "x", "from": "does-not-exist"}, 404, "model 'does-not-exist' not found"),
        ({"model": "bad name!", "files": {"a.gguf": t}}, 400, "invalid model name"),
    ]
    for body, status, error in cases:
        r = http.post("/api/create", json={**body, "stream": False})
        assert (r.status_code, r.json()) == (status, {"error": error}), body


def test_create_old_modelfile_form(http: httpx.Client, srv: ServerThread) -> None:
    write_pair(srv.dir)
    (srv.dir / "Modelfile").write_text("FROM ./target.gguf\nDRAFT ./draft.gguf\nSYSTEM \"\"\"old form\"\"\"\n"
                                       "PARAMETER draft_num_predict 2\n")
    r = http.post("/api/create", json={"name": "oldform", "modelfile": (srv.dir / "Modelfile").read_text(),
                                       "path": str(srv.dir / "Modelfile"), "stream": False})
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    show = http.post("/api/show", json={"name": "oldform"}).json()
    assert show["system"] == "old form" and show["speculation"]["draft"] is not None
    r = http.post("/api/create", json={"name": "oldform2", "modelfile": "FROM ./missing.gguf", "path": str(srv.dir),
                                       "stream": False})
    assert r.status_code == 400 and "no such file or directory" in r.json()["error"]


def test_tags_show_copy_delete(http: httpx.Client) -> None:
    tags = http.get("/api/tags").json()["models"]
    tiny = next(m for m in tags if m["name"] == "tiny:latest")
    assert tiny["model"] == "tiny:latest" and re.fullmatch(r"[0-9a-f]{64}", tiny["digest"]) and tiny["size"] > 0
    assert tiny["details"]["family"] == "qwen2" and tiny["details"]["format"] == "gguf"
    parse_time(tiny["modified_at"])

    show = http.post("/api/show", json={"model": "tiny"}).json()
    assert show["modelfile"].startswith("# Modelfile generated by")
    assert "temperature" in show["parameters"] and "num_predict" in show["parameters"]
    assert show["details"]["family"] == "qwen2"
    assert show["model_info"]["general.architecture"] == "qwen2"
    assert show["model_info"]["tokenizer.ggml.tokens"] == []  # long arrays emptied unless verbose
    assert show["capabilities"] == ["completion"]
    spec = show["speculation"]
    assert spec["draft"]["family"] == "qwen2" and spec["effective"]["drafter"] == "model"
    assert spec["defaults"]["draft_num_predict"] == 4
    verbose = http.post("/api/show", json={"model": "tiny", "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) > 5
    r = http.post("/api/show", json={"model": "tiny", "options": {"draft_num_predict": 0}})
    assert r.json()["speculation"]["effective"]["drafter"] == "none"
    assert http.post("/api/show", json={"model": "nope"}).status_code == 404
    assert http.post("/api/show", json={}).json() == {"error": "model is required"}

    r = http.post("/api/copy", json={"source": "tiny", "destination": "team/tiny-copy:v1"})
    assert (r.status_code, r.content) == (200, b"")
    names = [m["name"] for m in http.get("/api/tags").json()["models"]]
    assert "team/tiny-copy:v1" in names
    r = http.post("/api/copy", json={"source": "nope", "destination": "x"})
    assert (r.status_code, r.json()) == (404, {"error": 'model "nope" not found'})
    r = http.post("/api/copy", json={"source": "tiny", "destination": "bad name!"})
    assert (r.status_code, r.json()) == (400, {"error": 'destination "bad name!" is invalid'})
    r = http.request("DELETE", "/api/delete", json={"model": "team/tiny-copy:v1"})
    assert (r.status_code, r.content) == (200, b"")
    r = http.request("DELETE", "/api/delete", json={"model": "team/tiny-copy:v1"})
    assert (r.status_code, r.json()) == (404, {"error": "model 'team/tiny-copy:v1' not found"})


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
    assert SPEC_FIELDS <= set(final) and final["drafter"] == "model"
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
    text = r.json()["debug_info"]["rendered_template"]
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nearlier<|im_end|>\n"
                    "<|im_start|>assistant\nreply<|im_end|>\n<|im_start|>user\nnow<|im_end|>\n<|im_start|>assistant\n")
    r = http.post("/api/chat", json={"model": "tiny-sys", "_debug_render_only": True,
                                     "messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": "now"}]})
    text = r.json()["debug_info"]["rendered_template"]
    # Ollama's order: MESSAGE layers, then the request; the model's SYSTEM only when the request has none
    assert text == ("<|im_start|>user\nearlier<|im_end|>\n<|im_start|>assistant\nreply<|im_end|>\n"
                    "<|im_start|>system\nmine<|im_end|>\n<|im_start|>user\nnow<|im_end|>\n<|im_start|>assistant\n")
    r = http.post("/api/generate", json={"model": "tiny-sys", "prompt": "p", "_debug_render_only": True})
    assert r.json()["debug_info"]["rendered_template"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n")

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
    assert r.json()["debug_info"]["rendered_template"] == "<PRE> def f( <SUF>return x <MID>"
    r = http.post("/api/generate", json={"model": "tiny-fim", "prompt": "def f(", "suffix": "return x",
                                         "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "template": "[{{ .System }}|{{ .Prompt }}]",
                                         "system": "S", "_debug_render_only": True})
    assert r.json()["debug_info"]["rendered_template"] == "[S|hi]"
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
    http.post("/api/generate", json={"model": "tiny", "prompt": "count me", "stream": False})
    text = http.get("/metrics").text
    assert 'tandem_requests_total{endpoint="/api/generate",method="POST",status="200"}' in text
    assert 'tandem_requests_total{endpoint="/api/generate",method="POST",status="404"}' in text

    def value(name: str) -> float:
        m = re.search(rf'^{name}{{model="tiny:latest"}} ([0-9.e+]+)$', text, re.M)
        assert m, name
        return float(m.group(1))

    assert value("tandem_generated_tokens_total") > 0 and value("tandem_prompt_tokens_total") > 0
    assert value("tandem_draft_tokens_total") >= value("tandem_draft_accepted_tokens_total")
    assert value("tandem_draft_rounds_total") >= 0
    assert "tandem_request_duration_seconds_bucket" in text


def _engine_pid(http: httpx.Client) -> int:
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    return m["engine"]["pid"]


# Greedy decoding of the tiny random model repeats one token and never samples EOS: this runs for a
# long time (tens of seconds) unless it is cancelled.
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


# --- pull ------------------------------------------------------------------------------------------------


def test_pull_from_hf(http: httpx.Client, srv: ServerThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"  # not yet in the store: really downloaded
    write_tiny_gguf(target, TinySpec(arch="qwen2", seed=11, n_layer=1))
    write_tiny_gguf(draft, TinySpec(arch="llama", seed=12, n_layer=1))
    hub = HFMock({"org/tiny-GGUF": {"tiny-Q8_0.gguf": target.read_bytes(), "tiny-Q4_K_M.gguf": draft.read_bytes(),
                                    "README.md": b"# tiny"}})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        r = http.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF:q8_0"})
        assert r.status_code == 200
        events = ndjson(r)
        statuses = [e["status"] for e in events]
        sha = hashlib.sha256(target.read_bytes()).hexdigest()
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        progress = [e for e in events if e["status"] == f"pulling {sha[:12]}"]
        assert progress and progress[-1] == {"status": f"pulling {sha[:12]}", "digest": f"sha256:{sha}",
                                             "total": target.stat().st_size, "completed": target.stat().st_size}
        assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
        assert ("GET", "/org/tiny-GGUF/resolve/main/tiny-Q8_0.gguf") in hub.requests
        names = [m["name"] for m in http.get("/api/tags").json()["models"]]
        assert "hf.co/org/tiny-GGUF:q8_0" in names
        # default tag: Q4_K_M; not streamed: the last status
        r = http.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF", "stream": False})
        assert (r.status_code, r.json()) == (200, {"status": "success"})
        r = http.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF:Q5_K_S", "stream": False})
        assert r.status_code == 404
        assert r.json()["error"] == 'no GGUF file for quantization "Q5_K_S" in hf.co/org/tiny-GGUF (available: Q4_K_M, Q8_0)'
        r = http.post("/api/pull", json={"model": "hf.co/org/missing", "stream": False})
        assert r.status_code == 404 and "not found" in r.json()["error"]
    finally:
        hub.close()
    r = http.post("/api/pull", json={"model": "llama3.2"})
    assert r.status_code == 400
    assert r.json() == {"error": "pulling from registry.ollama.ai is not supported; use hf.co/<org>/<repo>[:<quant>]"}


def test_server_healthy_at_the_end(http: httpx.Client) -> None:
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "still there?", "stream": False})
    assert r.status_code == 200 and r.json()["done"]
