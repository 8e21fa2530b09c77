"""A vision projector as Ollama stores it: a projector GGUF (general.type ``mmproj``) given as a second FROM becomes
the model's ``application/vnd.ollama.image.projector`` layer, is inherited by a model built FROM it, is shown as
Ollama shows it, and makes ``engine auto`` choose llama.cpp (the native engine runs no projector)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from blobs import MEDIA_TYPE_MODEL, MEDIA_TYPE_PROJECTOR, BlobStore
from blobs.model import load_stored_model
from engine.contract.options import Options
from importer import CreateError, CreateRequest, LocalBlobSink, create_model, request_from_modelfile
from modelfile import parse
from server import effective_options
from server.prompting import ModelPrompting
from server.settings import Settings
from server.show import modelfile_commands, projector_info
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def write_projector(path: Path, width: int) -> Path:
    """A projector GGUF as llama.cpp's converter writes one with --mmproj (its header; two tiny tensors)."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.projection_dim", width)
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_tensor("mm.0.weight", np.zeros((width, 8), dtype=np.float32))
    w.add_tensor("v.patch_embd.weight", np.zeros((8, 3), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "models")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    write_tiny_gguf(d / "model.gguf", TinySpec(arch="qwen2", n_layer=1, n_embd=64, seed=1))
    write_projector(d / "mmproj.gguf", 64)
    write_projector(d / "other-mmproj.gguf", 32)
    return d


def create(store: BlobStore, text: str, base: Path, name: str) -> None:
    create_model(store, request_from_modelfile(parse(text), name, base, LocalBlobSink(store)))


def test_a_second_from_with_a_projector_becomes_the_projector_layer(store: BlobStore, src: Path) -> None:
    create(store, "FROM ./model.gguf\nFROM ./mmproj.gguf\n", src, "seeing")
    model = load_stored_model(store, "seeing")
    kinds = [layer.media_type for layer in model.manifest.layers]
    assert kinds.count(MEDIA_TYPE_MODEL) == 1 and kinds.count(MEDIA_TYPE_PROJECTOR) == 1
    assert model.projector_path is not None and model.projector_path.read_bytes() == (src / "mmproj.gguf").read_bytes()
    assert model.config["model_family"] == "qwen2"  # the model's, not the projector's "clip"
    prompting = ModelPrompting(model)
    assert "vision" in prompting.capabilities() and prompting.supports_vision
    assert projector_info(model)["general.architecture"] == "clip"
    # Ollama's Modelfile for it: the projector as a second FROM
    froms = [c.args for c in modelfile_commands(model) if c.name == "model"]
    assert froms == [str(model.model_path), str(model.projector_path)]

    # a model built FROM it keeps the projector; one without stays without vision
    create(store, "FROM seeing\nSYSTEM look closely\n", src, "child")
    assert load_stored_model(store, "child").projector_path == model.projector_path
    create(store, "FROM ./model.gguf\n", src, "blind")
    blind = load_stored_model(store, "blind")
    assert blind.projector_path is None and "vision" not in ModelPrompting(blind).capabilities()


def test_a_projector_given_through_the_api_files_is_found_by_its_content(store: BlobStore, src: Path) -> None:
    model_digest, _ = store.add_file(src / "model.gguf")
    projector_digest, _ = store.add_file(src / "mmproj.gguf")
    create_model(store, CreateRequest(model="api", files={"a.gguf": model_digest, "b.gguf": projector_digest}))
    assert load_stored_model(store, "api").projector_path == store.blob_path(projector_digest)


@pytest.mark.parametrize("text,error", [
    ("FROM ./mmproj.gguf\n", "only a projector was given"),
    ("FROM ./model.gguf\nFROM ./other-mmproj.gguf\n", "output width 32 does not match the model's embedding width 64"),
    ("FROM ./model.gguf\nFROM ./mmproj.gguf\nFROM ./other-mmproj.gguf\n", "2 projector GGUFs"),
])
def test_a_projector_that_cannot_serve_the_model_is_refused(store: BlobStore, src: Path, text: str, error: str) -> None:
    with pytest.raises(CreateError, match=error):
        create(store, text, src, "bad")
    assert store.list_models() == []


def test_engine_auto_serves_a_model_with_a_projector_through_llama_cpp(store: BlobStore, src: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    create(store, "FROM ./model.gguf\nFROM ./mmproj.gguf\n", src, "seeing")
    create(store, "FROM ./model.gguf\n", src, "blind")
    seeing, blind = load_stored_model(store, "seeing"), load_stored_model(store, "blind")
    settings = Settings()
    monkeypatch.setattr(effective_options, "llamacpp_available", lambda: True)
    choice = effective_options.choose_engine(seeing, Options(), settings)
    assert choice.engine == "llamacpp" and "vision projector" in choice.why
    assert effective_options.choose_engine(blind, Options(), settings).engine == "native"
    # engine native asked for: the text is served, and images are refused by the native engine
    assert effective_options.choose_engine(seeing, Options.merged({"engine": "native"}, None), settings).engine == "native"
    monkeypatch.setattr(effective_options, "llamacpp_available", lambda: False)
    choice = effective_options.choose_engine(seeing, Options(), settings)
    assert choice.engine == "native" and "no llama-server" in choice.why


def test_tandem_show_lists_vision_the_projector_and_why_its_engine(store: BlobStore, src: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from server.cli import main
    from tests.server_thread import free_port

    monkeypatch.setenv("TANDEM_MODELS", str(store.root))
    monkeypatch.setenv("TANDEM_HOST", f"127.0.0.1:{free_port()}")  # no server: the local store answers
    monkeypatch.setattr(effective_options, "llamacpp_available", lambda: True)
    create(store, "FROM ./model.gguf\nFROM ./mmproj.gguf\n", src, "seeing")
    assert main(["show", "seeing"]) == 0
    out = capsys.readouterr().out
    assert "  Capabilities\n    completion" in out and "    vision" in out
    assert "  Projector\n    architecture        clip" in out and "dimensions          64" in out
    assert "engine              llamacpp (the native engine does not run the model's vision projector" in out
