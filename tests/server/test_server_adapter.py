"""A LoRA adapter over HTTP: uploaded as a blob, `/api/create` with `adapters`, `/api/show` shows the ADAPTER
line, `/api/generate` runs the adapted target (its own engine: the base model without the adapter is another)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from engine.contract.gguf import GGUFFile
from tests.engine.test_lora import write_adapter
from tests.server_thread import ServerThread, make_store, ndjson, write_pair
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("models")
    with ServerThread(make_store(d)) as server:
        server.dir = d
        yield server


def _upload(http: httpx.Client, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert http.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
    return digest


def test_create_show_generate_with_adapter(srv: ServerThread, tmp_path) -> None:
    target, _ = write_pair(srv.dir)
    with GGUFFile(target) as f:
        n_layer = f.arch_key("block_count")
    names = [f"blk.{i}.{n}.weight" for i in range(n_layer) for n in ("attn_q", "attn_v", "ffn_down")]
    adapter = write_adapter(tmp_path / "lora.gguf", target, names, alpha=24.0)
    with httpx.Client(base_url=srv.url, timeout=300) as http:
        digest = _upload(http, adapter.read_bytes())
        r = http.post("/api/create", json={"model": "tiny-lora", "from": "tiny", "adapters": {"lora.gguf": digest}})
        assert r.status_code == 200 and ndjson(r)[-1] == {"status": "success"}
        show = http.post("/api/show", json={"model": "tiny-lora"}).json()
        assert f"ADAPTER {srv.store.blob_path(digest)}" in show["modelfile"]

        body = {"prompt": "hello there", "stream": False, "options": {"temperature": 0, "num_predict": 8}}
        adapted = http.post("/api/generate", json={"model": "tiny-lora", **body}).json()
        plain = http.post("/api/generate", json={"model": "tiny", **body}).json()
        assert adapted["done"] and adapted["eval_count"] > 0
        assert adapted["context"] != plain["context"]  # the adapter changes what the target says

        # An adapter made for a wider model: its shapes do not fit this target.
        wider = write_tiny_gguf(tmp_path / "wider.gguf", TinySpec(arch="qwen2", n_embd=128, seed=3))
        wrong = write_adapter(tmp_path / "wrong.gguf", wider, ["blk.0.attn_q.weight"])
        r = http.post("/api/create", json={"model": "tiny-bad", "from": "tiny", "stream": False,
                                           "adapters": {"wrong.gguf": _upload(http, wrong.read_bytes())}})
        assert r.status_code == 400
        assert r.json()["error"].startswith("ADAPTER: tensors 'blk.0.attn_q.weight.lora_a' [3, 128]")
        assert http.post("/api/show", json={"model": "tiny-bad"}).status_code == 404
