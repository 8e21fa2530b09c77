"""Sorting the files a create uploaded (name -> blob digest) into GGUF weights and safetensors weights."""

from __future__ import annotations

from typing import Mapping

from blobs import BlobStore

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
