"""The bert encoder against transformers: a tiny random sentence-transformers folder converted by the importer,
its hidden states and pooled vectors compared with transformers' BertModel in float64 (same weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.contract.gguf import GGUFFile
from engine.models.loader import load_encoder
from engine.contract.protocol import ContextLengthError, EmbedRequest
from engine.text.tokenizer import Tokenizer
from importer.architectures.bert import convert_folder
from importer.hf.safetensors import folder_paths
from tests.hf_tiny_bert import folder_files, make_bert_folder, reference

TEXTS = ["Héllo wörld, café crème!", "東京は日本の首都です。", "unbelievably supercalifragilistic!!",
         "The quick brown fox (jumps) over the lazy dog.", "a", "numbers 123 4567 89.01 🙂"]


def _build(tmp: Path, pooling: str) -> tuple[Path, Path]:
    folder = make_bert_folder(tmp / f"bert-{pooling}", pooling=pooling, seed={"mean": 0, "cls": 1, "last": 2}[pooling])
    out = tmp / f"bert-{pooling}.gguf"
    convert_folder(folder_paths(folder_files(folder)), out, "FROM")
    return folder, out


@pytest.fixture(scope="module")
def mean_model(tmp_path_factory: pytest.TempPathFactory):
    folder, path = _build(tmp_path_factory.mktemp("bert"), "mean")
    f = GGUFFile(path)
    tok = Tokenizer.from_gguf_metadata(f.metadata)
    enc = load_encoder(f, dtype=torch.float64)
    hf, hf_tok = reference(folder)
    yield path, tok, enc, hf, hf_tok
    enc.close()


def test_hidden_states_and_mean_pooling_match_transformers(mean_model) -> None:
    _, tok, enc, hf, hf_tok = mean_model
    for text in TEXTS:
        ids = tok.encode(text, add_bos=True)
        assert ids == hf_tok(text)["input_ids"], text
        ref = hf(torch.tensor([ids])).last_hidden_state[0]
        h, _ = enc.hidden_states([ids])
        torch.testing.assert_close(h[0], ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(enc.embed([ids])[0], ref.mean(0), atol=1e-10, rtol=0)


def test_batch_with_padding_equals_one_at_a_time(mean_model) -> None:
    _, tok, enc, _, _ = mean_model
    seqs = [tok.encode(t, add_bos=True) for t in TEXTS]
    assert len({len(s) for s in seqs}) > 2  # the batch really pads
    batched = enc.embed(seqs)
    for s, v in zip(seqs, batched):
        torch.testing.assert_close(v, enc.embed([s])[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_cls_and_last_pooling(tmp_path: Path, pooling: str) -> None:
    folder, path = _build(tmp_path, pooling)
    with GGUFFile(path) as f:
        assert f.metadata["bert.pooling_type"] == {"cls": 2, "last": 3}[pooling]
        tok = Tokenizer.from_gguf_metadata(f.metadata)
        enc = load_encoder(f, dtype=torch.float64)
        hf, _ = reference(folder)
        seqs = [tok.encode(t, add_bos=True) for t in TEXTS[:3]]
        got = enc.embed(seqs)
        for s, v in zip(seqs, got):
            ref = hf(torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(v, ref[0] if pooling == "cls" else ref[-1], atol=1e-10, rtol=0)


def test_runtime_embed_truncates_and_refuses_as_ollama(mean_model) -> None:
    from engine.runtime import ModelRuntime
    from engine.contract.protocol import LoadSpec

    path, tok, enc, hf, _ = mean_model
    rt = ModelRuntime.load(LoadSpec(model_path=str(path), num_ctx=4096, device="cpu"))
    try:
        assert rt.facts.pooling == "mean" and rt.facts.context_length == 64  # capped at the learned positions
        long = " ".join(["semantic search embeddings vectors"] * 40)
        n = len(tok.encode(long, add_bos=False))
        assert n > 62
        res = rt.embed(EmbedRequest(inputs=[long, "a"]))
        assert res.token_counts == [64, len(tok.encode("a", add_bos=True))]
        ids = tok.encode(long, add_bos=True)
        cut = ids[:63] + [ids[-1]]  # the text's first 62 tokens between [CLS] and [SEP]
        ref = hf(torch.tensor([cut])).last_hidden_state[0].mean(0)
        got = torch.tensor(res.embeddings[0], dtype=torch.float64)
        assert torch.nn.functional.cosine_similarity(got, ref, dim=0) > 1 - 1e-6
        with pytest.raises(ContextLengthError, match="the input length exceeds the context length"):
            rt.embed(EmbedRequest(inputs=[long], truncate=False))
        short = rt.embed(EmbedRequest(inputs=[long], num_ctx=10))
        assert short.token_counts == [10]
    finally:
        rt.close()
