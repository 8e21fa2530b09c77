"""/api/embed, /api/embeddings and /v1/embeddings on a real server thread: a tiny random sentence-transformers
BERT folder created through the importer (its nested 1_Pooling/config.json uploaded as such), the vectors
checked against transformers' mean pooling (normalised as Ollama does), the real `ollama`, `openai` and
`langchain_ollama` clients, and the error answers (Ollama's texts and statuses; OpenAI's shape on /v1)."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from importer import CreateRequest, create_model
from tests.hf_tiny_bert import folder_files, make_bert_folder, reference
from tests.server_thread import ServerThread, make_store

TEXTS = ["Héllo wörld, café crème!", "東京は日本の首都です。", "The quick brown fox (jumps) over the lazy dog."]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("embed")
    store = make_store(d)  # "tiny": a qwen2 completion model
    folder = make_bert_folder(d / "bert")
    files = {name: store.add_file(path)[0] for name, path in folder_files(folder).items()}
    assert "1_Pooling/config.json" in files
    create_model(store, CreateRequest(model="minibert", files=files))
    raw = make_bert_folder(d / "raw", pooling="cls", normalize=False, seed=3)  # no Normalize module
    create_model(store, CreateRequest(model="rawbert", files={n: store.add_file(p)[0]
                                                              for n, p in folder_files(raw).items()}))
    with ServerThread(store) as s:
        s.folder = folder
        yield s


@pytest.fixture(scope="module")
def expected(srv: ServerThread) -> dict[str, np.ndarray]:
    """transformers' mean-pooled, L2-normalised vectors (what sentence-transformers computes)."""
    hf, tok = reference(srv.folder)
    out = {}
    for t in TEXTS + ["a b c", ""]:
        ids = tok(t, return_tensors="pt")["input_ids"]
        v = hf(ids).last_hidden_state[0].mean(0)
        out[t] = (v / v.norm()).detach().numpy()
    return out


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_api_embed_list_and_string(srv: ServerThread, expected) -> None:
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": TEXTS}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "minibert"
    assert set(body) == {"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}
    assert len(body["embeddings"]) == 3
    for t, v in zip(TEXTS, body["embeddings"]):
        assert len(v) == 32
        assert abs(np.linalg.norm(v) - 1) < 1e-5
        assert _cos(v, expected[t]) > 1 - 1e-6
    one = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": TEXTS[0]}, timeout=60).json()
    assert np.allclose(one["embeddings"][0], body["embeddings"][0], atol=1e-6)
    assert one["prompt_eval_count"] < body["prompt_eval_count"]


def test_dimensions_truncate_and_renormalise(srv: ServerThread, expected) -> None:
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": "a b c", "dimensions": 8}, timeout=60)
    v = np.array(r.json()["embeddings"][0])
    assert v.shape == (8,) and abs(np.linalg.norm(v) - 1) < 1e-5
    want = expected["a b c"][:8]
    assert _cos(v, want) > 1 - 1e-6


def test_truncate_false_and_too_long(srv: ServerThread) -> None:
    long = " ".join(["semantic search embeddings vectors"] * 40)  # past the 64 positions
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": long, "truncate": False}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "the input length exceeds the context length"}
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": long}, timeout=60)
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 64
    for num_ctx in (0, 1, 2):  # an explicit context with no room for a token between [CLS] and [SEP], as Ollama
        r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": "x y", "truncate": True,
                                                     "options": {"num_ctx": num_ctx}}, timeout=60)
        assert (r.status_code, r.json()) == (400, {"error": "input after truncation exceeds maximum context length"})


