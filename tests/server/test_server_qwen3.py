"""qwen3 and qwen3moe served end to end: a tiny GGUF of each created from a Modelfile (the same file as its
own DRAFT) over /api/create, then /api/generate greedy with no drafter, the draft model and n-gram
drafting: the same text every way, with the speculation statistics of the drafter that ran."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from blobs import BlobStore
from server.settings import Settings
from tests.server_thread import SPEC_FIELDS, ServerThread
from tests.tiny_gguf import TinySpec, write_tiny_gguf

# draft_copy is on by default, so a request drafting with the model reports the model with its copy cursor
REPORTED_DRAFTER = {"none": "none", "model": "model+suffix", "ngram": "ngram"}

SPECS = {
    "qwen3": TinySpec(arch="qwen3", head_dim=32, seed=3, context_length=1024),
    "qwen3moe": TinySpec(arch="qwen3moe", head_dim=32, n_expert=8, n_expert_used=2, n_ff_expert=32, seed=4,
                         context_length=1024),
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("qwen3")
    for name, spec in SPECS.items():
        write_tiny_gguf(d / f"{name}.gguf", spec)
        # the same weights again as DRAFT (another general.name, so another blob)
        write_tiny_gguf(d / f"{name}-draft.gguf", dataclasses.replace(spec, name=f"{name}-draft"))
        (d / f"{name}.Modelfile").write_text(f"FROM ./{name}.gguf\nDRAFT ./{name}-draft.gguf\n"
                                             "PARAMETER temperature 0\n")
    # The old create form reads these local paths: the directory is on the operator's allow-list.
    with ServerThread(BlobStore(d / "models"), Settings(num_thread=1, create_paths=(d,))) as server:
        server.dir = d
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


@pytest.mark.parametrize("arch", list(SPECS))
def test_create_and_generate_with_and_without_drafters(http: httpx.Client, srv: ServerThread, arch: str) -> None:
    modelfile = srv.dir / f"{arch}.Modelfile"
    r = http.post("/api/create", json={"model": arch, "modelfile": modelfile.read_text(), "path": str(modelfile),
                                       "stream": False})
    assert (r.status_code, r.json()) == (200, {"status": "success"}), r.text
    show = http.post("/api/show", json={"model": arch}).json()
    assert show["details"]["family"] == arch and show["model_info"]["general.architecture"] == arch
    assert show["speculation"]["draft"]["family"] == arch

    body = {"model": arch, "prompt": "def fib(n): return the", "stream": False, "options": {"num_predict": 24}}
    runs = {}
    for drafter in ("none", "model", "ngram"):
        r = http.post("/api/generate", json={**body, "options": {**body["options"], "drafter": drafter}})
        assert r.status_code == 200, r.text
        runs[drafter] = out = r.json()
        assert out["done"] and out["eval_count"] == 24 and SPEC_FIELDS <= set(out)
        assert out["drafter"] == REPORTED_DRAFTER[drafter]
    assert runs["none"]["draft_n"] == 0
    assert runs["model"]["draft_n"] > 0 and runs["model"]["draft_n_accepted"] > 0
    assert runs["model"]["response"] == runs["none"]["response"] == runs["ngram"]["response"]
    assert runs["none"]["response"]  # the tiny model does say something
