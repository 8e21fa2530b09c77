"""Sorting the files a create uploaded (name -> blob digest) into GGUF weights and safetensors weights."""

from __future__ import annotations

from typing import Mapping

from blobs import BlobStore
from engine.contract.gguf import GGUFError, read_metadata

from .request import CreateError

GGUF_MAGIC = b"GGUF"


def sort_weights(store: BlobStore, files: Mapping[str, str], role: str) -> tuple[list[str], list[str]]:
    """(digests of the GGUF files, names of the safetensors files) among ``files``, by content for GGUF (a file's
    magic, whatever its name) and by name for safetensors; a missing blob, PyTorch pickle weights and a ``.gguf``
    that is not one are refused, naming ``role``."""
    ggufs: list[str] = []
    safetensors: list[str] = []
    for fname, digest in files.items():
        if not store.has_blob(digest):
            raise CreateError(f'blob "{digest}" not found; upload it with POST /api/blobs/{digest} first')
        with store.open_blob(digest) as fh:
            magic = fh.read(4)
        if magic == GGUF_MAGIC:
            ggufs.append(digest)
        elif fname.endswith(".safetensors"):
            safetensors.append(fname)
        elif fname.endswith((".bin", ".pt", ".pth")):
            raise CreateError(f"{role} {fname}: PyTorch pickle weights are not supported; use safetensors or GGUF")
        elif fname.endswith(".gguf"):
            raise CreateError(f"{role} {fname}: not a GGUF file (bad magic {magic!r}, expected b'GGUF')")
    return ggufs, safetensors


PROJECTOR_TYPES = frozenset({"mmproj", "projector"})  # general.type of llama.cpp's and Ollama's projector GGUFs


def is_projector(metadata: Mapping[str, object]) -> bool:
    """A vision (or audio) projector GGUF: what llama.cpp's converter writes with ``--mmproj`` (general.type
    ``mmproj``, architecture ``clip``), and what Ollama stores as its projector layer."""
    return metadata.get("general.type") in PROJECTOR_TYPES or metadata.get("general.architecture") == "clip"


def split_projectors(store: BlobStore, files: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``files`` without their projector GGUFs, and the projectors' digests (a second ``FROM``, as Ollama takes
    a model's projector: read from the file itself, whatever its name)."""
    rest: dict[str, str] = {}
    projectors: list[str] = []
    for fname, digest in files.items():
        if store.has_blob(digest):
            with store.open_blob(digest) as fh:
                magic = fh.read(4)
            if magic == GGUF_MAGIC:
                try:
                    metadata, _ = read_metadata(store.blob_path(digest))
                except (GGUFError, ValueError, OSError):
                    metadata = {}
                if is_projector(metadata):
                    if digest not in projectors:
                        projectors.append(digest)
                    continue
        rest[fname] = digest
    return rest, projectors
