"""Tokenizers built from GGUF metadata, with the ``tokenizers`` library doing the encoding.

Three vocabulary kinds are supported, as ``tokenizer.ggml.model`` names them:

* ``gpt2``: byte-level BPE. The merges are in the file; what the file does not carry is the
  pre-tokenizer, which llama.cpp picks by the ``tokenizer.ggml.pre`` name. ``engine/contract/pretokenizers.py``
  mirrors llama.cpp's table (``llama-vocab.cpp``).
* ``llama``: SentencePiece-style BPE with byte fallback (``<0xNN>`` tokens). The file has scores
  but no merges, so merges are derived from the vocabulary the way transformers' GGUF converter
  does (``generate_merges``): every split of a token into two tokens is a merge, ranked by the
  merged token's score. Gemma's scores do not follow its merge order, but its token order does,
  so for gemma architectures the rank is the token's position instead.
* ``gemma4``: SentencePiece-style BPE whose merges *are* in the file (llama.cpp's
  ``LLAMA_VOCAB_PRE_TYPE_GEMMA4``): spaces become ``▁`` with no prefix added, the text is split only
  into runs of newlines and runs of everything else, merges run over characters (no byte alphabet),
  and a character no token covers falls back to ``<0xNN>`` tokens. A run of newlines that is itself a
  token is kept whole, as llama.cpp does.

Decoding does not go through ``tokenizers``: each id maps to the exact bytes it stands for
(``token_to_piece``), and text is those bytes decoded as UTF-8. That keeps ``decode`` and the
streaming ``IncrementalDecoder`` consistent by construction.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Iterable, Mapping

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from engine.contract.pretokenizers import PRE_TOKENIZERS, SPEC_DEFAULT, SUPPORTED_PRE_TOKENIZERS, PreTokenizerSpec
from engine.contract.special_tokens import ThinkTags, find_think_tags

log = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """A GGUF whose tokenizer metadata we cannot turn into a tokenizer, with a message for a user."""


# llama.cpp token types (enum llama_token_type), as stored in tokenizer.ggml.token_type.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used to spell byte-level vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_TO_UNICODE: Mapping[int, str] = _bytes_to_unicode()
_BYTE_ALPHABET = frozenset(BYTE_TO_UNICODE.values())
# str.translate table: byte-alphabet character -> the latin-1 character of its byte, so that
# ``token.translate(_UNICODE_TO_LATIN1).encode("latin-1")`` is the token's bytes (fast, in C).
_UNICODE_TO_LATIN1: Mapping[int, str] = {ord(ch): chr(b) for b, ch in BYTE_TO_UNICODE.items()}
_NOT_BYTE_ALPHABET = re.compile("[^" + re.escape("".join(sorted(_BYTE_ALPHABET))) + "]")

# Bases of the two polynomial string hashes in generate_merges (odd, so invertible mod 2**64).
_HASH_B1 = np.uint64(0x100000001B3)
_HASH_B2 = np.uint64(0x9E3779B97F4A7C15)

_SPM_SPACE = "\u2581"  # ▁, SentencePiece's spelling of a space
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# Token texts llama.cpp treats as end-of-generation whatever their type (llama_vocab::impl::load).
_EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>", "<turn|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
    # FIM tokens llama.cpp also stops on (it adds the fim pad/repo/sep tokens to the EOG set).
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
})
_EOG_ID_KEYS = (
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
)


@dataclass(frozen=True)
class TokenizerInfo:
    """What was built, for logs and /api/show-style reporting."""

    model: str  # tokenizer.ggml.model: "gpt2" | "llama" | "gemma4"
    pre: str  # tokenizer.ggml.pre as used ("default" when the file has none)
    vocab_size: int
    n_merges: int
    add_bos: bool
    add_space_prefix: bool
    build_seconds: float


def _meta_id(metadata: Mapping[str, Any], key: str, n_vocab: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    value = int(value)
    # Some converters write -1 / 0xFFFFFFFF for "none".
    return value if 0 <= value < n_vocab else None


def generate_merges(rank_of: Mapping[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: each split of a token into two vocabulary tokens, best first.

    ``rank_of`` maps every vocabulary token to its rank (higher merges first). The result equals
    transformers' ``generate_merges(vocab, vocab_scores)``, which its GGUF tokenizer uses: merges
    sorted by the merged token's rank, then longer left piece, then longer right piece, ties in
    vocabulary order (its sort is stable, and one token's splits never tie with each other).

    Why not a plain loop over splits: Gemma has 262k tokens and 1.2M splits, and a dictionary
    lookup per piece took 4-7 s here. Instead every token's prefixes are hashed at once with numpy
    (two independent 64-bit polynomial hashes, so a false match needs both to collide), and
    pieces are looked up by binary search. ``_generate_merges_python`` is the readable reference
    and the fallback if two vocabulary tokens ever share a hash.
    """
    keys = list(rank_of)
    n = len(keys)
    if n == 0:
        return []
    key_arr = np.array(keys, dtype=object)
    lens = np.fromiter(map(len, keys), np.int64, n)
    # Tokens are hashed in groups of equal padded width (8, 16, 32, ...) to bound the matrices.
    widths = np.left_shift(1, np.maximum(3, np.ceil(np.log2(np.maximum(lens, 1))).astype(np.int64)))
    max_w = int(widths.max())
    pow1 = np.ones(max_w + 1, np.uint64)
    pow2 = np.ones(max_w + 1, np.uint64)
    full1 = np.zeros(n, np.uint64)
    full2 = np.zeros(n, np.uint64)
    owners, cuts, pre1, pre2, suf1, suf2 = [], [], [], [], [], []
    with np.errstate(over="ignore"):  # arithmetic is mod 2**64 on purpose
        for k in range(1, max_w + 1):
            pow1[k] = pow1[k - 1] * _HASH_B1
            pow2[k] = pow2[k - 1] * _HASH_B2
        for w in np.unique(widths).tolist():
            idxs = np.flatnonzero(widths == w)
            codes = np.array(key_arr[idxs].tolist(), dtype=f"<U{w}").view(np.uint32).reshape(len(idxs), w)
            # Column-major, so the per-position column updates below are contiguous.
            codes = np.asfortranarray(codes).astype(np.uint64) + np.uint64(1)
            h1 = np.zeros((len(idxs), w + 1), np.uint64, order="F")  # h[:, k]: hash of the first k chars
            h2 = np.zeros_like(h1)
            for k in range(w):
                h1[:, k + 1] = h1[:, k] * _HASH_B1 + codes[:, k]
                h2[:, k + 1] = h2[:, k] * _HASH_B2 + codes[:, k]
            length = lens[idxs]
            rows = np.arange(len(idxs))
            f1, f2 = h1[rows, length], h2[rows, length]
            full1[idxs], full2[idxs] = f1, f2
            for cut in range(1, w):
                sel = np.flatnonzero(length > cut)
                if not len(sel):
                    break
                a1, a2, rest = h1[sel, cut], h2[sel, cut], length[sel] - cut
                owners.append(idxs[sel])
                cuts.append(np.full(len(sel), cut, np.int64))
                pre1.append(a1)
                pre2.append(a2)
                suf1.append(f1[sel] - a1 * pow1[rest])  # hash of the chars after the cut
                suf2.append(f2[sel] - a2 * pow2[rest])
    if not owners:
        return []
    order = np.argsort(full1, kind="stable")
    sorted1, sorted2 = full1[order], full2[order]
    if np.any(sorted1[1:] == sorted1[:-1]):
        return _generate_merges_python(rank_of)

    def lookup(q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
        """Token index of each hashed piece, -1 where it is not a token."""
        qo = np.argsort(q1)  # sorted queries make the binary searches cache-friendly
        j = np.empty(len(q1), np.int64)
        j[qo] = np.searchsorted(sorted1, q1[qo])
        np.minimum(j, n - 1, out=j)
        return np.where((sorted1[j] == q1) & (sorted2[j] == q2), order[j], -1)

    owner, cut = np.concatenate(owners), np.concatenate(cuts)
    left = lookup(np.concatenate(pre1), np.concatenate(pre2))
    ok = left >= 0
    owner, cut, left = owner[ok], cut[ok], left[ok]
    right = lookup(np.concatenate(suf1)[ok], np.concatenate(suf2)[ok])
    ok = right >= 0
    owner, cut, left, right = owner[ok], cut[ok], left[ok], right[ok]
    rank = np.fromiter(rank_of.values(), np.float64, n)[owner]
    # lexsort: last key is primary. Rank desc, left length desc, right length desc, vocab order.
    best_first = np.lexsort((owner, cut - lens[owner], -cut, -rank))
    return list(zip(key_arr[left[best_first]].tolist(), key_arr[right[best_first]].tolist()))


def _generate_merges_python(rank_of: Mapping[str, float]) -> list[tuple[str, str]]:
    """Straight port of transformers' ``generate_merges`` (slow: one lookup per split)."""
    vocab = {tok: i for i, tok in enumerate(rank_of)}
    merges: list[tuple[float, int, int, str, str]] = []
    for merge, score in rank_of.items():
        local = [(merge[:i], merge[i:]) for i in range(1, len(merge)) if merge[:i] in vocab and merge[i:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges.extend((score, len(lhs), len(rhs), lhs, rhs) for lhs, rhs in local)
    merges.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(m[3], m[4]) for m in merges]


@dataclass(frozen=True)
class _Built:
    """What a vocabulary-kind builder hands back to ``Tokenizer.from_gguf_metadata``."""

    backend: _HFTokenizer
    pre: str
    n_merges: int
    add_bos_default: bool  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token
    add_space_prefix: bool


class Tokenizer:
    """Encode/decode for one model's vocabulary. Build with :meth:`from_gguf_metadata`."""

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        tokens: list[str],
        token_types: np.ndarray,
        bos_id: int | None,
        eos_id: int | None,
        eot_ids: set[int],
        info: TokenizerInfo,
        sep_id: int | None = None,
    ):
        self._backend = backend
        self._tokens = tokens
        self._types = token_types
        # Per-instance cache of token bytes, filled on first use: computing all 150k-260k up
        # front cost a third of the build time, and decoding touches few of them.
        self._pieces: list[bytes | None] = [None] * len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_ids: set[int] = eot_ids
        self.sep_id = sep_id  # WordPiece: [SEP], appended whenever [CLS] (the BOS) is added
        self.info = info
        self.add_bos = info.add_bos
        self._control = frozenset(np.flatnonzero(token_types == TOKEN_CONTROL).tolist())
        # ``encode_special_tokens`` is a flag on the shared backend: toggling it for a
        # parse_special=False call must not leak into a concurrent encode.
        self._lock = threading.Lock()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> "Tokenizer":
        """Build the tokenizer a GGUF describes (``GGUFFile(path).metadata``)."""
        t0 = time.perf_counter()
        model = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("GGUF has no tokenizer.ggml.tokens; cannot build a tokenizer")
        tokens = list(tokens)
        n = len(tokens)
        raw_types = metadata.get("tokenizer.ggml.token_type")
        if raw_types is not None:
            types = np.asarray(raw_types, dtype=np.int32)
        else:
            # No types in the file: only <0xNN> tokens of a SentencePiece vocabulary are special.
            byte_type = TOKEN_BYTE if model == "llama" else TOKEN_NORMAL
            types = np.array([byte_type if _BYTE_TOKEN.fullmatch(t) else TOKEN_NORMAL for t in tokens], np.int32)
        if types.shape != (n,):
            raise TokenizerError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")

        if model == "gpt2":
            built = _build_byte_level(metadata, tokens, types)
        elif model == "llama":
            built = _build_spm(metadata, tokens, types)
        elif model == "gemma4":
            built = _build_gemma4(metadata, tokens, types)
        elif model == "bert":
            built = _build_wordpiece(metadata, tokens, types)
        else:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model {model!r}; supported: 'gpt2' (byte-level BPE), 'llama' "
                "(SentencePiece BPE), 'gemma4' (SentencePiece-style BPE with merges), 'bert' (WordPiece)"
            )
        _add_added_tokens(built.backend, tokens, types)

        bos_id = _meta_id(metadata, "tokenizer.ggml.bos_token_id", n)
        eos_id = _meta_id(metadata, "tokenizer.ggml.eos_token_id", n)
        sep_id = None
        if model == "bert":  # [CLS] opens an input and [SEP] closes it (llama.cpp's cls / "seperator" ids)
            # Converters differ in which ids they write: the BOS or the older CLS key, the separator or an
            # EOS; a file with none of them still spells the tokens.
            bos_id = _meta_id(metadata, "tokenizer.ggml.cls_token_id", n) if bos_id is None else bos_id
            bos_id = built.backend.token_to_id("[CLS]") if bos_id is None else bos_id
            sep_id = _meta_id(metadata, "tokenizer.ggml.seperator_token_id", n)
            sep_id = eos_id if sep_id is None else sep_id
            sep_id = built.backend.token_to_id("[SEP]") if sep_id is None else sep_id
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", built.add_bos_default)) and bos_id is not None
        eot = {i for key in _EOG_ID_KEYS if (i := _meta_id(metadata, key, n)) is not None}
        eot.update(i for name in _EOG_NAMES if (i := built.backend.token_to_id(name)) is not None and i < n)

        info = TokenizerInfo(
            model=model, pre=built.pre, vocab_size=n, n_merges=built.n_merges, add_bos=add_bos,
            add_space_prefix=built.add_space_prefix, build_seconds=time.perf_counter() - t0,
        )
        return cls(built.backend, tokens=tokens, token_types=types, bos_id=bos_id, eos_id=eos_id, eot_ids=eot, info=info,
                   sep_id=sep_id)

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``.

        ``add_bos=None`` follows the file (``tokenizer.ggml.add_bos_token``). A BOS is not added
        when the text already starts with one (a chat template that writes ``<bos>`` itself), since
        a doubled BOS degrades some models (gemma). ``parse_special=False`` tokenizes control-token
        text like ``<|im_end|>`` as plain text (for untrusted content); user-defined tokens are still
        matched whole, as llama.cpp does.
        """
        with self._lock:
            if parse_special:
                ids = self._backend.encode(text, add_special_tokens=False).ids
            else:
                self._backend.encode_special_tokens = True
                try:
                    ids = self._backend.encode(text, add_special_tokens=False).ids
                finally:
                    self._backend.encode_special_tokens = False
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if self.sep_id is not None:  # WordPiece wraps every input, as BERT's post-processor does
                ids = [self.bos_id, *ids, self.sep_id]
            elif not ids or ids[0] != self.bos_id:
                ids.insert(0, self.bos_id)
        return ids

    # -- decoding ---------------------------------------------------------------------------
    def token_to_piece(self, token_id: int) -> bytes:
        """The raw bytes ``token_id`` stands for (control and user-defined tokens: their text)."""
        if not 0 <= token_id < len(self._pieces):
            raise IndexError(f"token id {token_id} out of range for a vocabulary of {len(self._pieces)}")
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._compute_piece(token_id)
        return piece

    def _compute_piece(self, token_id: int) -> bytes:
        tok = self._tokens[token_id]
        typ = int(self._types[token_id])
        if typ in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            return tok.encode("utf-8")  # stored as raw text
        if self.info.model == "gpt2":
            if _BYTE_ALPHABET.issuperset(tok):
                return tok.translate(_UNICODE_TO_LATIN1).encode("latin-1")
            return tok.encode("utf-8")  # a normal token the converter left as raw text
        if typ == TOKEN_BYTE and (m := _BYTE_TOKEN.fullmatch(tok)):
            return bytes([int(m.group(1), 16)])
        if self.info.model == "bert" and tok.startswith("[") and tok.endswith("]"):
            return tok.encode("utf-8")
        return tok.replace(_SPM_SPACE, " ").encode("utf-8")

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a cut-off multi-byte character) becomes U+FFFD.

        For SentencePiece vocabularies that prepend a space to the input (``add_space_prefix``),
        one leading space is removed, as transformers' decoder does, so decode(encode(s)) == s.
        """
        control = self._control
        piece = self.token_to_piece
        data = b"".join(piece(i) for i in ids if not (skip_special and i in control))
        text = data.decode("utf-8", errors="replace")
        if self.info.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def incremental_decoder(self, *, skip_special: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special=skip_special)

    # -- vocabulary -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_strings(self) -> list[str]:
        """The vocabulary as the GGUF spells it (byte-level tokens in GPT-2's alphabet, ``▁`` for SPM spaces)."""
        return list(self._tokens)

    def special_ids(self) -> list[int]:
        """Every token that is not a normal text piece (control, user-defined, byte, unknown tokens)."""
        return np.flatnonzero(self._types != TOKEN_NORMAL).tolist()

    def is_control(self, token_id: int) -> bool:
        return token_id in self._control

    def think_tags(self) -> ThinkTags | None:
        """The reasoning block's open/close tokens (``<think>``/``</think>``), if the vocabulary has them."""
        return find_think_tags(self.token_id)

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled ``text`` in the vocabulary (e.g. ``"<|im_end|>"``), if any."""
        return self._backend.token_to_id(text)

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying ``tokenizers.Tokenizer`` (its added-token flags must not be changed)."""
        return self._backend