def test_empty_inputs_and_bad_inputs(srv: ServerThread) -> None:
    for empty in ("", []):
        r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": empty}, timeout=60)
        assert r.status_code == 200 and r.json() == {"model": "minibert", "embeddings": []}
    for bad in ([1, 2], ["a", 3], 5, {"a": 1}):
        r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": bad}, timeout=60)
        assert r.status_code == 400 and r.json() == {"error": "invalid input type"}
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "nope", "input": "x"}, timeout=60)
    assert r.status_code == 404 and r.json() == {"error": "model 'nope' not found"}
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "bad/name/x:y:z", "input": "x"}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "invalid model name"}
    r = httpx.post(f"{srv.url}/api/embed", json={"input": "x"}, timeout=60)
    assert r.status_code == 404 and r.json() == {"error": "model '' not found"}
    r = httpx.post(f"{srv.url}/api/embed", content=b"", timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "missing request body"}
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": "x", "truncate": "yes"}, timeout=60)
    assert r.status_code == 400 and "cannot unmarshal string" in r.json()["error"]


def test_legacy_embeddings(srv: ServerThread, expected) -> None:
    r = httpx.post(f"{srv.url}/api/embeddings", json={"model": "minibert", "prompt": TEXTS[1]}, timeout=60)
    assert r.status_code == 200 and set(r.json()) == {"embedding"}
    assert _cos(r.json()["embedding"], expected[TEXTS[1]]) > 1 - 1e-6
    r = httpx.post(f"{srv.url}/api/embeddings", json={"model": "minibert", "prompt": ""}, timeout=60)
    assert r.status_code == 200 and r.json() == {"embedding": []}
    r = httpx.post(f"{srv.url}/api/embeddings", json={"prompt": "x"}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "model is required"}


def test_capabilities_and_generate_refused(srv: ServerThread) -> None:
    show = httpx.post(f"{srv.url}/api/show", json={"model": "minibert"}, timeout=60).json()
    assert show["capabilities"] == ["embedding"]
    assert show["model_info"]["bert.pooling_type"] == 1
    assert "embedding" not in httpx.post(f"{srv.url}/api/show", json={"model": "tiny"}, timeout=60).json()["capabilities"]
    r = httpx.post(f"{srv.url}/api/generate", json={"model": "minibert", "prompt": "hi", "stream": False}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": '"minibert" does not support generate'}
    r = httpx.post(f"{srv.url}/api/generate", json={"model": "minibert"}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": '"minibert" does not support generate'}
    r = httpx.post(f"{srv.url}/api/chat", json={"model": "minibert", "messages": [{"role": "user", "content": "hi"}],
                                                 "stream": False}, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": '"minibert" does not support chat'}
    r = httpx.post(f"{srv.url}/v1/chat/completions",
                   json={"model": "minibert", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == '"minibert" does not support chat'


def test_decoder_model_is_refused_as_ollama(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "tiny", "input": "hello"}, timeout=60)
    assert r.status_code == 501 and r.json() == {"error": '"tiny" does not support embeddings'}
    r = httpx.post(f"{srv.url}/api/embeddings", json={"model": "tiny", "prompt": "hello"}, timeout=60)
    assert r.status_code == 500 and r.json() == {"error": '"tiny" does not support embeddings'}
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "tiny", "input": "hello"}, timeout=60)
    assert r.status_code == 501 and r.json()["error"]["message"] == '"tiny" does not support embeddings'
    # an empty input only loads the model, as Ollama's handler does
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "tiny", "input": []}, timeout=600)  # a cold load
    assert r.status_code == 200 and r.json() == {"model": "tiny", "embeddings": []}


def test_v1_embeddings_float_base64_and_errors(srv: ServerThread, expected) -> None:
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "minibert", "input": TEXTS[:2]}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["model"] == "minibert"
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert _cos(body["data"][0]["embedding"], expected[TEXTS[0]]) > 1 - 1e-6
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "minibert", "input": TEXTS[0], "encoding_format": "base64",
                                                    "dimensions": 16}, timeout=60)
    v = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert v.shape == (16,) and _cos(v, expected[TEXTS[0]][:16]) > 1 - 1e-6
    # "" is one empty input ([CLS] [SEP]), as Ollama's middleware makes it
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "minibert", "input": ""}, timeout=60)
    assert r.status_code == 200 and _cos(r.json()["data"][0]["embedding"], expected[""]) > 1 - 1e-6
    for payload, message in (({"model": "minibert"}, "invalid input"), ({"model": "minibert", "input": []}, "invalid input"),
                             ({"model": "minibert", "input": [[1, 2, 3]]}, "invalid input type"),
                             ({"model": "minibert", "input": "x", "encoding_format": "int8"},
                              "Invalid value for 'encoding_format' = int8. Supported values: ['float', 'base64']."),
                             ({"model": "nope", "input": "x"}, "model 'nope' not found")):
        r = httpx.post(f"{srv.url}/v1/embeddings", json=payload, timeout=60)
        assert r.status_code in (400, 404) and r.json()["error"]["message"] == message, payload
        assert r.json()["error"]["type"] in ("invalid_request_error", "not_found_error")


