"""Real clients over real HTTP: the `ollama` Python package end to end (blobs + create with a DRAFT, list,
show, generate, chat, ps, copy, delete) and tandem's own CLI against a running server."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import ollama
import pytest

from blobs import BlobStore
from server.cli.client import Client
from server.cli.commands import _command, _Session, main
from server.settings import RegistrySettings
from tests.server_thread import ServerThread, free_port, write_pair

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("clients")
    write_pair(d)
    with ServerThread(BlobStore(d / "models")) as server:
        server.dir = d
        yield server


@pytest.fixture
def client(srv: ServerThread) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


def test_ollama_client_end_to_end(srv: ServerThread, client: ollama.Client) -> None:
    target, draft = write_pair(srv.dir)
    t = client.create_blob(target)  # POST /api/blobs/<digest>
    d = client.create_blob(draft)
    assert t.startswith("sha256:") and srv.store.has_blob(t) and srv.store.has_blob(d)

    # The public create(): a model from uploaded files.
    events = list(client.create(model="base", files={"target.gguf": t}, parameters={"temperature": 0}, stream=True))
    assert events[-1].status == "success" and any(e.status == "parsing GGUF" for e in events)
    # A DRAFT: ollama's create() has no draft_files argument, so the same client sends the full body.
    events = list(client._request(ollama.ProgressResponse, "POST", "/api/create", stream=True, json={
        "model": "spec", "files": {"target.gguf": t}, "draft_files": {"draft.gguf": d},
        "parameters": {"temperature": 0, "num_predict": 6, "draft_num_predict": 3}, "stream": True}))
    assert events[-1].status == "success"

    names = [m.model for m in client.list().models]
    assert {"base:latest", "spec:latest"} <= set(names)
    info = client.show("spec")
    assert info.details.family == "qwen2" and info.capabilities == ["completion"]
    assert "\nDRAFT " in info.modelfile and "draft_num_predict" in info.parameters
    assert info.modelinfo["general.architecture"] == "qwen2"

    r = client.generate(model="spec", prompt="def main():")
    assert r.done and r.done_reason == "length" and r.eval_count == 6 and isinstance(r.response, str)
    assert r.total_duration > 0 and r.eval_duration > 0 and r.context
    parts = list(client.generate(model="spec", prompt="def main():", stream=True))
    assert parts[-1].done and "".join(p.response for p in parts) == r.response

    msgs = [{"role": "user", "content": "hello"}]
    c = client.chat(model="spec", messages=msgs)
    assert c.message.role == "assistant" and c.done and c.eval_count == 6
    parts = list(client.chat(model="spec", messages=msgs, stream=True))
    assert parts[-1].done and "".join(p.message.content for p in parts) == c.message.content

    [running] = [m for m in client.ps().models if m.model == "spec:latest"]
    assert running.size_vram == 0 and running.expires_at is not None and running.context_length == 4096

    assert client.copy("spec", "spec-copy").status == "success"
    assert "spec-copy:latest" in [m.model for m in client.list().models]
    assert client.delete("spec-copy").status == "success"
    assert "spec-copy:latest" not in [m.model for m in client.list().models]

    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="nope", prompt="x")
    assert e.value.status_code == 404 and e.value.error == "model 'nope' not found"
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="spec", messages=msgs, options={"top_p": "high"})
    assert e.value.status_code == 500 and e.value.error == 'option "top_p" must be of type float32'
    with pytest.raises(ollama.ResponseError) as e:
        client.show("nope")
    assert e.value.status_code == 404
    assert client.generate(model="spec", prompt="still works").done


def _cli(*args: str, srv: ServerThread, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TANDEM_HOST": srv.url}
    return subprocess.run([sys.executable, "-m", "server.cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=180)


def _cli_modelfile(d: Path) -> Path:
    write_pair(d)
    (d / "Modelfile").write_text("FROM ./target.gguf\nDRAFT ./draft.gguf\nPARAMETER temperature 0\n"
                                 "PARAMETER num_predict 5\nPARAMETER draft_num_predict 2\n")
    return d / "Modelfile"


def test_cli_create_goes_through_the_server(srv: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    _cli_modelfile(tmp_path)
    monkeypatch.setenv("TANDEM_HOST", srv.url)
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "local-store"))  # must stay unused: the server builds it
    before = set(srv.store.list_blobs())
    assert main(["create", "cli-model", "-f", str(tmp_path / "Modelfile")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gathering model components" and out[-1] == "success"
    uploads = [line for line in out if line.startswith("copying file sha256:")]
    # Uploaded only what the server lacked (the first test may already have sent the same files).
    assert len(uploads) == len({l.split()[2] for l in uploads}) <= 2
    assert all(l.split()[2] not in before for l in uploads)
    assert not (tmp_path / "local-store").exists()
    assert main(["create", "cli-model2", "-f", str(tmp_path / "Modelfile")]) == 0
    assert not [l for l in capsys.readouterr().out.splitlines() if l.startswith("copying file")]
    names = [e.name.display() for e in srv.store.list_models()]
    assert "cli-model:latest" in names and "cli-model2:latest" in names


def test_cli_run_ps_stop_pull(srv: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture) -> None:
    if "cli-model:latest" not in [e.name.display() for e in srv.store.list_models()]:  # run on its own
        assert _cli("create", "cli-model", "-f", str(_cli_modelfile(tmp_path)), srv=srv).returncode == 0
    r = _cli("run", "cli-model", "Say", "hello", "--verbose", srv=srv)
    assert r.returncode == 0, r.stderr
    for label in ("total duration:", "eval count:           5 token(s)", "eval rate:", "drafter:              model",
                  "draft tokens:", "acceptance rate:", "mean accepted length:"):
        assert label in r.stderr, label
    r = _cli("run", "cli-model", srv=srv, stdin="text from a pipe")
    assert r.returncode == 0, r.stderr

    monkeypatch.setenv("TANDEM_HOST", srv.url)
    assert main(["ps"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    row = next(line for line in table if line.startswith("cli-model:latest"))
    assert "100% CPU" in row and "4096" in row and "from now" in row
    assert main(["stop", "cli-model"]) == 0
    capsys.readouterr()
    assert main(["ps"]) == 0
    assert "cli-model:latest" not in capsys.readouterr().out
    assert main(["stop", "cli-model"]) == 1
    assert 'couldn\'t find model "cli-model" to stop' in capsys.readouterr().err
    down = f"http://127.0.0.1:{free_port()}"  # the registry for library names: down
    monkeypatch.setattr(srv.app.state.ctx.settings, "registry", RegistrySettings(url=down))
    assert main(["pull", "llama3.2"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == "pulling manifest"
    assert f'Error: pull model manifest: Get "{down}/v2/library/llama3.2/manifests/latest": connection refused' \
        in captured.err
    assert main(["run", "no-such-model", "hi"]) == 1  # run pulls a missing model first, as `ollama run`
    assert "Error: pull model manifest: Get " in capsys.readouterr().err


def test_interactive_commands(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    args = argparse.Namespace(verbose=False, keepalive=None)
    with Client(srv.url) as c:
        session = _Session(c, "cli-model", args)
        assert not _command(session, c, "/set parameter draft_num_predict 6")
        assert not _command(session, c, "/set parameter relaxed_top_n 2")
        assert not _command(session, c, "/set parameter stop <|im_end|>")
        assert session.options == {"draft_num_predict": 6, "relaxed_top_n": 2, "stop": ["<|im_end|>"]}
        assert not _command(session, c, "/set parameter draft_p_min 2")
        assert "Couldn't set parameter" in capsys.readouterr().out
        assert not _command(session, c, "/set verbose") and session.verbose
        session.messages = [{"role": "user", "content": "x"}]
        assert not _command(session, c, "/clear") and session.messages == []
        assert "Cleared session context" in capsys.readouterr().out
        if "cli-model:latest" in [e.name.display() for e in srv.store.list_models()]:
            assert not _command(session, c, "/show info")
            out = capsys.readouterr().out
            assert "Draft" in out and "draft_num_predict   6" in out
        assert _command(session, c, "/bye")


def test_tandem_serve(tmp_path: Path) -> None:
    """`tandem serve` binds TANDEM_HOST, answers like Ollama, and stops cleanly on Ctrl-C."""
    import signal
    import time

    import httpx

    from tests.server_thread import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TANDEM_HOST": f"127.0.0.1:{port}",
           "TANDEM_MODELS": str(tmp_path / "models")}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert r.text == "Ollama is running"
        assert httpx.get(f"http://127.0.0.1:{port}/api/tags").json() == {"models": []}
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"tandem listening on 127.0.0.1:{port}" in out
