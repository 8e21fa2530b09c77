"""`tandem train-drafter`: an MTP head fitted to a stored model, stored with it as a new model (local store)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from blobs import BlobStore
from blobs.model import load_stored_model
from engine.contract.drafter_provenance import read_provenance
from engine.contract.gguf import GGUFFile
from server.cli import main
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts
from tests.server_thread import free_port
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("TANDEM_HOST", f"127.0.0.1:{free_port()}")  # no server: the local store
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.setenv("TANDEM_TRAIN_DIR", str(tmp_path / "train"))
    monkeypatch.chdir(tmp_path)
    write_tiny_gguf(tmp_path / "target.gguf", TinySpec(arch="qwen2", seed=3))
    write_tiny_gguf(tmp_path / "gemma.gguf", TinySpec(arch="gemma3", seed=3))
    (tmp_path / "Modelfile").write_text("FROM ./target.gguf\nPARAMETER temperature 0\n")
    (tmp_path / "Gemmafile").write_text("FROM ./gemma.gguf\n")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "the", "of", "and", "model", "(", ")", "=", "def", "x", "1", "\n"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "text.txt").write_text(" ".join(rng.choice(words) for _ in range(3000)))
    assert main(["create", "tiny", "-f", "Modelfile"]) == 0
    assert main(["create", "tiny-gemma", "-f", "Gemmafile"]) == 0
    return tmp_path


def test_train_drafter_stores_the_target_with_its_trained_head(env: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["train-drafter", "tiny", "--as", "tiny-mtp", "--tokens", "800", "--window", "48",
                 "--data", "data"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("success")
    new = load_stored_model(BlobStore(env / "models"), "tiny-mtp")
    old = load_stored_model(BlobStore(env / "models"), "tiny")
    assert new.model_path == old.model_path and new.draft_path is not None  # the target's own blob, shared
    assert new.params["temperature"] == 0 and new.params["drafter"] == "mtp"
    with GGUFFile(new.draft_path) as f:
        provenance = read_provenance(f.metadata)
        assert "token_embd.weight" not in f.tensors
    assert provenance["tokens"] >= 800 and provenance["steps"] == 18 and "data" in provenance["data"]
    assert 0.0 <= provenance["validation_acceptance"] <= 1.0
    assert main(["show", "tiny-mtp"]) == 0
    shown = capsys.readouterr().out
    assert "trained tokens" in shown
    shown_acceptance = next(line for line in shown.splitlines() if "trained validation acceptance" in line).split()
    assert shown_acceptance[-1] == f"{provenance['validation_acceptance']}" and len(shown_acceptance[-1]) <= 6
    # the stored pair survives a copy, and the copy's head drafts for its target through the engine, losslessly
    assert main(["cp", "tiny-mtp", "tiny-mtp-copy"]) == 0
    copy = load_stored_model(BlobStore(env / "models"), "tiny-mtp-copy")
    assert copy.draft_path == new.draft_path
    plain = generate(load_engine(copy.model_path), **GREEDY, drafter="none")
    drafted = generate(load_engine(copy.model_path, copy.draft_path), **GREEDY, **spec_opts("mtp", 2))
    assert drafted.tokens == plain.tokens and drafted.spec.draft_n > 0


def test_a_model_it_cannot_train_for_is_refused_before_training(env: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train-drafter", "tiny-gemma", "--as", "x", "--tokens", "500", "--data", "data"]) == 1
    err = capsys.readouterr().err
    assert "training failed" in err
    with pytest.raises(Exception):
        load_stored_model(BlobStore(env / "models"), "x")
    assert main(["train-drafter", "nope", "--as", "x"]) == 1
    assert "not found" in capsys.readouterr().err