def test_real_clients(srv: ServerThread, expected) -> None:
    import ollama
    import openai
    from langchain_ollama import OllamaEmbeddings

    client = ollama.Client(host=srv.url)
    r = client.embed(model="minibert", input=TEXTS)
    assert len(r.embeddings) == 3 and _cos(r.embeddings[2], expected[TEXTS[2]]) > 1 - 1e-6
    assert r.prompt_eval_count > 0
    legacy = client.embeddings(model="minibert", prompt=TEXTS[0])
    assert _cos(legacy.embedding, expected[TEXTS[0]]) > 1 - 1e-6
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input="x")
    assert e.value.status_code == 501

    oa = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x")
    for fmt in ("float", "base64"):
        res = oa.embeddings.create(model="minibert", input=TEXTS, encoding_format=fmt)
        assert [d.index for d in res.data] == [0, 1, 2]
        got = res.data[1].embedding
        if isinstance(got, str):  # the client hands base64 back undecoded when asked for it explicitly
            got = np.frombuffer(base64.b64decode(got), dtype="<f4")
        assert _cos(got, expected[TEXTS[1]]) > 1 - 1e-6
    res = oa.embeddings.create(model="minibert", input=TEXTS[0])  # the SDK's default: base64, decoded by it
    assert _cos(res.data[0].embedding, expected[TEXTS[0]]) > 1 - 1e-6

    emb = OllamaEmbeddings(model="minibert", base_url=srv.url)
    assert _cos(emb.embed_query(TEXTS[0]), expected[TEXTS[0]]) > 1 - 1e-6
    docs = emb.embed_documents(TEXTS)
    assert all(_cos(d, expected[t]) > 1 - 1e-6 for d, t in zip(docs, TEXTS))


def test_tandem_create_from_folder_through_the_server(srv: ServerThread, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, expected) -> None:
    """`tandem create NAME -f Modelfile` with `FROM <sentence-transformers folder>`: the CLI uploads the
    folder's files (1_Pooling/config.json under that name) and the server converts them."""
    from server.cli import main

    (tmp_path / "Modelfile").write_text(f"FROM {srv.folder}\n")
    monkeypatch.setenv("TANDEM_HOST", srv.url)
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "local-store"))  # must stay unused
    assert main(["create", "cli-bert", "-f", str(tmp_path / "Modelfile")]) == 0
    assert not (tmp_path / "local-store").exists()
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "cli-bert", "input": TEXTS[0]}, timeout=60)
    assert r.status_code == 200 and _cos(r.json()["embeddings"][0], expected[TEXTS[0]]) > 1 - 1e-6


