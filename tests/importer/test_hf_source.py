"""`hf.co/<org>/<repo>[:<tag>]` as a model source (importer.hf_source): for `/api/pull`, `FROM` and `DRAFT`.

A local HTTP server stands in for the Hub (HF_ENDPOINT, tests/hf_mock.py) and each test gets its own HF cache
(HF_HUB_CACHE), so nothing leaves the machine; offline behaviour is HF_HUB_OFFLINE=1 over that cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from blobs import BlobStore
from blobs.model import load_stored_model
from importer import (
    CreateError,
    CreateRequest,
    LocalBlobSink,
    ProgressEvent,
    hf_source,
    request_from_modelfile,
)
from importer.hf_source import HFSourceError, choose_gguf, is_hf_name, parse_hf_name
from modelfile import parse
from server import hf_pull as pull_module
from server.cli import main
from tests.hf_mock import HFMock
from tests.server_thread import ServerThread, free_port, ndjson
from tests.tiny_gguf import TinySpec, write_tiny_gguf

ST_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
             "num_hidden_layers": 1, "vocab_size": 284, "torch_dtype": "bfloat16"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Two quantizations of one tiny qwen2 model (different weights so that the choice shows), a drafter
    with the same vocabulary, and the files of a safetensors repo."""
    d = tmp_path_factory.mktemp("hf-files")
    out = {}
    for key, spec in (("q8", TinySpec(arch="qwen2", seed=11, n_layer=1)),
                      ("q4", TinySpec(arch="qwen2", seed=12, n_layer=1)),
                      ("draft", TinySpec(arch="qwen2", seed=13, n_layer=1))):
        write_tiny_gguf(d / f"{key}.gguf", spec)
        out[key] = (d / f"{key}.gguf").read_bytes()
    return out


