"""Blob sinks: where a Modelfile's local files are copied before a create refers to them by digest."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from blobs import BlobsError, BlobStore


class LocalBlobSink:
    """Copies files straight into a local store (the CLI when no server runs)."""

    def __init__(self, store: BlobStore, on_copy: Callable[[Path, str], None] | None = None):
        self.store = store
        self.on_copy = on_copy

    def upload_file(self, path: Path) -> str:
        digest, _ = self.store.add_file(path)
        if self.on_copy:
            self.on_copy(path, digest)
        return digest

    def has_model(self, name: str) -> bool:
        try:
            self.store.read_manifest(name)
        except BlobsError:  # not found, or not a valid name
            return False
        return True
