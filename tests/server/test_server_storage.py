"""Issue 15, part 5, over HTTP: a full disk answers Ollama's 500 with "no space left on device" (no path, no
errno) and leaves nothing partial; a create that fails removes the blobs it wrote itself at once, and keeps
the blobs a client uploaded.
"""

from __future__ import annotations

import errno
import hashlib
import os

import httpx
import pytest

from blobs import BlobStore
from blobs import store as store_mod
from server.settings import Settings
from tests.server_thread import ServerThread, write_pair
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("storage")
    write_pair(d)
    write_tiny_gguf(d / "fresh.gguf", TinySpec(arch="qwen2", seed=7))  # in no store yet
    with ServerThread(BlobStore(d / "models"), Settings(num_thread=1, create_paths=(d,))) as server:
        server.dir = d
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _upload(http: httpx.Client, data: bytes) -> str:
    digest = _sha(data)
    assert http.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
    return digest


def _partials(srv: ServerThread) -> list[str]:
    return [n for n in os.listdir(srv.store.blobs_dir) if "-partial-" in n]


def test_a_full_disk_is_a_plain_500(http: httpx.Client, srv: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _upload(http, (srv.dir / "target.gguf").read_bytes())
    writes = []

    def full(self, chunk: bytes) -> None:
        writes.append(len(chunk))
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(store_mod._Partial, "write", full)
    data = os.urandom(100_000)
    r = http.post(f"/api/blobs/{_sha(data)}", content=data)
    assert (r.status_code, r.json()) == (500, {"error": "no space left on device"})
    assert not srv.store.has_blob(_sha(data))
    system = "a system prompt no blob holds yet " + os.urandom(8).hex()
    body = {"model": "full", "files": {"target.gguf": target}, "system": system}
    r = http.post("/api/create", json={**body, "stream": False})
    assert (r.status_code, r.json()) == (500, {"error": "no space left on device"})
    r = http.post("/api/create", json=body)  # streamed: the last line says it
    assert r.status_code == 200 and r.text.strip().splitlines()[-1] == '{"error":"no space left on device"}'
    assert writes and _partials(srv) == []
    assert http.post("/api/show", json={"model": "full"}).status_code == 404


def test_a_failed_create_removes_its_own_blobs_at_once(http: httpx.Client, srv: ServerThread) -> None:
    target = _upload(http, (srv.dir / "target.gguf").read_bytes())
    system = "written, then orphaned " + os.urandom(8).hex()
    # `requires` is checked after the text layers are written: they are the failed create's own blobs.
    r = http.post("/api/create", json={"model": "fails", "files": {"target.gguf": target}, "system": system,
                                       "requires": "not-a-version", "stream": False})
    assert r.status_code == 400 and "semver" in r.json()["error"]
    assert not srv.store.has_blob(_sha(system.encode()))
    assert srv.store.has_blob(target)  # the client's upload stays, as Ollama keeps it

    # The old form copies the FROM file in itself: a failing create takes that copy away too.
    fresh = _sha((srv.dir / "fresh.gguf").read_bytes())
    r = http.post("/api/create", json={"name": "fails2", "modelfile": "FROM ./fresh.gguf\nREQUIRES nope\n",
                                       "path": str(srv.dir), "stream": False})
    assert r.status_code == 400 and "semver" in r.json()["error"]
    assert not srv.store.has_blob(fresh)

    # A blob a model already uses is never taken, even when the failed create wrote the same bytes.
    r = http.post("/api/create", json={"model": "keeps", "files": {"target.gguf": target}, "system": system,
                                       "stream": False})
    assert r.status_code == 200
    r = http.post("/api/create", json={"model": "fails3", "files": {"target.gguf": target}, "system": system,
                                       "requires": "bad", "stream": False})
    assert r.status_code == 400 and srv.store.has_blob(_sha(system.encode()))


def test_a_failed_local_tandem_create_leaves_no_copy(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tandem create` on the local store (no server answers) copies the user's FROM file in first; when the
    create then fails, that copy goes at once."""
    from server.cli import main
    from tests.server_thread import free_port

    monkeypatch.setenv("TANDEM_HOST", f"127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    write_tiny_gguf(tmp_path / "own.gguf", TinySpec(arch="qwen2", seed=11))
    (tmp_path / "Modelfile").write_text("FROM ./own.gguf\nSYSTEM left behind?\nREQUIRES nope\n")
    assert main(["create", "x", "-f", "Modelfile"]) == 1
    store = BlobStore(tmp_path / "models")
    assert store.list_blobs() == [] and _sha((tmp_path / "own.gguf").read_bytes()) not in store.list_blobs()
    (tmp_path / "Modelfile").write_text("FROM ./own.gguf\n")  # the user's own file is still read, as before
    assert main(["create", "x", "-f", "Modelfile"]) == 0
