"""Model management over real HTTP (server/routes/models.py and server/routes/pull.py): blobs, create in
both body forms, tags, show, copy, delete, and pulling from a mock Hugging Face Hub.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import httpx
import ollama
import pytest

from engine.contract.gguf import GGUFFile
from server.settings import RegistrySettings, Settings
from tests.hf_mock import HFMock
from tests.server_thread import ServerThread, free_port, make_store, ndjson, parse_time, write_pair
from tests.tiny_gguf import CHATML_TEMPLATE, TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("models")
    # The old create form reads local paths only from the operator's allow-list (TANDEM_CREATE_PATHS).
    with ServerThread(make_store(d), Settings(num_thread=1, create_paths=(d,))) as server:
        server.dir = d
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


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


def test_create_refuses_a_tensor_type_the_engine_cannot_read(http: httpx.Client, srv: ServerThread) -> None:
    spec = TinySpec(arch="llama", n_layer=1, n_embd=256, n_ff=256, dtype="TQ1_0")
    data = write_tiny_gguf(srv.dir / "tq1.gguf", spec).read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert http.post(f"/api/blobs/{digest}", content=data).status_code == 201
    r = http.post("/api/create", json={"model": "tq1", "files": {"tq1.gguf": digest}, "stream": False})
    assert (r.status_code, r.json()) == (400, {"error": "unsupported tensor type(s) in model: TQ1_0"})


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
    # a missing file reads as every unreadable path does (issue 15: nothing about the path's existence)
    assert r.status_code == 400 and r.json()["error"].startswith("FROM ./missing.gguf: local paths are not readable")


def test_tags_show_copy_delete(http: httpx.Client, srv: ServerThread) -> None:
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
    # The template in use: no TEMPLATE layer, so the GGUF's chat template (Ollama's selectedModelTemplate).
    assert show["template"] == CHATML_TEMPLATE
    assert ollama.Client(host=str(http.base_url)).show("tiny").template == CHATML_TEMPLATE
    # `tensors`: every tensor of the file, ggml type name and GGUF-order shape (Ollama fills them verbose or not).
    with GGUFFile(srv.dir / "target.gguf") as f:
        want = [{"name": t.name, "type": "F32", "shape": list(t.dims)} for t in f.tensors.values()]
    assert verbose["tensors"] == want and show["tensors"] == want and len(want) > 10
    embd = next(t for t in verbose["tensors"] if t["name"] == "token_embd.weight")
    assert embd["shape"][0] == 64 and embd["shape"][1] == show["model_info"]["qwen2.vocab_size"]
    r = http.post("/api/show", json={"model": "tiny", "options": {"draft_num_predict": 0}})
    assert r.json()["speculation"]["effective"]["drafter"] == "none"
    assert spec["defaults"]["relaxed_scope"] == spec["effective"]["relaxed_scope"] == "all"
    r = http.post("/api/show", json={"model": "tiny", "options": {"relaxed_scope": "thinking"}})
    assert r.json()["speculation"]["effective"]["relaxed_scope"] == "thinking"
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
    # a library name goes to the registry (TANDEM_REGISTRY here: one that is down)
    down = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(srv.app.state.ctx.settings, "registry", RegistrySettings(url=down))
    r = http.post("/api/pull", json={"model": "llama3.2", "stream": False})
    assert r.status_code == 500
    assert r.json() == {"error": f'pull model manifest: Get "{down}/v2/library/llama3.2/manifests/latest": '
                                 "connection refused"}