class IncrementalDecoder:
    """Streaming detokenizer: ``push`` one id at a time, get back the text it completed.

    Works on ``token_to_piece`` bytes, so a character whose UTF-8 bytes are spread over several
    byte tokens comes out whole, once its last byte arrives. Invalid bytes become U+FFFD as soon as
    they can no longer start or continue a character. Unlike ``Tokenizer.decode`` it never strips a
    SentencePiece prefix space: generated text continues a prompt, so its leading space is real.
    One decoder per stream; it is not thread-safe.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._pending = b""

    def push(self, token_id: int) -> str:
        if self._skip_special and self._tok.is_control(token_id):
            return ""
        buf = self._pending + self._tok.token_to_piece(token_id)
        cut = _complete_prefix_len(buf)
        self._pending = buf[cut:]
        return buf[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        """Whatever is held back (an incomplete character, shown as U+FFFD); resets the decoder."""
        buf, self._pending = self._pending, b""
        return buf.decode("utf-8", errors="replace")


def _complete_prefix_len(buf: bytes) -> int:
    """Length of ``buf`` without a trailing, still-incomplete UTF-8 sequence."""
    n = len(buf)
    # A UTF-8 character is at most 4 bytes, so an incomplete tail starts within the last 3.
    for back in range(1, min(3, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b >= 0xF0:
            need = 4 if b <= 0xF4 else 1
        elif b >= 0xE0:
            need = 3
        elif b >= 0xC2:
            need = 2
        else:  # ASCII or a byte that can never start a sequence
            need = 1
        return n - back if need > back else n
    return n


# --- builders ----------------------------------------------------------------------------------


def _pre_tokenizer_spec(pre: str | None) -> tuple[str, PreTokenizerSpec]:
    if not pre:
        log.warning("GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer (quality may degrade)")
        return "default", SPEC_DEFAULT
    spec = PRE_TOKENIZERS.get(pre)
    if spec is None:
        raise TokenizerError(
            f"unknown tokenizer.ggml.pre {pre!r}: this model's text splitting is not supported. "
            f"Supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
        )
    return pre, spec


def _build_byte_level(metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray) -> _Built:
    pre, spec = _pre_tokenizer_spec(metadata.get("tokenizer.ggml.pre"))
    raw_merges = metadata.get("tokenizer.ggml.merges")
    if raw_merges is None:
        raise TokenizerError("byte-level (gpt2) GGUF vocabulary has no tokenizer.ggml.merges")
    # partition via map keeps this loop in C: it is 150k merges for Qwen2.
    merges = [(left, right) for left, _, right in map(str.partition, raw_merges, repeat(" "))]
    if not all(right for _, right in merges):
        bad = next(m for m in raw_merges if " " not in m or not m.partition(" ")[2])
        raise TokenizerError(f"malformed merge {bad!r} in tokenizer.ggml.merges")

    # Normal tokens are spelled in GPT-2's byte alphabet; control and user-defined tokens are
    # raw text (that is how they are matched in the input), and stay as they are.
    vocab = dict(zip(tokens, range(len(tokens))))
    # A normal token outside the alphabet was written as raw text by its converter: respell it as
    # transformers does. One regex pass over all tokens finds them (rare; none in Qwen2/SmolLM2).
    lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))
    ends = np.cumsum(lengths)
    odd = {int(i) for i in np.searchsorted(ends, [m.start() for m in _NOT_BYTE_ALPHABET.finditer("".join(tokens))], side="right")}
    for i in sorted(odd):
        if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            continue
        raw = tokens[i]
        if vocab.get(raw) == i:
            del vocab[raw]
        vocab["".join(BYTE_TO_UNICODE[b] for b in raw.encode("utf-8"))] = i

    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=spec.ignore_merges)
    backend = _HFTokenizer(bpe)
    if spec.nfc:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    # llama.cpp adds BOS for a byte-level vocabulary only for these pre types, unless the file says.
    add_bos_default = pre in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken")
    return _Built(backend, pre, len(merges), add_bos_default, add_space_prefix=False)


def _is_gemma(arch: str) -> bool:
    return arch.startswith("gemma")


def _build_spm(metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray) -> _Built:
    arch = str(metadata.get("general.architecture", ""))
    gemma = _is_gemma(arch)
    n = len(tokens)

    # Gemma stores tokens made only of spaces as real spaces; the model looks them up as ▁▁...
    # (the input's spaces become ▁ before BPE), so respell them before building merges.
    spelled = [_SPM_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens] if gemma else tokens
    if gemma:
        # Gemma's merge order is its token order, not its scores (see transformers' gemma_tokenizer).
        rank_of = dict(zip(spelled, np.arange(0, -n, -1, dtype=np.float64).tolist()))
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError("SentencePiece (llama) GGUF vocabulary has no tokenizer.ggml.scores to derive merges from")
        rank_of = dict(zip(spelled, np.asarray(scores, dtype=np.float64).tolist()))
    merges = generate_merges(rank_of)

    vocab = dict(zip(spelled, range(n)))
    unk_id = _meta_id(metadata, "tokenizer.ggml.unknown_token_id", n)
    unk = tokens[unk_id] if unk_id is not None else None
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    backend = _HFTokenizer(bpe)

    # llama.cpp prepends a space to each run of text that starts the input or follows a special
    # token, unless the file says otherwise; gemma's tokenizer adds none.
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", not gemma))
    escape = normalizers.Replace(" ", _SPM_SPACE)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(_SPM_SPACE), escape]) if add_space_prefix else escape
    backend.decoder = decoders.Sequence([decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    pre = str(metadata.get("tokenizer.ggml.pre") or "default")
    return _Built(backend, pre, len(merges), add_bos_default=True, add_space_prefix=add_space_prefix)


def _build_gemma4(metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray) -> _Built:
    n = len(tokens)
    raw = metadata.get("tokenizer.ggml.merges")
    if not raw:
        raise TokenizerError("gemma4 GGUF vocabulary has no tokenizer.ggml.merges")
    merges = []
    for m in raw:
        cut = m.find(" ", 1)  # a piece may itself be a space: the separator is the first space after it
        if cut > 0:
            merges.append((m[:cut], m[cut + 1:]))
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk_id = _meta_id(metadata, "tokenizer.ggml.unknown_token_id", n)
    unk = tokens[unk_id] if unk_id is not None else None
    backend = _HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", _SPM_SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    # Newline runs that are tokens stay whole (llama.cpp bypasses the merges for them).
    newline_runs = [t for i, t in enumerate(tokens) if t and not t.strip("\n") and vocab[t] == i
                    and int(types[i]) == TOKEN_NORMAL]
    if newline_runs:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in newline_runs])
    return _Built(backend, "gemma4", len(merges), add_bos_default=True,
                  add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", False)))


def _build_wordpiece(metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray) -> _Built:
    # Back from llama.cpp's phantom-space spelling to WordPiece's: "▁word" starts a word, "ing" is "##ing".
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if int(types[i]) in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_UNKNOWN) or \
                (t.startswith("[") and t.endswith("]")):
            piece = t
        elif t.startswith(_SPM_SPACE):
            piece = t[1:]
        else:
            piece = "##" + t
        vocab.setdefault(piece, i)
    unk_id = _meta_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens))
    unk = tokens[unk_id] if unk_id is not None else "[UNK]"
    if unk not in vocab:
        raise TokenizerError(f"WordPiece vocabulary has no unknown token {unk!r}")
    backend = _HFTokenizer(models.WordPiece(vocab=vocab, unk_token=unk, continuing_subword_prefix="##",
                                            max_input_chars_per_word=100))
    lowercase = bool(metadata.get("tokenizer.ggml.do_lower_case", True))
    strip = metadata.get("tokenizer.ggml.strip_accents")
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=lowercase if strip is None else bool(strip),
                                                    lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return _Built(backend, str(metadata.get("tokenizer.ggml.pre") or "default"), 0, add_bos_default=True,
                  add_space_prefix=True)


def _add_added_tokens(backend: _HFTokenizer, tokens: list[str], types: np.ndarray) -> None:
    """Control tokens become special added tokens, user-defined ones normal added tokens.

    Both are matched whole in the raw input (``normalized=False``), before any splitting. A token
    whose text is not in the model vocabulary under its own id (a respelled or duplicate entry)
    is left out: adding it would make ``tokenizers`` append a new id past the vocabulary.
    """
    special, normal = [], []
    for i in np.flatnonzero((types == TOKEN_CONTROL) | (types == TOKEN_USER_DEFINED)).tolist():
        tok = tokens[i]
        if not tok or backend.token_to_id(tok) != i:
            continue
        if types[i] == TOKEN_CONTROL:
            special.append(AddedToken(tok, special=True, normalized=False))
        else:
            normal.append(AddedToken(tok, special=False, normalized=False))
    if special:
        backend.add_special_tokens(special)
    if normal:
        backend.add_tokens(normal)
