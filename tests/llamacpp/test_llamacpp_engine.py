"""The llamacpp engine against a real llama-server (scripts/install_llama_server.sh builds it): tiny random GGUFs of
six architectures the native engine does not run, written by llama.cpp's own converter, are created and served
through ``engine auto`` with the greedy text llama-server gives on the same file; /api/show and /api/ps say which
engine serves a model and why; a DRAFT pair speculates through llama.cpp with statistics and the text of no draft;
options only the native engine has are refused naming the engine; a killed llama-server is replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import ollama
import pytest

from blobs import BlobStore
from engine.contract.llamacpp_launch import find_llama_server
from importer import CreateRequest, create_model
from server.settings import Settings
from tests.llamacpp_models import ARCHITECTURES, converter, write_copy, write_models
from tests.process_tree import alive, backend_pid
from tests.realmodels import smollm2_gguf
from tests.server_thread import ServerThread, free_port

pytestmark = pytest.mark.skipif(find_llama_server() is None or converter() is None,
                                reason="llama-server not installed (scripts/install_llama_server.sh)")

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    smollm2 = smollm2_gguf()
    if smollm2 is None:
        pytest.skip("SmolLM2 GGUF package not installed (its tokenizer is the tiny models')")
    return write_models(tmp_path_factory.mktemp("llamacpp"), smollm2)


@pytest.fixture(scope="module")
def srv(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    store = BlobStore(tmp_path_factory.mktemp("store"))
    for name, path in models.items():
        digest, _ = store.add_file(path)
        create_model(store, CreateRequest(model=name, files={"m.gguf": digest}, parameters={"temperature": 0}))
    target, _ = store.add_file(models["phi2"])
    # the same weights as another file: every draft is the target's own token
    draft = write_copy(models["phi2"].parent / "phi2", tmp_path_factory.mktemp("draft") / "d.gguf", "phi2-draft")
    draft_digest, _ = store.add_file(draft)
    create_model(store, CreateRequest(model="phi2-pair", files={"m.gguf": target}, draft_files={"d.gguf": draft_digest},
                                      parameters={"temperature": 0, "draft_num_predict": 4, "draft_schedule": "fixed"}))
    create_model(store, CreateRequest(model="phi2-ngram", files={"m.gguf": target}, parameters={
        "temperature": 0, "drafter": "ngram", "draft_num_predict": 4, "draft_schedule": "fixed"}))
    with ServerThread(store, Settings(num_thread=1, num_parallel=1)) as s:
        yield s


def llama_server_text(gguf: Path, prompt: str, n_predict: int) -> str:
    """What llama-server itself answers for ``prompt`` (greedy), started directly on the same file."""
    port = free_port()
    proc = subprocess.Popen([find_llama_server(), "-m", str(gguf), "--port", str(port), "-c", "512", "-np", "1", "-t", "1",
                             "--no-webui"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
                time.sleep(0.1)
            r = c.post("/completion", json={"prompt": prompt, "n_predict": n_predict, "temperature": 0})
            return r.json()["content"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_an_architecture_the_native_engine_lacks_is_served_as_llama_server_serves_it(srv: ServerThread, models,
                                                                                      arch: str) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        engine = http.post("/api/show", json={"model": arch}).json()["engine"]
        assert engine["backend"] == "llamacpp" and "the native engine does not run architecture" in engine["why"]
        r = http.post("/api/generate", json={"model": arch, "prompt": PROMPT, "raw": True, "stream": False,
                                             "options": {"num_predict": 12}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["done"] and out["eval_count"] == 12 and out["drafter"] == "none"
        [loaded] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == f"{arch}:latest"]
        assert loaded["engine"]["backend"] == "llamacpp"
    assert out["response"] == llama_server_text(models[arch], PROMPT, 12)


def test_the_ollama_client_streams_a_llamacpp_model(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url, timeout=120)
    parts = list(client.generate(model="olmo2", prompt=PROMPT, raw=True, stream=True, options={"num_predict": 8}))
    assert parts[-1].done and parts[-1].eval_count == 8
    whole = client.generate(model="olmo2", prompt=PROMPT, raw=True, options={"num_predict": 8})
    assert "".join(p.response for p in parts) == whole.response


def test_a_draft_pair_speculates_through_llama_cpp_with_the_text_of_no_draft(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "phi2-pair", "prompt": PROMPT, "raw": True, "stream": False, "options": {"num_predict": 24}}
        drafted = http.post("/api/generate", json=body).json()
        plain = http.post("/api/generate", json={**body, "options": {"num_predict": 24, "drafter": "none"}}).json()
    assert drafted["drafter"] == "model" and drafted["draft_n"] > 0
    assert drafted["draft_n_accepted"] == drafted["draft_n"]  # the drafter is the target itself
    assert plain["drafter"] == "none" and plain["draft_n"] == 0
    assert drafted["response"] == plain["response"]
    [loaded] = [m for m in httpx.get(f"{srv.url}/api/ps").json()["models"] if m["name"] == "phi2-pair:latest"]
    assert loaded["engine"]["speculative_method"] == "draft-simple"  # drafter none was one request's, not a restart


def test_the_ngram_drafter_speculates_through_llama_cpp_with_the_text_of_no_draft(srv: ServerThread) -> None:
    prompt = "one two three four five one two three four five one two three"
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "phi2-ngram", "prompt": prompt, "raw": True, "stream": False, "options": {"num_predict": 48}}
        drafted = http.post("/api/generate", json=body).json()
        plain = http.post("/api/generate", json={**body, "options": {"num_predict": 48, "drafter": "none"}}).json()
        [loaded] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "phi2-ngram:latest"]
    assert loaded["engine"]["speculative_method"] == "ngram-simple"
    assert drafted["drafter"] == "ngram" and drafted["draft_n"] > 0 and drafted["draft_n_accepted"] <= drafted["draft_n"]
    assert plain["drafter"] == "none" and plain["draft_n"] == 0
    assert drafted["response"] == plain["response"]


def test_an_option_only_the_native_engine_has_is_refused_naming_the_engine(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/api/generate", json={"model": "phi2", "prompt": "x", "stream": False,
                                                    "options": {"relaxed_top_n": 3}}, timeout=60)
    assert r.status_code == 400 and "llamacpp engine" in r.json()["error"]


def loaded(http: httpx.Client, name: str) -> dict:
    [model] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == f"{name}:latest"]
    return model


def test_a_killed_llama_server_is_replaced(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "granite", "prompt": PROMPT, "raw": True, "stream": False, "options": {"num_predict": 4}}
        first = http.post("/api/generate", json=body).json()
        os.kill(backend_pid(loaded(http, "granite")["engine"]["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(m["name"] == "granite:latest" for m in http.get("/api/ps").json()["models"]):
            assert time.monotonic() < deadline, "the engine whose llama-server died is still listed"
            time.sleep(0.2)
        again = http.post("/api/generate", json=body)
    assert again.status_code == 200 and again.json()["response"] == first["response"]


def test_a_request_to_a_frozen_llama_server_is_served_by_its_replacement(srv: ServerThread) -> None:
    """Nothing had streamed when the watchdog replaced the engine whose llama-server froze: the request is tried
    once on the new one, and the frozen server is stopped with the engine process it belonged to."""
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "starcoder2", "prompt": PROMPT, "raw": True, "stream": False, "options": {"num_predict": 6}}
        first = http.post("/api/generate", json=body).json()
        engine = loaded(http, "starcoder2")["engine"]["pid"]
        frozen = backend_pid(engine)
        os.kill(frozen, signal.SIGSTOP)
        try:
            again = http.post("/api/generate", json=body)
            assert again.status_code == 200 and again.json()["response"] == first["response"], again.text
            assert loaded(http, "starcoder2")["engine"]["pid"] != engine
            deadline = time.monotonic() + 30
            while alive(frozen) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not alive(frozen)
        finally:
            if alive(frozen):
                os.kill(frozen, signal.SIGKILL)


def test_a_cancelled_stream_stops_llama_servers_generation(srv: ServerThread) -> None:
    """The client goes away after a few chunks: llama-server stops generating (its slot's decoded count stays far
    below what was asked) and the model serves the next request."""
    asked = 1500
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "olmo2", "prompt": PROMPT, "raw": True, "options": {"num_predict": asked}}
        with http.stream("POST", "/api/generate", json=body) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i == 3:
                    break
        endpoint = loaded(http, "olmo2")["engine"]["endpoint"]
        deadline = time.monotonic() + 60
        while True:
            [slot] = httpx.get(f"{endpoint}/slots").json()
            if not slot["is_processing"]:
                break
            assert time.monotonic() < deadline, "llama-server kept generating for a client that left"
            time.sleep(0.05)
        assert slot["next_token"][0]["n_decoded"] < asked
        after = http.post("/api/generate", json={**body, "stream": False, "options": {"num_predict": 4}})
    assert after.status_code == 200 and after.json()["eval_count"] == 4


def test_keep_alive_zero_unloads_and_stops_llama_server(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        http.post("/api/generate", json={"model": "gpt-oss", "prompt": PROMPT, "raw": True, "stream": False,
                                         "options": {"num_predict": 2}})
        server = backend_pid(loaded(http, "gpt-oss")["engine"]["pid"])
        r = http.post("/api/generate", json={"model": "gpt-oss", "keep_alive": 0})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload"
        assert all(m["name"] != "gpt-oss:latest" for m in http.get("/api/ps").json()["models"])
        deadline = time.monotonic() + 30
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not alive(server)
