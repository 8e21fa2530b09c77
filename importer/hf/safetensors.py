"""Reading an uploaded Hugging Face model folder: config.json, safetensors shards and their index.

The files arrive as blobs (a create request maps file names to digests), so a "folder" here is a
mapping from file name to a path on disk. Everything is validated before any tensor is read: the
shard index against the uploaded files, and every safetensors header by hand (length, JSON, dtype,
shape and byte range of each tensor), so a truncated or corrupt file fails with a message that names
it instead of an obscure error from deep inside a reader. Tensors are then read one at a time
(``TensorReader``), never the whole model at once.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Mapping, TypeVar

from .errors import CreateError

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format caps its JSON header at 100 MB

# Bytes per element of every safetensors dtype (the packed 4/6-bit float formats have no whole
# size; they only ever need to be recognised, to be refused as quantized).
DTYPE_SIZES: Mapping[str, float] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
    "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 0.5, "F6_E2M3": 0.75,
    "F6_E3M2": 0.75, "C64": 8,
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
V = TypeVar("V")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it (shape outermost first, as torch)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # the file name it lives in (a key of HFSource.files)


@dataclass(frozen=True)
class HFSource:
    """A validated model folder: its config, every tensor's header entry, and where each file is."""

    role: str  # "FROM" or "DRAFT", for messages
    config: dict[str, Any]
    tensors: dict[str, TensorEntry]
    files: dict[str, Path]


def folder_paths(files: Mapping[str, V]) -> dict[str, V]:
    """Uploaded file names as a folder reads them: each file under its base name (a top-level file wins over
    a nested one of the same name, so ``1_Pooling/config.json`` never stands in for ``config.json``), and a
    nested file also under its path in the folder (sentence-transformers' ``1_Pooling/config.json``)."""
    out: dict[str, V] = {}
    for name, value in sorted(files.items(), key=lambda kv: kv[0].strip("/").count("/")):
        rel = "/".join(part for part in name.split("/") if part not in ("", "."))
        out.setdefault(rel.rsplit("/", 1)[-1], value)
        if "/" in rel:
            out.setdefault(rel, value)
    return out


def _error(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def read_header(path: Path, fname: str, role: str) -> dict[str, TensorEntry]:
    """Parse and check one safetensors header; every inconsistency is a CreateError naming the file."""

    def corrupt(why: str) -> CreateError:
        return _error(role, f"{fname}: corrupt safetensors header: {why}")

    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise corrupt(f"the file has {size} bytes, fewer than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8 or n > _MAX_HEADER:
            raise corrupt(f"header length {n} does not fit the file ({size} bytes)")
        text = fh.read(n)
    try:
        obj = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt(f"the header is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise corrupt("the header is not a JSON object")
    data_size = size - 8 - n
    out: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in obj.items():
        if name == "__metadata__":
            continue
        entry, span = _check_entry(name, info, data_size, corrupt)
        out[name] = TensorEntry(name, entry[0], entry[1], fname)
        spans.append((span[0], span[1], name))
    spans.sort()
    for (_, e0, a), (b1, _, b) in pairwise(spans):
        if b1 < e0:
            raise corrupt(f"tensors {a!r} and {b!r} overlap")
    return out


def _check_entry(name: str, info: Any, data_size: int, corrupt) -> tuple[tuple[str, tuple[int, ...]], tuple[int, int]]:
    if not isinstance(info, dict):
        raise corrupt(f"entry {name!r} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise corrupt(f"tensor {name!r} has no dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise corrupt(f"tensor {name!r} has an invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise corrupt(f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise corrupt(f"tensor {name!r} spans bytes {begin}..{end}, outside the {data_size}-byte data section")
    itemsize = DTYPE_SIZES.get(dtype)
    if itemsize is not None:
        expected = math.ceil(math.prod(shape) * itemsize)
        if end - begin != expected:
            raise corrupt(f"tensor {name!r} ({dtype} {shape}) needs {expected} bytes, its offsets give {end - begin}")
    return (dtype, tuple(shape)), (begin, end)


def _read_json(files: Mapping[str, Path], fname: str, role: str) -> Any:
    try:
        return json.loads(files[fname].read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _error(role, f"{fname} is not valid JSON ({e})") from None


def _weight_files(files: Mapping[str, Path], role: str) -> list[str]:
    """The shards to read: those the index names (all must be there), else every safetensors file."""
    if INDEX_FILE not in files:
        return sorted(f for f in files if f.endswith(".safetensors"))
    index = _read_json(files, INDEX_FILE, role)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise _error(role, f"{INDEX_FILE} has no weight_map of tensor names to shard files")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if s not in files]
    if missing:
        raise _error(role, f"{INDEX_FILE} names {len(missing)} shard(s) that were not uploaded: {', '.join(missing)}")
    return shards


def open_source(files: Mapping[str, Path], role: str) -> HFSource:
    """Validate an uploaded folder (config, index, every header) without reading any tensor data."""
    files = dict(files)
    if CONFIG_FILE not in files:
        raise _error(role, f"{CONFIG_FILE} is missing; a safetensors model needs the Hugging Face config.json "
                           "that describes it")
    config = _read_json(files, CONFIG_FILE, role)
    if not isinstance(config, dict):
        raise _error(role, f"{CONFIG_FILE} is not a JSON object")
    shards = _weight_files(files, role)
    if not shards:
        raise _error(role, "no safetensors file among the uploaded files")
    tensors: dict[str, TensorEntry] = {}
    for shard in shards:
        for name, entry in read_header(files[shard], shard, role).items():
            if name in tensors:
                raise _error(role, f"tensor {name!r} is stored twice ({tensors[name].file} and {shard})")
            tensors[name] = entry
    if INDEX_FILE in files:
        weight_map = _read_json(files, INDEX_FILE, role)["weight_map"]
        for name, shard in weight_map.items():
            if name not in tensors or tensors[name].file != shard:
                raise _error(role, f"{INDEX_FILE} maps tensor {name!r} to {shard}, which does not hold it")
    return HFSource(role, config, tensors, files)


class TensorReader:
    """Reads tensors one at a time (as torch tensors, to keep bf16) from the shards, opening each once."""

    def __init__(self, source: HFSource):
        self.source = source
        self._open: dict[str, Any] = {}

    def get(self, name: str):
        from safetensors import SafetensorError, safe_open

        entry = self.source.tensors[name]
        handle = self._open.get(entry.file)
        try:
            if handle is None:
                handle = self._open[entry.file] = safe_open(str(self.source.files[entry.file]), framework="pt")
            return handle.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise _error(self.source.role, f"{entry.file}: cannot read tensor {name!r}: {e}") from None

    def close(self) -> None:
        self._open.clear()  # safe_open handles release their mapping when dropped

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
