"""`PARAMETER engine vllm` without a vLLM: what create keeps and refuses, what /api/show and `tandem show` say,
the LoadSpec a request gets, and the clear errors of a model vLLM cannot start (tests/vllm runs the real one)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from blobs import MEDIA_TYPE_HF_DRAFT_FILE, MEDIA_TYPE_HF_FILE, BlobStore
from blobs.model import load_stored_model
from engine.contract.options import Options
from importer import CreateError, CreateRequest, create_model
from server.lifecycle import ModelLifecycle, serves
from server.settings import Settings, VllmSettings
from tests.hf_folders import make_folder
from tests.server_thread import ServerThread, make_store


def _upload(store: BlobStore, folder: Path) -> dict[str, str]:
    return {p.name: store.add_file(p)[0] for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("hf")
    make_folder("llama", d / "target", dtype="BF16", seed=1)
    make_folder("llama", d / "draft", dtype="BF16", seed=2, n_layer=1)
    return d / "target", d / "draft"


def test_a_vllm_model_keeps_its_folders_and_shows_its_engine(tmp_path: Path, folders):
    target, draft = folders
    store = BlobStore(tmp_path / "models")
    create_model(store, CreateRequest(model="v", files=_upload(store, target), draft_files=_upload(store, draft),
                                      parameters={"engine": "vllm", "draft_num_predict": 3}))
    model = load_stored_model(store, "v")
    assert dict(model.hf_files).keys() == {p.name for p in target.iterdir()}
    assert dict(model.draft_hf_files).keys() == {p.name for p in draft.iterdir()}
    assert {l.name for l in model.manifest.layers_of(MEDIA_TYPE_HF_FILE)} >= {"config.json", "model.safetensors"}
    assert model.model_path is not None  # the converted GGUF still gives the server its tokenizer and template
    # a model built FROM it inherits the folders
    create_model(store, CreateRequest(model="w", from_="v", parameters={"temperature": 0.1}))
    inherited = load_stored_model(store, "w")
    assert inherited.hf_files == model.hf_files and inherited.draft_hf_files == model.draft_hf_files
    # a model on the native engine keeps no folder
    create_model(store, CreateRequest(model="n", files=_upload(store, target)))
    assert load_stored_model(store, "n").hf_files == ()

    settings = Settings(vllm=VllmSettings(python="/opt/vllm/bin/python", args=("--dtype", "float32")))
    spec = ModelLifecycle(settings).load_spec(model, Options.merged(model.params, None))
    assert spec.engine == "vllm" and spec.vllm is not None
    assert (spec.vllm.drafter, spec.vllm.num_speculative_tokens) == ("model", 3)
    assert spec.vllm.python == "/opt/vllm/bin/python" and spec.vllm.extra_args == ("--dtype", "float32")
    assert dict(spec.vllm.files)["config.json"] == str(dict(model.hf_files)["config.json"])
    # the engine as a request option reloads, as weight_format does
    native = ModelLifecycle(settings).load_spec(model, Options.merged(model.params, {"engine": "native"}))
    assert native.engine == "native" and native.vllm is None and not serves(spec, native)

    with ServerThread(store, settings) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        info = c.post("/api/show", json={"model": "v"}).json()["engine"]
        assert info == {"backend": "vllm", "speculative_method": "draft_model", "num_speculative_tokens": 3,
                        "huggingface_folder": True}
        assert c.post("/api/show", json={"model": "n"}).json()["engine"] == {"backend": "native", "why": "the native engine runs this model"}  # engine auto


def test_create_refuses_what_the_vllm_engine_cannot_load(tmp_path: Path, folders):
    target, _ = folders
    store = make_store(tmp_path)  # "tiny": a GGUF pair
    gguf = load_stored_model(store, "tiny")
    with pytest.raises(CreateError, match="safetensors folder"):
        create_model(store, CreateRequest(model="g", files={"t.gguf": gguf.manifest.layers[0].digest},
                                          parameters={"engine": "vllm"}))
    with pytest.raises(CreateError, match="was not created from one"):
        create_model(store, CreateRequest(model="g", from_="tiny", parameters={"engine": "vllm"}))
    with pytest.raises(CreateError, match="relaxed_top_n=2 is not supported by the vllm engine"):
        create_model(store, CreateRequest(model="g", files=_upload(store, target),
                                          parameters={"engine": "vllm", "relaxed_top_n": 2}))
    assert [m.name.display() for m in store.list_models()] == ["tiny:latest"]


def test_a_model_vllm_cannot_start_gets_a_clear_error(tmp_path: Path, folders):
    target, _ = folders
    store = make_store(tmp_path)
    create_model(store, CreateRequest(model="v", files=_upload(store, target), parameters={"engine": "vllm"}))
    with ServerThread(store, Settings(num_thread=1)) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        # no TANDEM_VLLM_PYTHON
        r = c.post("/api/generate", json={"model": "v", "prompt": "hi", "stream": False})
        assert r.status_code == 500 and "TANDEM_VLLM_PYTHON" in r.json()["error"]
        # a GGUF model asked for the vllm engine has no folder to give it
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                          "options": {"engine": "vllm"}})
        assert r.status_code == 400 and "Hugging Face folder" in r.json()["error"]
        # and the native engine still serves it afterwards
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert r.status_code == 200 and r.json()["done"]


def test_a_vllm_that_fails_to_start_reports_the_end_of_its_log(tmp_path: Path, folders):
    target, _ = folders
    store = BlobStore(tmp_path / "models")
    create_model(store, CreateRequest(model="v", files=_upload(store, target), parameters={"engine": "vllm"}))
    fake = tmp_path / "python"  # a "Python" whose vLLM dies at start with a message
    fake.write_text("#!/bin/sh\ncase \"$*\" in *vllm.entrypoints*) echo 'ValueError: no CUDA here' >&2; exit 7;; esac\n"
                    "exec python3 \"$@\"\n")
    fake.chmod(0o755)
    with ServerThread(store, Settings(num_thread=1, vllm=VllmSettings(python=str(fake)))) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/api/generate", json={"model": "v", "prompt": "hi", "stream": False})
        error = r.json()["error"]
        assert r.status_code == 500 and "vLLM failed to start (exit code 7)" in error and "no CUDA here" in error
        assert c.get("/api/ps").json()["models"] == []


def test_vllm_models_that_speculate_differently_get_engines_of_their_own(tmp_path: Path, folders):
    """vLLM fixes its speculation at start: a plain and an n-gram model from one folder must not share (and restart)
    one vLLM, while native copies still share one engine."""
    from server.lifecycle import model_key

    target, _ = folders
    store = BlobStore(tmp_path / "models")
    files = _upload(store, target)
    for name, params in (("plain", {"engine": "vllm"}), ("ngram", {"engine": "vllm", "drafter": "ngram"}),
                         ("copy", {"engine": "vllm", "temperature": 0.2}), ("n1", {}), ("n2", {"drafter": "ngram"})):
        create_model(store, CreateRequest(model=name, files=files, parameters=params))
    key = {name: model_key(load_stored_model(store, name)) for name in ("plain", "ngram", "copy", "n1", "n2")}
    assert key["plain"] != key["ngram"] and key["plain"] == key["copy"] and key["n1"] == key["n2"]
    assert model_key(load_stored_model(store, "n2"), "vllm") != key["n2"]  # TANDEM_ENGINE=vllm
