"""How often each token of a vocabulary occurs in a reference text: what a pruned draft head keeps.

A draft model spends a large share of its reads on its output head (a third of Qwen2.5-Coder-0.5B's,
for its 151,936 rows). Scoring only the tokens that actually occur loses little: a token
the drafter cannot propose is one the target would rarely pick. Which ones occur is counted over a
reference text every Python installation has, the standard library's sources (code, and English in
their docstrings and comments), read in a fixed order up to ``CORPUS_BYTES``, so the table is the same
on every machine with the same Python. Each file is counted as a chat answer shows code, inside a
```python fence: without it the fence token, in nearly every answer, was never kept. Counting takes a
few seconds; ``token_counts`` keeps the result in a directory (the model store's derived files), keyed
by the vocabulary and the corpus.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from engine.text.tokenizer import Tokenizer

log = logging.getLogger("tandem.engine")

CORPUS_BYTES = 4 << 20  # ~4 MB of text: ~1M tokens, enough to rank the 32k most frequent
CORPUS_VERSION = 2  # bump when the corpus rule changes: cached tables are then recounted


def reference_corpus(limit: int = CORPUS_BYTES) -> list[str]:
    """The standard library's top-level ``.py`` files in name order, each in a markdown ```python fence,
    up to ``limit`` characters of text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        texts.append(f"```python\n{text}\n```\n"[: limit - total])
        total += len(texts[-1])
        if total >= limit:
            break
    return texts


def _vocab_key(tokenizer: Tokenizer) -> str:
    h = hashlib.sha256()
    for piece in tokenizer.token_strings():
        h.update(piece.encode("utf-8", "surrogatepass") + b"\0")
    h.update(f"corpus:{CORPUS_VERSION}:{CORPUS_BYTES}:python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return h.hexdigest()[:24]


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """int64 [vocab]: how many times each token occurs when ``texts`` are encoded (no BOS)."""
    counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for text in texts:
        ids = np.asarray(tokenizer.encode(text, add_bos=False, parse_special=False), dtype=np.int64)
        counts += np.bincount(ids[ids < len(counts)], minlength=len(counts))
    return counts


def token_counts(tokenizer: Tokenizer, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """The reference corpus's counts for this vocabulary, from ``cache_dir`` when counted before there
    (written atomically; an unreadable or misshapen file is recounted)."""
    path = Path(cache_dir) / f"token-counts-{_vocab_key(tokenizer)}.npy" if cache_dir is not None else None
    if path is not None:
        try:
            counts = np.load(path, allow_pickle=False)
            if counts.shape == (tokenizer.vocab_size,) and counts.dtype == np.int64:
                return counts
        except (OSError, ValueError):
            pass
    counts = count_tokens(tokenizer, reference_corpus())
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".counts-", suffix=".npy", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                np.save(fh, counts)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not keep the token counts in %s: %s", path.parent, e)
    return counts


def frequent_tokens(tokenizer: Tokenizer, k: int, counts: np.ndarray) -> np.ndarray:
    """The ids a head of ``k`` rows keeps, ascending: every special token (control, user-defined, byte),
    then the most frequent normal tokens (ties by id) until there are ``k``."""
    vocab = tokenizer.vocab_size
    keep = np.zeros(vocab, dtype=bool)
    keep[np.asarray(tokenizer.special_ids(), dtype=np.int64)] = True
    order = np.lexsort((np.arange(vocab), -counts))  # most frequent first, then lower id
    room = max(0, k - int(keep.sum()))
    keep[order[~keep[order]][:room]] = True
    return np.flatnonzero(keep)
