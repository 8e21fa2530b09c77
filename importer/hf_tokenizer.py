"""A Hugging Face tokenizer (tokenizer.json, or a bare tokenizer.model) as GGUF tokenizer metadata.

Two vocabulary kinds come out, the two the engine's tokenizer builds (``engine/tokenizer.py``):

* ``gpt2``: a byte-level BPE (Llama 3, Qwen2, SmolLM, ...). Tokens and merges are copied as they are;
  what a GGUF cannot carry, the pre-tokenizer's regexes, is stored as the llama.cpp pre-tokenizer
  *name* whose regexes are the same (``tokenizer.ggml.pre``), found by comparing the tokenizer.json
  pre-tokenizer with the engine's table, so import refuses a split it would reproduce wrongly.
* ``llama``: a SentencePiece-style BPE with byte fallback (Llama 2, Gemma). A GGUF stores scores, not
  merges; from tokenizer.json the scores are derived from the merge order (a token's score is minus
  the rank of the first merge that produces it), which preserves the order the engine derives its
  merges from. A bare tokenizer.model carries real scores and is read directly (``spm_model``).

Special tokens, add_bos/add_eos and the chat template come from tokenizer_config.json,
chat_template.jinja and config.json through the ``gguf`` package's ``SpecialVocab`` (llama.cpp's own
reading of those files).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import gguf

from engine.contract.pretokenizers import GPT2, PRE_TOKENIZERS, PreTokenizerSpec  # the table the engine reads back

from .request import CreateError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_MODEL = "tokenizer.model"
# Files SpecialVocab reads (from a directory) for special ids, add_bos/eos and the chat template.
_SPECIAL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja", "chat_template.json")
# Preferred names when several llama.cpp pre-tokenizer names share one set of regexes.
_PREFERRED_PRE = ("llama-bpe", "qwen2", "gpt-2", "smollm", "deepseek-v3", "deepseek-coder", "tekken", "gpt-4o", "dbrx")
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
_SPM_SPACE = "\u2581"


@dataclass(frozen=True)
class Vocab:
    """A tokenizer in GGUF terms (tokenizer.ggml.*)."""

    model: str  # "gpt2" | "llama" | an architecture's own (gemma4: a SentencePiece-style BPE that keeps its merges)
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None  # llama only
    add_space_prefix: bool | None  # llama only
    # When the files do not say whether a BOS is added: a tokenizer.json adds one only through its
    # post-processor (which SpecialVocab reads), a bare SentencePiece model by convention.
    add_bos_default: bool


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def has_tokenizer(files: Mapping[str, Path]) -> bool:
    return TOKENIZER_JSON in files or TOKENIZER_MODEL in files


def read_vocab(files: Mapping[str, Path], vocab_size: int, role: str, *, bpe_model: str | None = None) -> Vocab:
    """The vocabulary of an uploaded folder, padded to the model's ``vocab_size`` embedding rows.

    ``bpe_model``: the architecture's own tokenizer model (``ArchitectureSpec.tokenizer_model``): a byte-fallback
    BPE is written as llama.cpp writes it, tokenizer model and pre-tokenizer ``bpe_model`` with its merges (Gemma
    4's tokenizer, model ``gemma4``, does not merge in score order, so scores alone cannot reproduce it)."""
    if TOKENIZER_JSON in files:
        try:
            tj = json.loads(files[TOKENIZER_JSON].read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _fail(role, f"{TOKENIZER_JSON} is not valid JSON ({e})") from None
        vocab = _from_tokenizer_json(tj, vocab_size, role)
        if bpe_model is not None:
            if vocab.model != "llama":
                raise _fail(role, f"{TOKENIZER_JSON}: a {bpe_model} tokenizer is a byte-fallback BPE, this one is not")
            return replace(vocab, model=bpe_model, pre=bpe_model, add_bos_default=True)
        return vocab
    if bpe_model is not None:
        raise _fail(role, f"a {bpe_model} model needs its {TOKENIZER_JSON} (the merges are not in tokenizer.model)")
    if TOKENIZER_MODEL in files:
        from .spm_model import read_spm_model

        spm = read_spm_model(files[TOKENIZER_MODEL].read_bytes(), role)
        tokens, types, scores = _pad(list(spm.pieces), list(spm.types), list(spm.scores), vocab_size, role)
        return Vocab("llama", "default", tokens, types, scores, spm.add_dummy_prefix, add_bos_default=True)
    raise _fail(role, "the tokenizer is missing: upload tokenizer.json (or tokenizer.model) with the weights; "
                      "tandem needs the vocabulary inside the GGUF")


def _pad(tokens: list[str | None], types: list[int], scores: list[float] | None, vocab_size: int,
         role: str) -> tuple[list[str], list[int], list[float] | None]:
    """Fill unused ids (and the rows the embedding has beyond the tokenizer) as llama.cpp does."""
    if len(tokens) > vocab_size:
        raise _fail(role, f"the tokenizer has {len(tokens)} tokens but the model's vocab_size is {vocab_size}")
    extra = vocab_size - len(tokens)
    tokens = tokens + [None] * extra
    types = types + [int(gguf.TokenType.UNUSED)] * extra
    if scores is not None:
        scores = scores + [-1000.0] * extra
    out = []
    for i, tok in enumerate(tokens):
        if tok is None:
            tok = f"[PAD{i}]"
            types[i] = int(gguf.TokenType.UNUSED)
        out.append(tok)
    return out, types, scores


def _from_tokenizer_json(tj: Any, vocab_size: int, role: str) -> Vocab:
    model = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise _fail(role, f"{TOKENIZER_JSON}: tokenizer model {kind!r} is not supported (tandem imports BPE "
                          "tokenizers: byte-level like Llama 3/Qwen2, or SentencePiece-style like Llama 2/Gemma)")
    added = {int(a["id"]): a for a in tj.get("added_tokens") or [] if isinstance(a, dict) and "id" in a}
    n = max([*model["vocab"].values(), *added, -1]) + 1
    tokens: list[str | None] = [None] * n
    for tok, i in model["vocab"].items():
        tokens[int(i)] = tok
    for i, a in added.items():
        tokens[i] = str(a.get("content", ""))
    if model.get("byte_fallback"):
        return _spm_from_json(tj, model, tokens, added, vocab_size, role)
    return _byte_level_from_json(tj, model, tokens, added, vocab_size, role)


def _added_type(entry: Mapping[str, Any]) -> int:
    return int(gguf.TokenType.CONTROL if entry.get("special") else gguf.TokenType.USER_DEFINED)


def _byte_level_from_json(tj: Mapping[str, Any], model: Mapping[str, Any], tokens: list[str | None],
                          added: Mapping[int, Mapping[str, Any]], vocab_size: int, role: str) -> Vocab:
    types = [int(gguf.TokenType.NORMAL) if t is not None else int(gguf.TokenType.UNUSED) for t in tokens]
    for i, a in added.items():
        types[i] = _added_type(a)
    pre = _pre_tokenizer_name(tj, bool(model.get("ignore_merges")), role)
    toks, types, _ = _pad(tokens, types, None, vocab_size, role)
    return Vocab("gpt2", pre, toks, types, None, None, add_bos_default=False)


def _flatten(step: Any) -> list[dict[str, Any]]:
    if not isinstance(step, dict):
        return []
    if step.get("type") == "Sequence":
        key = "pretokenizers" if "pretokenizers" in step else "normalizers"
        return [s for sub in step.get(key) or [] for s in _flatten(sub)]
    return [step]


def _pre_tokenizer_name(tj: Mapping[str, Any], ignore_merges: bool, role: str) -> str:
    """The llama.cpp pre-tokenizer name whose regexes, NFC and ignore_merges equal tokenizer.json's."""
    regexes: list[str] = []
    steps = _flatten(tj.get("pre_tokenizer"))
    if not any(step.get("type") == "ByteLevel" for step in steps):
        raise _fail(role, f"{TOKENIZER_JSON}: a BPE without byte fallback must be byte-level (a ByteLevel "
                          "pre-tokenizer); this one is not supported")
    for step in steps:
        kind = step.get("type")
        if kind == "Split" and isinstance(step.get("pattern"), dict) and "Regex" in step["pattern"] \
                and str(step.get("behavior", "")).lower() == "isolated" and not step.get("invert"):
            regexes.append(step["pattern"]["Regex"])
        elif kind == "Digits":
            regexes.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel" and not step.get("add_prefix_space"):
            if step.get("use_regex", True):
                regexes.append(GPT2)
        else:
            raise _fail(role, f"{TOKENIZER_JSON}: pre-tokenizer step {json.dumps(step)[:200]} is not supported")
    normalizers = [n.get("type") for n in _flatten(tj.get("normalizer"))]
    if any(n != "NFC" for n in normalizers):
        raise _fail(role, f"{TOKENIZER_JSON}: normalizer {normalizers} is not supported for a byte-level BPE")
    spec = PreTokenizerSpec(tuple(regexes), nfc=bool(normalizers), ignore_merges=ignore_merges)
    names = [n for n, s in PRE_TOKENIZERS.items() if s == spec]
    if not names:
        raise _fail(role, f"{TOKENIZER_JSON}: its pre-tokenizer (regexes {regexes}, NFC {bool(normalizers)}, "
                          f"ignore_merges {ignore_merges}) matches none that tandem runs")
    return next((n for n in _PREFERRED_PRE if n in names), names[0])


def _merged_tokens(raw: Any) -> list[str]:
    """The token each merge produces, in merge order, from either tokenizer.json layout (strings or pairs)."""
    out = []
    for m in raw or []:
        out.append(m[0] + m[1] if isinstance(m, list) else m.replace(" ", "", 1))
    return out


def _spm_from_json(tj: Mapping[str, Any], model: Mapping[str, Any], tokens: list[str | None],
                   added: Mapping[int, Mapping[str, Any]], vocab_size: int, role: str) -> Vocab:
    unk = model.get("unk_token")
    types = []
    for i, tok in enumerate(tokens):
        if tok is None:
            types.append(int(gguf.TokenType.UNUSED))
        elif tok == unk:
            types.append(int(gguf.TokenType.UNKNOWN))
        elif i in added:
            types.append(_added_type(added[i]))
        elif _BYTE_TOKEN.match(tok):
            types.append(int(gguf.TokenType.BYTE))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    # Score = minus the rank of the first merge producing the token: the engine (like llama.cpp)
    # merges by score, so this keeps tokenizer.json's merge order. Tokens no merge produces keep 0
    # when they cannot be split, and rank last otherwise.
    merged = _merged_tokens(model.get("merges"))
    rank: dict[str, int] = {}
    for r, tok in enumerate(merged):
        rank.setdefault(tok, r)
    last = -float(len(merged) + 1)
    scores = [-float(rank[t]) if t in rank else (0.0 if t is None or len(t) <= 1 else last) for t in tokens]
    toks, types, scores = _pad(tokens, types, scores, vocab_size, role)
    return Vocab("llama", "default", toks, types, scores, _adds_space_prefix(tj), add_bos_default=False)


def _adds_space_prefix(tj: Mapping[str, Any]) -> bool:
    """Whether the tokenizer puts a ▁ before the text (llama 2: yes; gemma: no)."""
    for n in _flatten(tj.get("normalizer")):
        if n.get("type") == "Prepend" and n.get("prepend") == _SPM_SPACE:
            return True
    for p in _flatten(tj.get("pre_tokenizer")):
        if p.get("type") == "Metaspace":
            return p.get("prepend_scheme", "always") in ("always", "first") or bool(p.get("add_prefix_space"))
    return False


def write_vocab(writer: gguf.GGUFWriter, vocab: Vocab, files: Mapping[str, Path]) -> None:
    """tokenizer.ggml.* : the vocabulary, then special ids, add_bos/eos and the chat template."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    # merges for every BPE but the scored SentencePiece-style one (tokenizer model "llama")
    special = _special_vocab(files, load_merges=vocab.model != "llama", n_vocab=len(vocab.tokens))
    _fill_special_ids(special, files, vocab)
    # A fast tokenizer adds a BOS only through its post-processor: when neither it nor
    # tokenizer_config.json says so, write the answer rather than leave llama.cpp's default to differ.
    special.add_special_token.setdefault("bos", vocab.add_bos_default)
    special.add_special_token.setdefault("eos", False)
    special.add_to_gguf(writer, quiet=True)


def _fill_special_ids(special: gguf.SpecialVocab, files: Mapping[str, Path], vocab: Vocab) -> None:
    """Special tokens SpecialVocab left unresolved: it looks tokenizer_config.json's strings up among
    tokenizer.json's added tokens only, and a tokenizer.model has none; look them up in the vocabulary."""
    config: Any = {}
    if "tokenizer_config.json" in files:
        try:
            config = json.loads(files["tokenizer_config.json"].read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            config = {}
    index: dict[str, int] = {}
    for i, tok in enumerate(vocab.tokens):
        index.setdefault(tok, i)
    for typ in ("bos", "eos", "unk", "pad"):
        entry = config.get(f"{typ}_token") if isinstance(config, dict) else None
        content = entry.get("content") if isinstance(entry, dict) else entry
        if typ not in special.special_token_ids and isinstance(content, str) and content in index:
            special.special_token_ids[typ] = index[content]
    if "unk" not in special.special_token_ids and int(gguf.TokenType.UNKNOWN) in vocab.types:
        special.special_token_ids["unk"] = vocab.types.index(int(gguf.TokenType.UNKNOWN))


def _special_vocab(files: Mapping[str, Path], *, load_merges: bool, n_vocab: int) -> gguf.SpecialVocab:
    # SpecialVocab reads a directory: give it one with links to the uploaded blobs.
    with tempfile.TemporaryDirectory(prefix="tandem-tokenizer-") as tmp:
        for name in _SPECIAL_FILES:
            if name in files:
                os.symlink(os.path.abspath(files[name]), os.path.join(tmp, name))
        return gguf.SpecialVocab(tmp, load_merges=load_merges, n_vocab=n_vocab)
