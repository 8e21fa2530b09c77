"""Importing a sentence-transformers BERT folder: `FROM <folder>` in a Modelfile (what `tandem create` sends)
and `/api/create` with blobs named as the folder's files (the nested 1_Pooling/config.json included); the GGUF
it becomes (llama.cpp's bert names and metadata) and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from blobs import MEDIA_TYPE_MODEL, BlobStore, ModelNotFoundError
from engine.contract.gguf import GGUFFile
from importer import CreateError, CreateRequest, LocalBlobSink, create_model, request_from_modelfile
from modelfile import parse
from tests.hf_tiny_bert import folder_files, make_bert_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bert_folder(tmp_path_factory.mktemp("st") / "minilm-like", pooling="cls", normalize=False)


def _gguf(store: BlobStore, name: str) -> GGUFFile:
    layer = store.read_manifest(name).layer(MEDIA_TYPE_MODEL)
    return GGUFFile(store.blob_path(layer.digest))


def test_modelfile_from_folder(tmp_path: Path, folder: Path) -> None:
    store = BlobStore(tmp_path / "models")
    req = request_from_modelfile(parse(f"FROM {folder}"), "emb", tmp_path, LocalBlobSink(store))
    assert "1_Pooling/config.json" in req.files and "config.json" in req.files and "vocab.txt" in req.files
    assert req.files["1_Pooling/config.json"] != req.files["config.json"]
    create_model(store, req)
    with _gguf(store, "emb") as f:
        md = f.metadata
        assert md["general.architecture"] == "bert" and md["bert.pooling_type"] == 2  # cls, from 1_Pooling
        assert md["bert.normalize_embeddings"] is False  # no Normalize module
        assert md["bert.attention.causal"] is False and md["tokenizer.ggml.model"] == "bert"
        tokens = list(md["tokenizer.ggml.tokens"])
        assert tokens[md["tokenizer.ggml.bos_token_id"]] == "[CLS]"
        assert tokens[md["tokenizer.ggml.seperator_token_id"]] == "[SEP]"
        assert any(t.startswith("\u2581") for t in tokens) and not any(t.startswith("##") for t in tokens)
        assert {"token_embd.weight", "position_embd.weight", "token_types.weight", "token_embd_norm.bias",
                "blk.1.attn_output_norm.weight", "blk.1.layer_output_norm.bias", "blk.0.ffn_up.bias"} <= set(f.tensors)
        assert not any(n.startswith("pooler") or "position_ids" in n for n in f.tensors)
    config = json.loads(store.blob_path(store.read_manifest("emb").config.digest).read_text())
    assert config["model_family"] == "bert" and config["context_length"] == 64


def test_api_create_from_blobs(tmp_path: Path, folder: Path) -> None:
    store = BlobStore(tmp_path / "models")
    files = {name: store.add_file(p)[0] for name, p in folder_files(folder).items()}
    create_model(store, CreateRequest.from_json({"model": "emb2", "files": files}))
    with _gguf(store, "emb2") as f:
        assert f.metadata["bert.pooling_type"] == 2


def _broken(tmp_path: Path, folder: Path, edit) -> Path:
    d = tmp_path / "broken"
    shutil.copytree(folder, d)
    edit(d)
    return d


@pytest.mark.parametrize("edit, message", [
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True})),
     "pooling_mode_max_tokens is not supported"),
    (lambda d: ((d / "tokenizer.json").unlink(), (d / "vocab.txt").unlink()), "the tokenizer is missing"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "hidden_act": "relu"})), "hidden_act 'relu'"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "intermediate_size": 48})), "config.json implies"),
    (lambda d: (d / "1_Pooling" / "config.json").unlink(), "1_Pooling/config.json was not uploaded"),
])
def test_refusals_store_nothing(tmp_path: Path, folder: Path, edit, message: str) -> None:
    store = BlobStore(tmp_path / "models")
    d = _broken(tmp_path, folder, edit)
    with pytest.raises(CreateError, match=message):
        create_model(store, request_from_modelfile(parse(f"FROM {d}"), "bad", tmp_path, LocalBlobSink(store)))
    with pytest.raises(ModelNotFoundError):
        store.read_manifest("bad")


def test_bert_as_draft_is_refused(tmp_path: Path, folder: Path) -> None:
    from tests.server_thread import write_pair

    target, _ = write_pair(tmp_path)
    store = BlobStore(tmp_path / "models")
    with pytest.raises(CreateError, match="cannot draft"):
        create_model(store, request_from_modelfile(parse(f"FROM {target}\nDRAFT {folder}"), "bad", tmp_path,
                                                   LocalBlobSink(store)))
