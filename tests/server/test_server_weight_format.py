"""The target's weight format: a float GGUF (an unquantized import) is served at its stored precision unless the
user chooses otherwise, with the ``weight_format`` PARAMETER, the request option (a load option: a change
reloads the engine) or TANDEM_WEIGHT_FORMAT; /api/ps and ``tandem show`` say which is in force."""

from __future__ import annotations

import httpx
import pytest

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.server_thread import ServerThread
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def _store(d) -> BlobStore:
    store = BlobStore(d / "models")
    digest, _ = store.add_file(write_tiny_gguf(d / "f16.gguf", TinySpec(arch="qwen2", seed=1, dtype="F16")))
    create_model(store, CreateRequest(model="f16", files={"m.gguf": digest}, parameters={"temperature": 0.0}))
    create_model(store, CreateRequest(model="f16-int8", files={"m.gguf": digest},
                                      parameters={"temperature": 0.0, "weight_format": "int8"}))
    return store


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServerThread(_store(tmp_path_factory.mktemp("wf")), Settings(num_thread=1)) as server:
        yield server


def _format(http: httpx.Client, model: str, **options) -> str:
    r = http.post("/api/generate", json={"model": model, "prompt": "hi", "stream": False,
                                         "options": {"num_predict": 4, **options}})
    assert r.status_code == 200, r.text
    [m] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == model + ":latest"]
    return m["engine"]["weight_format"]


def test_a_float_model_is_served_at_its_precision_unless_chosen(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        assert _format(http, "f16") == "f32"  # F16 weights held exactly, not requantized
        assert _format(http, "f16-int8") == "int8"  # the model's PARAMETER
        assert _format(http, "f16", weight_format="bf16") == "bf16"  # a request's choice reloads the engine
        assert _format(http, "f16") == "f32"  # and the next request without it reloads back
        show = http.post("/api/show", json={"model": "f16-int8"}).json()
        assert "weight_format" in show["parameters"] and "int8" in show["parameters"]


def test_a_bad_weight_format_is_refused(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        r = http.post("/api/generate", json={"model": "f16", "prompt": "hi", "options": {"weight_format": "fp4"}})
        assert r.status_code == 400
        assert r.json()["error"].startswith('invalid weight_format value [fp4]: must be one of "auto", "f32"')


def test_the_server_default_comes_from_the_environment(tmp_path) -> None:
    assert Settings.from_env({"TANDEM_WEIGHT_FORMAT": "INT8"}).weight_format == "int8"
    assert Settings.from_env({"TANDEM_WEIGHT_FORMAT": "fp4"}).weight_format == "auto"
    assert Settings.from_env({}).weight_format == "auto"
    with ServerThread(_store(tmp_path), Settings(num_thread=1, weight_format="int8")) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            assert _format(http, "f16") == "int8"


def test_tandem_show_names_the_format(tmp_path, capsys, monkeypatch) -> None:
    from server.cli import commands as cli

    store = _store(tmp_path)
    monkeypatch.setattr(cli, "_server", lambda store: None)  # read the store directly
    for model, want in (("f16", "auto"), ("f16-int8", "int8")):
        cli.cmd_show(type("Args", (), {"model": model, "modelfile": False, "parameters": False, "template": False,
                                        "system": False, "license": False})(), store)
        out = capsys.readouterr().out
        assert any(line.split()[:3] == ["weight", "format", want] for line in out.splitlines()), out