def test_keep_alive_zero_unloads(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": "x", "keep_alive": 0}, timeout=60)
    assert r.status_code == 200
    for _ in range(100):  # the unload runs after the answer
        if not any(m["name"].startswith("minibert") for m in httpx.get(f"{srv.url}/api/ps").json()["models"]):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("minibert stayed loaded after keep_alive 0")
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": "x", "keep_alive": "5m"}, timeout=60)
    ps = httpx.get(f"{srv.url}/api/ps").json()["models"]
    assert r.status_code == 200 and r.json()["load_duration"] > 0
    assert any(m["name"].startswith("minibert") for m in ps)


def test_legacy_returns_raw_vectors_of_a_model_that_does_not_normalise(srv: ServerThread) -> None:
    """Ollama's legacy endpoint returns the runner's output: a model without a Normalize module gets its raw
    CLS vector there, while /api/embed always normalises."""
    legacy = np.array(httpx.post(f"{srv.url}/api/embeddings", json={"model": "rawbert", "prompt": TEXTS[0]},
                                 timeout=60).json()["embedding"])
    embed = np.array(httpx.post(f"{srv.url}/api/embed", json={"model": "rawbert", "input": TEXTS[0]},
                                timeout=60).json()["embeddings"][0])
    assert abs(np.linalg.norm(legacy) - 1) > 1e-2 and abs(np.linalg.norm(embed) - 1) < 1e-5
    assert np.allclose(legacy / np.linalg.norm(legacy), embed, atol=1e-6)


def test_tandem_run_prints_the_vector(srv: ServerThread, expected, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    """`tandem run` on an embedding model prints the input's vector as one JSON line (Ollama's CLI)."""
    import io
    import json

    from server.cli import main

    monkeypatch.setenv("TANDEM_HOST", srv.url)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # piped, empty: the argument is the input
    assert main(["run", "minibert", TEXTS[0]]) == 0
    v = json.loads(capsys.readouterr().out)
    assert len(v) == 32 and _cos(v, expected[TEXTS[0]]) > 1 - 1e-6
    assert main(["run", "minibert", "a", "b", "c", "--dimensions", "8"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 8
    assert main(["run", "minibert"]) == 1
    assert "embedding models require input text" in capsys.readouterr().err


def test_concurrent_requests_are_served_together_and_each_gets_its_own_vectors(srv: ServerThread,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight clients at once, one text each: the engine serves them in fewer calls than requests (requests that
    wait while a call runs merge into the next), and each client gets the vector it gets alone."""
    texts = [f"sentence number {i} about embeddings" for i in range(8)]
    alone = [httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": t}, timeout=120).json()
             for t in texts]
    (runner,) = [r for r in srv.lifecycle.loaded() if r.name == "minibert:latest"]
    assert runner.facts.num_parallel > 1
    calls_before = runner.engine._embeds.calls
    engine_call = runner.engine._embeds._run

    def slow_call(req):  # the tiny model answers in a millisecond: give the other requests time to arrive
        time.sleep(0.3)
        return engine_call(req)

    monkeypatch.setattr(runner.engine._embeds, "_run", slow_call)
    out: list = [None] * len(texts)

    def one(i: int) -> None:
        out[i] = httpx.post(f"{srv.url}/api/embed", json={"model": "minibert", "input": texts[i]}, timeout=120).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for got, want in zip(out, alone):
        np.testing.assert_allclose(got["embeddings"][0], want["embeddings"][0], rtol=1e-5, atol=1e-6)
        assert got["prompt_eval_count"] == want["prompt_eval_count"]
    assert runner.engine._embeds.calls - calls_before < len(texts)


class _DiesBeforeFirstEmbed:
    """A real engine client whose process is killed (SIGKILL) just before the first embedding request reaches
    it, as a crash between the lease and the answer would."""

    killed: list[int] = []

    def __init__(self) -> None:
        from server.engine_process.client import EngineClient

        self._client = EngineClient()

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def embed(self, req):
        import os
        import signal

        if not _DiesBeforeFirstEmbed.killed:
            _DiesBeforeFirstEmbed.killed.append(self._client.pid)
            os.kill(self._client.pid, signal.SIGKILL)
            self._client._proc.join(5)
        return self._client.embed(req)


def test_an_embedding_whose_engine_died_before_answering_is_served_by_a_new_engine(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    folder = make_bert_folder(tmp_path / "bert")
    create_model(store, CreateRequest(model="minibert", files={n: store.add_file(p)[0]
                                                               for n, p in folder_files(folder).items()}))
    with ServerThread(store, engine_factory=_DiesBeforeFirstEmbed) as s:
        r = httpx.post(f"{s.url}/api/embed", json={"model": "minibert", "input": TEXTS}, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["embeddings"]) == len(TEXTS)
        (runner,) = s.lifecycle.loaded()
        assert _DiesBeforeFirstEmbed.killed and runner.engine.pid != _DiesBeforeFirstEmbed.killed[0]
