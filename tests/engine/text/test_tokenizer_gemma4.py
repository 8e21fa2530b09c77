"""The ``gemma4`` tokenizer model (SentencePiece-style BPE with merges in the file, llama.cpp's GEMMA4 pre-type)."""

from __future__ import annotations

import gguf
import pytest

from engine.contract.gguf import GGUFFile
from engine.text.tokenizer import Tokenizer, TokenizerError
from tests.hf_tiny_gemma4 import gemma4_vocab, write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "gemma4")
    write_tokenizer(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata)


def _pieces(tok, text):
    ids = tok.encode(text, add_bos=False)
    return [tok.token_strings()[i] for i in ids]


def test_merges_spaces_and_bytes(tok):
    assert tok.info.model == "gemma4" and tok.add_bos and tok.bos_id == 2
    assert _pieces(tok, "the def return") == ["t", "he", "▁def", "▁return"]  # no space prefix added
    assert _pieces(tok, "é") == ["<0xC3>", "<0xA9>"]  # byte fallback
    assert _pieces(tok, "<|turn>user\nhi<turn|>") == ["<|turn>", "u", "s", "er", "\n", "h", "i", "<turn|>"]


def test_newline_runs_stay_whole(tok):
    assert _pieces(tok, "a\n\nb") == ["a", "\n\n", "b"]
    assert _pieces(tok, "a\n\n\nb") == ["a", "\n\n", "\n", "b"]


def test_round_trip_and_end_of_turn(tok):
    for text in ["hello world\n\nand of them", "é€ xyz  and\n\n\nq", "  two  spaces "]:
        assert tok.decode(tok.encode(text, add_bos=False)) == text
    assert tok.token_id("<turn|>") in tok.eot_ids and tok.eos_id in tok.eot_ids


def test_merges_are_required():
    tokens, types, _, _ = gemma4_vocab()
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
                                      "tokenizer.ggml.token_type": types})
