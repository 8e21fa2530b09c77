"""Pull and push through tandem's API and CLI against a real registry (Debian's docker-registry): the `ollama` client
pushes from one server and pulls into another, the model answers the same; `stream: false`; Ollama's errors; `tandem
run` pulls a missing model first; a server killed part-way through a pull resumes without fetching its parts again."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import httpx
import ollama
import pytest

from benchmarks.serving import start_server
from blobs import MEDIA_TYPE_DRAFT, MEDIA_TYPE_LICENSE, MEDIA_TYPE_MESSAGES, BlobStore, Layer
from server.cli.commands import main
from server.settings import RegistrySettings, Settings
from tests.registry_server import CountingProxy
from tests.server_thread import ServerThread, make_store, ndjson

GREEDY = {"temperature": 0, "num_predict": 8, "seed": 1}


def _server(store: BlobStore, registry_url: str) -> ServerThread:
    return ServerThread(store, Settings(num_thread=1, registry=RegistrySettings(url=registry_url)))


def _answer(url: str, model: str) -> dict:
    r = httpx.post(url + "/api/generate", json={"model": model, "prompt": "Once upon a time", "stream": False,
                                                "options": GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_pushed_from_one_server_pulled_into_another_answers_the_same(registry, tmp_path: Path):
    (tmp_path / "a").mkdir()
    source = make_store(tmp_path / "a")
    manifest = source.read_manifest("tiny")  # with layers an Ollama library model carries and tandem only keeps
    for media_type, data in ((MEDIA_TYPE_LICENSE, b"Apache License 2.0"),
                             (MEDIA_TYPE_MESSAGES, b'[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]')):
        digest, size = source.write_blob(data)
        manifest.layers.append(Layer(media_type, digest, size))
    source.write_manifest("tiny", manifest)
    with _server(source, registry.url) as a, _server(BlobStore(tmp_path / "b"), registry.url) as b:
        pushed = list(ollama.Client(host=a.url, timeout=120).push("tiny", stream=True))
        assert pushed[0].status == "retrieving manifest" and pushed[-1].status == "success"
        pulled = [e.status for e in ollama.Client(host=b.url, timeout=120).pull("tiny", stream=True)]
        assert pulled[0] == "pulling manifest" and pulled[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"]
        assert any(s.startswith("pulling ") and s != "pulling manifest" for s in pulled)
        tags = {m["name"]: m["digest"] for m in httpx.get(b.url + "/api/tags").json()["models"]}
        assert tags == {"tiny:latest": source.entry("tiny").digest}
        assert b.store.read_manifest("tiny").layer(MEDIA_TYPE_DRAFT) is not None  # the pair speculates there too
        shown = httpx.post(b.url + "/api/show", json={"model": "tiny"}).json()
        assert shown["license"] == "Apache License 2.0"
        assert shown["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        here, there = _answer(a.url, "tiny"), _answer(b.url, "tiny")
        assert (there["response"], there["context"]) == (here["response"], here["context"])
        assert there["drafter"].startswith("model") and there["draft_n"] > 0
        # stream false: one answer; a model the registry lacks: Ollama's error and status
        r = httpx.post(b.url + "/api/pull", json={"model": "tiny", "stream": False}, timeout=60)
        assert (r.status_code, r.json()) == (200, {"status": "success"})
        r = httpx.post(b.url + "/api/pull", json={"model": "missing", "stream": False}, timeout=60)
        assert (r.status_code, r.json()) == (404, {"error": "pull model manifest: file does not exist"})
        lines = ndjson(httpx.post(b.url + "/api/pull", json={"model": "missing"}, timeout=60))
        assert lines == [{"status": "pulling manifest"}, {"error": "pull model manifest: file does not exist"}]
        # a model tandem does not have cannot be pushed, before any progress
        r = httpx.post(a.url + "/api/push", json={"model": "nothing-here"}, timeout=60)
        assert r.status_code == 404 and "not found" in r.json()["error"]
        # generating with a model not present stays Ollama's 404, no pull
        r = httpx.post(b.url + "/api/generate", json={"model": "other", "prompt": "x"}, timeout=60)
        assert r.status_code == 404


def test_cli_push_to_a_named_host_and_run_pulls_what_is_missing(registry, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture):
    (tmp_path / "a").mkdir()
    source = make_store(tmp_path / "a")
    host = registry.url.split("://", 1)[1]
    with _server(source, "") as a, _server(BlobStore(tmp_path / "b"), "") as b:
        monkeypatch.setenv("TANDEM_HOST", a.url)
        assert main(["cp", "tiny", f"{host}/team/tiny:v1"]) == 0
        capsys.readouterr()
        assert main(["push", f"{host}/team/tiny:v1", "--insecure"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "retrieving manifest" and out[-2:] == ["pushing manifest", "success"]
        monkeypatch.setenv("TANDEM_HOST", b.url)
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        assert main(["run", "--insecure", f"{host}/team/tiny:v1", "Once upon a time"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("pulling manifest\n") and "success\n" in out
        assert f"{host}/team/tiny:v1" in [m["name"] for m in httpx.get(b.url + "/api/tags").json()["models"]]
        # without --insecure the named host is reached over https, which this registry does not speak
        assert main(["pull", f"{host}/team/tiny:v1"]) == 1
        assert "Error: pull model manifest: " in capsys.readouterr().err


def test_a_server_killed_mid_pull_resumes_without_fetching_its_parts_again(registry, tmp_path: Path):
    (tmp_path / "a").mkdir()
    source = make_store(tmp_path / "a")
    manifest = source.read_manifest("tiny")
    digest, size = source.write_blob(os.urandom(6 << 20).hex().encode()[: 6 << 20])  # a 6 MiB layer
    manifest.layers.append(Layer(MEDIA_TYPE_LICENSE, digest, size))
    source.write_manifest("big", manifest)
    with _server(source, registry.url) as a:
        assert httpx.post(a.url + "/api/push", json={"model": "big", "stream": False}, timeout=120).status_code == 200
    proxy = CountingProxy(registry.url)
    proxy.delay = 0.02  # about 3 MB/s per connection: the kill lands mid-blob
    home = tmp_path / "b"
    home.mkdir()
    models = home / "models"
    proc, url = start_server(home, 1, {"TANDEM_REGISTRY": proxy.url})
    try:
        with httpx.stream("POST", url + "/api/pull", json={"model": "big"}, timeout=120) as r:
            for line in r.iter_lines():
                event = json.loads(line)
                if event.get("digest") == digest and event.get("completed", 0) >= 2 << 20:
                    break
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        first = proxy.blob_bytes
        assert first < size + 200_000  # killed before the large blob was whole
        parts = models / "downloads" / digest.replace(":", "-")
        kept = sum(f.stat().st_size for f in parts.iterdir())
        assert kept >= 2 << 20
        proxy.delay = 0
        time.sleep(0.5)  # the proxy's threads still writing to the killed server's connections fail first
        proxy.blob_bytes = 0
        proc, url = start_server(home, 1, {"TANDEM_REGISTRY": proxy.url})
        r = httpx.post(url + "/api/pull", json={"model": "big", "stream": False}, timeout=120)
        assert (r.status_code, r.json()) == (200, {"status": "success"})
        assert proxy.blob_bytes <= size - kept + 200_000  # the small layers at most, besides what was missing
        assert BlobStore(models).read_manifest_bytes("big") == source.read_manifest_bytes("big")
    finally:
        proc.kill()
        proc.wait(10)
        proxy.close()
