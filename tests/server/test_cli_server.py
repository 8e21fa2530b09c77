"""`tandem list/show/cp/rm/ps` through a running server (TANDEM_HOST, else OLLAMA_HOST), never the local store
while a server answers; the local store only when none does, said on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cli.client import Client
from server.cli import main
from tests.server_thread import ServerThread, free_port, make_store


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("cli-server"), name="smol")) as server:
        yield server


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local store: anything the verbs find came from the server."""
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "local"))
    monkeypatch.delenv("TANDEM_HOST", raising=False)
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    return tmp_path / "local"


@pytest.mark.parametrize("variable,value", [
    ("TANDEM_HOST", "{url}"),
    ("OLLAMA_HOST", "127.0.0.1:{port}"),  # Ollama's form: no scheme
])
def test_verbs_go_through_the_server(srv: ServerThread, local: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value.format(url=srv.url, port=srv.port))
    assert main(["list"]) == 0
    out = capsys.readouterr()
    table = out.out.splitlines()
    assert table[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"] and table[1].startswith("smol:latest")
    assert out.err == ""

    # `tandem show smol` said "not found" while the server had it (issue 16).
    assert main(["show", "smol"]) == 0
    summary = capsys.readouterr().out
    assert "architecture        qwen2" in summary and "  Draft" in summary and "context length      4096" in summary
    assert main(["show", "smol", "--template"]) == 0
    assert capsys.readouterr().out.startswith("{% for message in messages %}")  # the GGUF's chat template
    assert main(["show", "smol", "--parameters"]) == 0
    assert "temperature" in capsys.readouterr().out

    assert main(["cp", "smol", "smol-copy"]) == 0
    assert capsys.readouterr().out == "copied 'smol' to 'smol-copy'\n"
    assert "smol-copy:latest" in [e.name.display() for e in srv.store.list_models()]
    assert main(["rm", "smol-copy"]) == 0
    assert capsys.readouterr().out == "deleted 'smol-copy'\n"
    assert "smol-copy:latest" not in [e.name.display() for e in srv.store.list_models()]
    assert main(["rm", "smol-copy"]) == 1
    assert capsys.readouterr().err == "Error: model 'smol-copy' not found\n"

    assert main(["ps"]) == 0
    assert capsys.readouterr().out.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert not local.exists()  # the local store was never touched


def test_tandem_host_wins_over_ollama_host(srv: ServerThread, local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("TANDEM_HOST", srv.url)
    assert Client().base_url == srv.url
    monkeypatch.delenv("TANDEM_HOST")
    monkeypatch.setenv("OLLAMA_HOST", "example.internal")  # Ollama's parsing: http, port 11434
    assert Client().base_url == "http://example.internal:11434"
    monkeypatch.delenv("OLLAMA_HOST")
    assert Client().base_url == "http://127.0.0.1:11434"


def test_no_server_falls_back_to_the_local_store(local: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    port = free_port()
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{port}")
    (local.parent / "pair").mkdir()
    make_store(local.parent / "pair", name="here")
    monkeypatch.setenv("TANDEM_MODELS", str(local.parent / "pair" / "models"))
    assert main(["list"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[1].startswith("here:latest")
    assert out.err == (f"tandem: no server answers at http://127.0.0.1:{port}; using the local store "
                       f"{local.parent / 'pair' / 'models'}\n")
    assert main(["show", "here"]) == 0
    assert "architecture        qwen2" in capsys.readouterr().out
    assert main(["ps"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert "no models are running" in out.err
