"""Suffix drafting through the server (issue 50): a model without a DRAFT speculates from what it wrote before, a
PARAMETER turns it off, the statistics name it, TANDEM_SUFFIX_TOKENS bounds it and an unload forgets it."""

from __future__ import annotations

import httpx
import pytest

from blobs import BlobStore
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.server_thread import ServerThread, write_pair

PROMPT = "def fib(n): return the"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> BlobStore:
    d = tmp_path_factory.mktemp("suffix")
    target, _ = write_pair(d)
    store = BlobStore(d / "models")
    digest, _ = store.add_file(target)
    params = {"temperature": 0.0, "num_predict": 32}
    create_model(store, CreateRequest(model="solo", files={"t.gguf": digest}, parameters=params))
    create_model(store, CreateRequest(model="solo-off", files={"t.gguf": digest},
                                      parameters={**params, "draft_suffix": False}))
    return store


def final(http: httpx.Client, model: str, **body) -> dict:
    """The final chunk of a greedy generation at a fixed depth (counts of drafts must not depend on measured
    times, which the adaptive depth follows)."""
    r = http.post("/api/generate", json={"model": model, "prompt": PROMPT, "stream": False,
                                         "options": {"draft_schedule": "fixed"}, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_retry_is_drafted_from_the_first_answer_until_the_model_unloads(store: BlobStore) -> None:
    with ServerThread(store) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        first = final(http, "solo")
        again = final(http, "solo", keep_alive=0)  # answered, then unloaded
        assert first["response"] == again["response"] and first["drafter"] == again["drafter"] == "suffix"
        assert again["mean_accepted_length"] > 3 and again["acceptance_rate"] == 1.0
        reloaded = final(http, "solo")
        assert reloaded["response"] == first["response"]
        assert reloaded["mean_accepted_length"] < again["mean_accepted_length"]  # the store went with the model
        show = http.post("/api/show", json={"model": "solo"}).json()["speculation"]["effective"]
        assert (show["drafter"], show["draft_suffix"], show["draft_num_predict"]) == ("suffix", True, 16)
        # PARAMETER draft_suffix false: Ollama's rule, no speculation without a DRAFT
        off = final(http, "solo-off")
        assert off["drafter"] == "none" and off["response"] == first["response"]
        assert http.post("/api/show", json={"model": "solo-off"}).json()["speculation"]["effective"][
            "drafter"] == "none"


def test_the_server_bounds_the_store(store: BlobStore) -> None:
    """TANDEM_SUFFIX_TOKENS=0 keeps nothing: a retry drafts only what the request's own text offers."""
    settings = Settings.from_env({"TANDEM_SUFFIX_TOKENS": "0"})
    assert settings.suffix_tokens == 0 and Settings.from_env({}).suffix_tokens == 131072
    retries = []
    for bound in (0, 131072):
        with ServerThread(store, Settings(num_thread=1, suffix_tokens=bound)) as srv, \
                httpx.Client(base_url=srv.url, timeout=120) as http:
            first = final(http, "solo")
            again = final(http, "solo")
            assert again["response"] == first["response"] and again["drafter"] == "suffix"
            retries.append(again["mean_accepted_length"])
    assert retries[0] < retries[1]
