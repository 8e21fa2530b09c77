"""The text a drafter trains on: the user's files and folders, or what any machine with Python has.

The default mixes code and prose so that a head is not fitted to one kind of text: the standard library's Python
sources, and the long descriptions of the installed packages (their ``METADATA``: READMEs in Markdown and reST,
English prose with lists and examples). Files are taken in a seeded order and read until the token budget is met,
so the same command reads the same text (a resumed run sees the windows it saw before). Each file gives at most
``PER_FILE_TOKENS``: read whole, a 100,000-token budget was six files (a mailbox module, a tar reader, difflib, ...),
the held-out windows the tail of one of them. A package description's header fields (``Name:``, ``Classifier:`` ...)
are left out: the description after them is the prose.
"""

from __future__ import annotations

import os
import random
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Sequence

TEXT_SUFFIXES = frozenset({".txt", ".md", ".rst", ".py", ".json", ".html", ".c", ".h", ".cpp", ".js", ".ts", ".go",
                           ".rs", ".java", ".sh", ".toml", ".yaml", ".yml", ".csv", ""})
_MAX_FILE_BYTES = 1 << 20  # a larger file is read only this far
#: Tokens taken from one file at most (its beginning): many files' worth of text, not a few files' length.
PER_FILE_TOKENS = 3072
_CHARS_PER_TOKEN_MAX = 8  # text encoded per file: enough characters for PER_FILE_TOKENS of any text


class NoTrainingText(ValueError):
    """The paths given hold no readable text."""


def default_sources() -> list[Path]:
    """The standard library's sources and the installed packages' descriptions, interleaved."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    code = sorted(p for p in stdlib.glob("*.py"))
    prose = sorted(purelib.glob("*.dist-info/METADATA"))
    mixed: list[Path] = []
    for i in range(max(len(code), len(prose))):
        mixed.extend(x[i] for x in (prose, code) if i < len(x))
    return mixed


def files_under(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The text files the given files and folders hold (folders walked, hidden entries skipped)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(Path(root) / n for n in sorted(names)
                             if not n.startswith(".") and Path(n).suffix.lower() in TEXT_SUFFIXES)
        else:
            raise NoTrainingText(f"{p}: no such file or folder")
    return found


def read_texts(files: Iterable[Path]) -> Iterable[str]:
    for f in files:
        try:
            raw = f.open("rb").read(_MAX_FILE_BYTES)
        except OSError:
            continue
        if b"\0" in raw[:4096]:
            continue  # binary
        text = raw.decode("utf-8", errors="ignore")
        if f.name == "METADATA":  # the core metadata's header block, then a blank line, then the description
            head, _, body = text.partition("\n\n")
            text = body if head.startswith("Metadata-Version:") else text
        text = text.strip()
        if text:
            yield text


def gather_tokens(files: Sequence[Path], encode: Callable[[str], list[int]], n_tokens: int, seed: int = 0,
                  per_file: int = PER_FILE_TOKENS) -> list[int]:
    """Token ids of the files' texts (at most ``per_file`` of each), in a seeded order, until ``n_tokens`` (all of
    them if fewer)."""
    order = list(files)
    random.Random(seed).shuffle(order)
    tokens: list[int] = []
    for text in read_texts(order):
        tokens.extend(encode(text[:per_file * _CHARS_PER_TOKEN_MAX])[:per_file])
        if len(tokens) >= n_tokens:
            return tokens[:n_tokens]
    if not tokens:
        raise NoTrainingText("the training data holds no readable text")
    return tokens