@pytest.fixture
def hub(files: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    mock = HFMock({
        "org/tiny-GGUF": {"tiny-Q8_0.gguf": files["q8"], "tiny-Q4_K_M.gguf": files["q4"],
                          "mmproj-tiny-F16.gguf": b"GGUF-not-a-model", "README.md": b"# tiny"},
        "org/draft-GGUF": {"draft-Q4_K_M.gguf": files["draft"], "README.md": b"# draft"},
        "org/odd-GGUF": {"odd-IQ2_XS.gguf": files["q8"], "odd-Q3_K_S.gguf": files["q4"]},
        "org/split-GGUF": {"big-Q4_K_M-00001-of-00002.gguf": b"GGUF1", "big-Q4_K_M-00002-of-00002.gguf": b"GGUF2"},
        "org/tiny-st": {"config.json": json.dumps(ST_CONFIG).encode(), "model.safetensors": b"weights" * 10,
                        "tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}",
                        "chat_template.jinja": b"{{ messages }}", "README.md": b"# st",
                        "original/consolidated.safetensors": b"other", "onnx/model.onnx": b"onnx"},
        "org/nothing": {"README.md": b"# nothing", "model.bin": b"pt"},
    })
    monkeypatch.setenv("HF_ENDPOINT", mock.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield mock
    mock.close()


def events() -> tuple[list[ProgressEvent], Callable[[ProgressEvent], None]]:
    got: list[ProgressEvent] = []
    return got, got.append


# --- names and choice rules --------------------------------------------------------------------------------


def test_names() -> None:
    assert is_hf_name("hf.co/org/repo") and is_hf_name("huggingface.co/org/repo:Q8_0") and is_hf_name("HF.CO/a/b")
    assert not is_hf_name("llama3.2") and not is_hf_name("org/repo") and not is_hf_name("./x.gguf")
    ref = parse_hf_name("hf.co/Org/Tiny-GGUF:q8_0")
    assert (ref.repo_id, ref.quant, str(ref.name)) == ("Org/Tiny-GGUF", "q8_0", "hf.co/Org/Tiny-GGUF:q8_0")
    latest = parse_hf_name("huggingface.co/org/repo")
    assert latest.quant is None and latest.name.tag == "latest" and latest.repo_id == "org/repo"
    with pytest.raises(HFSourceError, match="not a Hugging Face model name"):
        parse_hf_name("registry.ollama.ai/library/llama3")


def test_choose_gguf_rules() -> None:
    files = ["m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-q8_0.gguf", "mmproj-m-F16.gguf", "README.md"]
    assert choose_gguf(files, None, "o/r") == "m-Q4_K_M.gguf"  # latest = Q4_K_M
    assert choose_gguf(files, "Q4_K", "o/r") == "m-Q4_K.gguf"  # whole word: Q4_K is not Q4_K_M
    assert choose_gguf(files, "Q8_0", "o/r") == "m-q8_0.gguf"  # case-insensitive
    assert choose_gguf(["only-Q6_K.gguf", "mmproj-F16.gguf"], None, "o/r") == "only-Q6_K.gguf"  # the only one
    with pytest.raises(HFSourceError) as e:
        choose_gguf(files, "F16", "o/r")  # the mmproj's F16 does not count
    assert str(e.value) == 'no GGUF file for quantization "F16" in hf.co/o/r (available: Q4_K, Q4_K_M, Q8_0)'
    assert e.value.status == 404
    with pytest.raises(HFSourceError, match="split into several files"):
        choose_gguf(["x-Q4_K_M-00001-of-00002.gguf", "x-Q4_K_M-00002-of-00002.gguf"], None, "o/r")
    with pytest.raises(HFSourceError, match="has no GGUF files"):
        choose_gguf(["model.safetensors"], None, "o/r")


# --- resolving against the (mock) Hub ----------------------------------------------------------------------


def test_fetch_gguf_by_tag(hub: HFMock, files: dict[str, bytes]) -> None:
    got, progress = events()
    sel, fetched = hf_source.fetch("hf.co/org/tiny-GGUF:q8_0", progress)
    assert sel.kind == "gguf" and [f.name for _, f in fetched] == ["tiny-Q8_0.gguf"]
    path, f = fetched[0]
    assert path.read_bytes() == files["q8"] and f.sha256 == sha(files["q8"])
    assert got[0].status == "pulling manifest"
    assert got[-1] == ProgressEvent(f"pulling {f.sha256[:12]}", f"sha256:{f.sha256}", len(files["q8"]), len(files["q8"]))
    # latest is Q4_K_M; the mmproj and the README are never fetched
    _, [(path, _)] = hf_source.fetch("hf.co/org/tiny-GGUF")
    assert path.read_bytes() == files["q4"]
    assert hub.downloads() == ["org/tiny-GGUF/tiny-Q8_0.gguf", "org/tiny-GGUF/tiny-Q4_K_M.gguf"]
    # a second fetch comes from the HF cache
    hf_source.fetch("hf.co/org/tiny-GGUF:Q8_0")
    assert len(hub.downloads()) == 2


def test_token(hub: HFMock, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_TOKEN, read when the request is made, goes with the listing and the download."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    n = len(hub.requests)
    hf_source.fetch("hf.co/org/draft-GGUF")
    sent = [(path, auth) for (_, path), auth in zip(hub.requests[n:], hub.authorization[n:], strict=True)
            if path.startswith(("/api/models/", "/org/"))]
    assert len(sent) == 3 and all(auth == "Bearer hf_secret" for _, auth in sent)


def test_errors(hub: HFMock) -> None:
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/odd-GGUF")
    assert str(e.value) == 'no GGUF file for quantization "Q4_K_M" in hf.co/org/odd-GGUF (available: IQ2_XS, Q3_K_S)'
    with pytest.raises(HFSourceError, match=r'"Q3_K" in hf.co/org/odd-GGUF \(available: IQ2_XS, Q3_K_S\)'):
        hf_source.fetch("hf.co/org/odd-GGUF:Q3_K")
    with pytest.raises(HFSourceError, match="split into several files; split GGUFs are not supported yet"):
        hf_source.fetch("hf.co/org/split-GGUF")
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/missing")
    assert e.value.status == 404 and str(e.value).startswith("hf.co/org/missing not found")
    with pytest.raises(HFSourceError, match="has no GGUF files, nor safetensors weights with a config.json"):
        hf_source.fetch("hf.co/org/nothing")
    assert hub.downloads() == []  # nothing was downloaded for any of them


def test_safetensors_repo(hub: HFMock) -> None:
    repo = hub.repos["org/tiny-st"]
    sel, fetched = hf_source.fetch("hf.co/org/tiny-st")
    assert sel.kind == "safetensors"
    # top-level weights, json, tokenizer and chat template; not the README nor the sub-folders
    assert sorted(f.name for _, f in fetched) == ["chat_template.jinja", "config.json", "model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"]
    for path, f in fetched:
        assert path.read_bytes() == repo[f.name]
    assert dict((f.name, f.sha256) for _, f in fetched)["model.safetensors"] == sha(repo["model.safetensors"])
    # a tag naming the weights' dtype is fine (any spelling) ...
    for tag in ("bf16", "BF16", "bfloat16"):
        sel, _ = hf_source.fetch(f"hf.co/org/tiny-st:{tag}")
        assert sel.kind == "safetensors" and sel.dtype == "BF16"
    # ... a quantization, or another dtype, is not
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/tiny-st:Q4_K_M")
    assert e.value.status == 404
    assert str(e.value) == ('no GGUF file for quantization "Q4_K_M" in hf.co/org/tiny-st: it has safetensors weights '
                            "in BF16 and no GGUF files; use hf.co/org/tiny-st or hf.co/org/tiny-st:bf16 (and quantize "
                            "when creating, e.g. --quantize q8_0)")
    with pytest.raises(HFSourceError, match='quantization "f16"'):
        hf_source.fetch("hf.co/org/tiny-st:f16")


def test_offline_uses_the_cache(hub: HFMock, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    _, [(online, _)] = hf_source.fetch("hf.co/org/tiny-GGUF:Q8_0")
    hf_source.fetch("hf.co/org/tiny-st")
    before = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sel, [(path, f)] = hf_source.fetch("hf.co/org/tiny-GGUF:Q8_0")
    assert path == online and path.read_bytes() == files["q8"]
    assert sel.listing.offline and f.sha256 == sha(files["q8"])  # the digest is known from the cache's blob name
    # only what was cached is known: the same rules over the cached files
    _, [(path, _)] = hf_source.fetch("hf.co/org/tiny-GGUF")  # latest: the only cached GGUF
    assert path == online
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/tiny-GGUF:Q4_K_M")
    assert str(e.value).startswith('no GGUF file for quantization "Q4_K_M" in hf.co/org/tiny-GGUF (available: Q8_0; '
                                   "only files in the local Hugging Face cache are known: HF_HUB_OFFLINE is set)")
    sel, fetched = hf_source.fetch("hf.co/org/tiny-st:bf16")  # config.json read from the cache
    assert sel.kind == "safetensors" and len(fetched) == 5
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/draft-GGUF")
    assert e.value.status == 404
    assert str(e.value).startswith("hf.co/org/draft-GGUF is not in the local Hugging Face cache (")
    assert str(e.value).endswith(") and HF_HUB_OFFLINE is set")
    assert len(hub.requests) == before  # offline: not one request


def test_unreachable_hub_falls_back_to_the_cache(hub: HFMock, files: dict[str, bytes],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    hf_source.fetch("hf.co/org/tiny-GGUF:Q8_0")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    sel, [(path, _)] = hf_source.fetch("hf.co/org/tiny-GGUF:Q8_0")
    assert path.read_bytes() == files["q8"] and "cannot be reached" in sel.listing.offline_reason
    with pytest.raises(HFSourceError) as e:
        hf_source.fetch("hf.co/org/draft-GGUF")
    assert e.value.status == 502 and "cannot reach http://127.0.0.1:" in str(e.value)
    assert str(e.value).endswith("and hf.co/org/draft-GGUF is not in the local Hugging Face cache")


# --- /api/pull (server.hf_pull) -----------------------------------------------------------------------------


def test_pull_safetensors_repo_request(hub: HFMock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A safetensors repo: its folder's files reach the create request, with their digests."""
    store = BlobStore(tmp_path / "models")
    seen: list[CreateRequest] = []
    monkeypatch.setattr(pull_module, "create_model", lambda store, req, progress: seen.append(req) or req.model)
    got, progress = events()
    pull_module.pull_model(store, "hf.co/org/tiny-st", progress)
    [req] = seen
    repo = hub.repos["org/tiny-st"]
    assert req.model == "hf.co/org/tiny-st:latest" and not req.from_ and not req.draft_files
    assert req.files == {name: f"sha256:{sha(repo[name])}" for name in
                         ("chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json")}
    assert all(store.has_blob(d) for d in req.files.values())
    statuses = [e.status for e in got]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "verifying sha256 digest"
    assert f"pulling {sha(repo['model.safetensors'])[:12]}" in statuses and "pulling config.json" in statuses


def _tiny_hf_model(d: Path) -> None:
    """A real (tiny, 1-layer qwen2) transformers model folder: config, bf16 safetensors, tokenizer."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.hf_tiny import build_hf, tiny_spec
    from tests.tiny_gguf import CHATML_TEMPLATE, gpt2_vocab

    tokens, _, merges = gpt2_vocab()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(d)
    build_hf(tiny_spec("qwen2", n_layer=1), len(tokens)).to(torch.bfloat16).save_pretrained(d)


def test_pull_safetensors_end_to_end(hub: HFMock, tmp_path: Path) -> None:
    """Pulling a real safetensors repo creates a runnable model, once create converts safetensors."""
    folder = tmp_path / "st-model"
    folder.mkdir()
    _tiny_hf_model(folder)
    hub.repos["org/tiny-qwen"] = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    store = BlobStore(tmp_path / "models")
    name = pull_module.pull_model(store, "hf.co/org/tiny-qwen:bf16", lambda ev: None)
    assert str(name) == "hf.co/org/tiny-qwen:bf16"
    model = load_stored_model(store, name)
    assert model.model_path.read_bytes()[:4] == b"GGUF"  # converted
    assert model.config["model_format"] == "gguf" and model.config["model_family"] == "qwen2"


def test_pull_reuses_blobs(hub: HFMock, tmp_path: Path, files: dict[str, bytes]) -> None:
    """A GGUF the store already holds (by its LFS digest) is not downloaded again."""
    store = BlobStore(tmp_path / "models")
    pull_module.pull_model(store, "hf.co/org/tiny-GGUF:Q8_0", lambda ev: None)
    assert hub.downloads() == ["org/tiny-GGUF/tiny-Q8_0.gguf"]
    got, progress = events()
    pull_module.pull_model(store, "hf.co/org/tiny-GGUF:q8_0", progress)
    assert hub.downloads() == ["org/tiny-GGUF/tiny-Q8_0.gguf"]
    digest = f"sha256:{sha(files['q8'])}"
    assert ProgressEvent(f"pulling {digest[7:19]}", digest, len(files["q8"]), len(files["q8"])) in got
    assert [e.status for e in got][-1] == "success"


# --- FROM / DRAFT in a Modelfile ---------------------------------------------------------------------------


def _request(text: str, store: BlobStore, base: Path, progress=lambda ev: None) -> CreateRequest:
    return request_from_modelfile(parse(text), "m", base, LocalBlobSink(store), progress=progress)


def test_modelfile_from_and_draft_hf(hub: HFMock, files: dict[str, bytes], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`tandem create` with FROM hf.co/... and DRAFT hf.co/...: downloads with progress, the model has the draft."""
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("TANDEM_HOST", f"127.0.0.1:{free_port()}")  # no server: the local store
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Modelfile").write_text("FROM hf.co/org/tiny-GGUF:Q8_0\nDRAFT hf.co/org/draft-GGUF\n"
                                        "PARAMETER draft_num_predict 3\n")
    assert main(["create", "spec", "-f", "Modelfile"]) == 0
    out = capsys.readouterr().out.splitlines()
    q8, draft = sha(files["q8"]), sha(files["draft"])
    assert out[:2] == ["gathering model components", "pulling manifest"]
    assert f"pulling {q8[:12]} 100%" in out and f"pulling {draft[:12]} 100%" in out
    assert f"copying file sha256:{q8} 100%" in out and out[-1] == "success"
    store = BlobStore(tmp_path / "models")
    model = load_stored_model(store, "spec")
    assert model.model_path.name == f"sha256-{q8}" and model.draft_path.name == f"sha256-{draft}"
    assert main(["show", "spec"]) == 0
    summary = capsys.readouterr().out
    assert "  Draft" in summary and "draft_num_predict" in summary


def test_modelfile_from_a_pulled_model(hub: HFMock, tmp_path: Path, files: dict[str, bytes]) -> None:
    """FROM hf.co/... names the stored model of that name when there is one: nothing is downloaded."""
    store = BlobStore(tmp_path / "models")
    pull_module.pull_model(store, "hf.co/org/tiny-GGUF:Q8_0", lambda ev: None)
    n = len(hub.requests)
    req = _request("FROM hf.co/org/tiny-GGUF:Q8_0\nSYSTEM hi\n", store, tmp_path)
    assert req.from_ == "hf.co/org/tiny-GGUF:Q8_0" and not req.files
    assert len(hub.requests) == n
    # not stored under that tag: downloaded
    req = _request("FROM hf.co/org/tiny-GGUF\n", store, tmp_path)
    assert not req.from_ and req.files == {"tiny-Q4_K_M.gguf": f"sha256:{sha(files['q4'])}"}
    # a safetensors repo: its folder's files, as for a local folder
    req = _request("FROM hf.co/org/tiny-st\n", store, tmp_path)
    repo = hub.repos["org/tiny-st"]
    assert req.files == {f: f"sha256:{sha(repo[f])}" for f in ("chat_template.jinja", "config.json", "model.safetensors",
                                                               "tokenizer.json", "tokenizer_config.json")}
    # a DRAFT is always a file, even when a model of that name is stored (here: from the HF cache)
    req = _request("FROM hf.co/org/tiny-GGUF:Q8_0\nDRAFT hf.co/org/draft-GGUF\n", store, tmp_path)
    assert req.from_ == "hf.co/org/tiny-GGUF:Q8_0" and req.draft_files == {"draft-Q4_K_M.gguf": f"sha256:{sha(files['draft'])}"}


def test_modelfile_hf_errors_leave_the_store_untouched(hub: HFMock, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = BlobStore(tmp_path / "models")
    write_tiny_gguf(tmp_path / "local.gguf", TinySpec(arch="qwen2", seed=3, n_layer=1))

    def blobs() -> list[str]:
        d = tmp_path / "models" / "blobs"
        return sorted(p.name for p in d.iterdir()) if d.exists() else []

    with pytest.raises(CreateError) as e:
        _request("FROM ./local.gguf\nDRAFT hf.co/org/odd-GGUF\n", store, tmp_path)
    assert str(e.value) == ('DRAFT hf.co/org/odd-GGUF: no GGUF file for quantization "Q4_K_M" in hf.co/org/odd-GGUF '
                            "(available: IQ2_XS, Q3_K_S)")
    with pytest.raises(CreateError, match="^FROM hf.co/org/missing: hf.co/org/missing not found"):
        _request("FROM hf.co/org/missing\nDRAFT ./local.gguf\n", store, tmp_path)
    with pytest.raises(CreateError, match="DRAFT must not reference the same model as FROM"):
        _request("FROM hf.co/org/draft-GGUF\nDRAFT hf.co/org/draft-GGUF:Q4_K_M\n", store, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CreateError) as e:
        _request("FROM ./local.gguf\nDRAFT hf.co/org/tiny-GGUF:Q8_0\n", store, tmp_path)
    assert e.value.status == 404 and "is not in the local Hugging Face cache" in str(e.value)
    assert str(e.value).startswith("DRAFT hf.co/org/tiny-GGUF:Q8_0: ")
    assert blobs() == []  # the local FROM was never copied in


def test_local_paths_unchanged(hub: HFMock, tmp_path: Path) -> None:
    """Paths keep their meaning: a local folder named like a repo wins; a missing DRAFT path is still stat's error."""
    store = BlobStore(tmp_path / "models")
    (tmp_path / "hf.co" / "org" / "tiny-GGUF").mkdir(parents=True)
    write_tiny_gguf(tmp_path / "hf.co" / "org" / "tiny-GGUF" / "x.gguf", TinySpec(arch="qwen2", seed=3, n_layer=1))
    req = _request("FROM hf.co/org/tiny-GGUF\n", store, tmp_path)
    assert list(req.files) == ["x.gguf"] and hub.requests == []
    with pytest.raises(CreateError, match=r"^stat .*/nope.gguf: no such file or directory$"):
        _request("FROM hf.co/org/tiny-GGUF\nDRAFT ./nope.gguf\n", store, tmp_path)
    with pytest.raises(CreateError, match=r"^stat .*/org/x: no such file or directory$"):
        _request("FROM hf.co/org/tiny-GGUF\nDRAFT org/x\n", store, tmp_path)


# --- through a server ---------------------------------------------------------------------------------------


def test_server_create_from_hf(hub: HFMock, files: dict[str, bytes], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`/api/create` with `"from": "hf.co/..."` pulls the model first (as Ollama does); `tandem create`
    against a server uses a model the server already has under the hf.co name."""
    store = BlobStore(tmp_path / "models")
    with ServerThread(store) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        r = http.post("/api/create", json={"model": "viaapi", "from": "hf.co/org/tiny-GGUF:Q8_0",
                                           "parameters": {"temperature": 0}})
        statuses = [e["status"] for e in ndjson(r)]
        assert r.status_code == 200 and statuses[0] == "pulling manifest" and statuses[-1] == "success"
        assert load_stored_model(store, "viaapi").model_path.name == f"sha256-{sha(files['q8'])}"
        r = http.post("/api/create", json={"model": "x", "from": "hf.co/org/odd-GGUF", "stream": False})
        assert r.status_code == 404 and "available: IQ2_XS, Q3_K_S" in r.json()["error"]

        assert http.post("/api/pull", json={"model": "hf.co/org/draft-GGUF", "stream": False}).status_code == 200
        n = len(hub.requests)
        monkeypatch.setenv("TANDEM_HOST", srv.url)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "Modelfile").write_text("FROM hf.co/org/draft-GGUF\nSYSTEM terse\n")
        assert main(["create", "remote", "-f", "Modelfile"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "success"
        assert len(hub.requests) == n  # the server had it: no download
        assert load_stored_model(store, "remote").model_path.name == f"sha256-{sha(files['draft'])}"

