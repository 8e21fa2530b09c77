"""A hybrid recurrent model served end to end: tiny qwen35 and qwen35moe GGUFs (written from transformers'
random models) created with a DRAFT over the store, then /api/chat greedy with no drafter, the draft model and
n-gram: the same answer every way, the drafter's statistics (per-position acceptance) in the final chunk, and a
follow-up turn that reuses the cached prefix. A GGUF that carries its NextN (MTP) head is created with
``drafter mtp`` and no DRAFT line and drafts with its own head."""

from __future__ import annotations

import dataclasses
import json

import httpx
import ollama
import pytest

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.hf_tiny_qwen35 import make_pair, to_gguf_tensors
from tests.server_thread import SPEC_FIELDS, ServerThread
from tests.tiny_gguf import write_tiny_gguf

# draft_copy is on by default, so a request drafting with the model reports the model with its copy cursor
REPORTED_DRAFTER = {"none": "none", "model": "model+suffix", "ngram": "ngram"}

ARCHS = {"qwen35": False, "qwen35moe": True}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("qwen35")
    store = BlobStore(d / "models")
    for arch, moe in ARCHS.items():
        pair = make_pair(d, seed=5, moe=moe)
        # the same weights again as DRAFT (another general.name, so another blob)
        draft = write_tiny_gguf(d / f"{arch}-draft.gguf", dataclasses.replace(pair.spec, name=f"{arch}-draft"),
                                tensors=to_gguf_tensors(pair.hf, pair.spec))
        t, _ = store.add_file(pair.path)
        dr, _ = store.add_file(draft)
        create_model(store, CreateRequest(model=arch, files={"t.gguf": t}, draft_files={"d.gguf": dr},
                                          parameters={"temperature": 0.0}))
        with_head, _ = store.add_file(make_pair(d, seed=5, moe=moe, mtp=True).path)
        create_model(store, CreateRequest(model=f"{arch}-mtp", files={"t.gguf": with_head},
                                          parameters={"temperature": 0.0, "drafter": "mtp"}))
    with ServerThread(store, Settings(num_thread=1)) as server:
        yield server


@pytest.mark.parametrize("arch", list(ARCHS))
def test_chat_with_and_without_drafters(srv: ServerThread, arch: str) -> None:
    messages = [{"role": "user", "content": "def fib(n): return the"}]
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        show = http.post("/api/show", json={"model": arch}).json()
        assert show["model_info"]["general.architecture"] == arch and "completion" in show["capabilities"]
        runs = {}
        for drafter in ("none", "model", "ngram"):
            r = http.post("/api/chat", json={"model": arch, "messages": messages, "stream": False,
                                             "options": {"num_predict": 24, "drafter": drafter}})
            assert r.status_code == 200, r.text
            runs[drafter] = out = r.json()
            assert out["done"] and out["eval_count"] == 24 and SPEC_FIELDS <= set(out) and out["drafter"] == REPORTED_DRAFTER[drafter]
    assert runs["model"]["draft_n_accepted"] > 0 and runs["model"]["acceptance_by_position"]
    assert runs["model"]["snapshot_bytes"] > 0  # the recurrent states held for rollback, reported per request
    assert runs["model"]["message"] == runs["none"]["message"] == runs["ngram"]["message"]
    assert runs["none"]["message"]["content"]

    # A second turn through the ollama client, streamed: the cached prefix is reused and the answer matches a
    # cold run of the same conversation.
    client = ollama.Client(host=srv.url, timeout=120)
    follow = messages + [runs["none"]["message"], {"role": "user", "content": "and then?"}]
    parts = list(client.chat(model=arch, messages=follow, stream=True, options={"num_predict": 12}))
    warm = "".join(p.message.content for p in parts)
    assert parts[-1].done and parts[-1].eval_count == 12
    client.generate(model=arch, keep_alive=0)  # unload: the next run starts from an empty cache
    cold = client.chat(model=arch, messages=follow, options={"num_predict": 12})
    assert cold.message.content == warm


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_models_own_mtp_head_drafts_without_a_draft_line(srv: ServerThread, arch: str) -> None:
    name = f"{arch}-mtp"
    client = ollama.Client(host=srv.url, timeout=120)
    show = client.show(name)
    assert show.modelinfo[f"{arch}.nextn_predict_layers"] == 1 and show.modelinfo[f"{arch}.block_count"] == 5
    messages = [{"role": "user", "content": "def fib(n): return the"}]
    with httpx.Client(base_url=srv.url, timeout=120) as http:  # raw lines: the ollama client drops extra fields
        with http.stream("POST", "/api/chat", json={"model": name, "messages": messages,
                                                     # fixed: the depth is the head's test, not the controller's
                                                     "options": {"num_predict": 24, "draft_num_predict": 3,
                                                                 "draft_schedule": "fixed"}}) as r:
            parts = [json.loads(line) for line in r.iter_lines() if line.strip()]
    final = parts[-1]
    assert final["done"] and final["drafter"] == "mtp+suffix" and final["draft_n"] >= 3
    assert len(final["acceptance_by_position"]) == 3
    plain = client.chat(model=name, messages=messages, options={"num_predict": 24, "drafter": "none"})
    assert "".join(p["message"]["content"] for p in parts) == plain.message.content
