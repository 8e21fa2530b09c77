"""``tandem push`` / ``/api/push`` to a registry, as Ollama pushes: each blob the repository lacks (checked with HEAD)
mounted from another repository of the same registry that this store pulled it from or pushed it to, else uploaded
(one PUT, or chunked PATCHes for a large blob), and the manifest PUT last, the very bytes of the store's, so every
layer (a DRAFT's drafter, a projector, license, messages) reaches the registry unchanged."""

from __future__ import annotations

import logging

from blobs import BlobStore, Manifest, ModelName
from blobs.names import fold
from importer.request import Progress, ProgressEvent

from .auth import Credentials
from .client import RegistryClient
from .errors import RegistryError
from .reference import RegistryRef, resolve

log = logging.getLogger("tandem.push")

CHUNK_SIZE = 64 << 20  # a blob up to this size goes in one PUT; larger ones in PATCHes of this size


def push_model(store: BlobStore, value: str, progress: Progress, *, insecure: bool = False,
               registry: str | None = None, credentials: Credentials | None = None,
               chunk_size: int = CHUNK_SIZE) -> None:
    ref = resolve(value, insecure=insecure, registry=registry)
    progress(ProgressEvent("retrieving manifest"))
    data = store.read_manifest_bytes(ref.name)
    manifest = Manifest.from_json(data)
    mounts = _mount_sources(store, ref)
    with RegistryClient(ref, credentials) as client:
        for layer in manifest.blobs():
            status = f"pushing {layer.digest[7:19]}"

            def report(n: int, status: str = status, layer=layer) -> None:
                progress(ProgressEvent(status, digest=layer.digest, total=layer.size, completed=n))

            if client.blob_size(layer.digest) is not None:
                report(layer.size)
                continue
            if not store.has_blob(layer.digest):
                raise RegistryError(f"{status}: the model's blob {layer.digest} is missing from the store", 500)

            def read(start: int, n: int, digest: str = layer.digest) -> bytes:
                with store.open_blob(digest) as f:
                    f.seek(start)
                    return f.read(n)

            client.upload(layer.digest, layer.size, read, report, chunk_size, mounts.get(layer.digest, []))
        progress(ProgressEvent("pushing manifest"))
        client.put_manifest(data, manifest.media_type)
    log.info("pushed %s to %s", ref.name.display(), ref.base_url)
    progress(ProgressEvent("success"))


def _mount_sources(store: BlobStore, ref: RegistryRef) -> dict[str, list[str]]:
    """For each blob, the other repositories of the same registry host, among this store's models, whose manifests
    hold it: the registry can mount the blob from one of them instead of receiving it again."""
    sources: dict[str, list[str]] = {}
    for entry in store.list_models():  # each entry's manifest already read
        name: ModelName = entry.name
        repository = f"{name.namespace}/{name.model}"
        if fold(name.host) != fold(ref.name.host) or repository == ref.repository:
            continue
        for layer in entry.manifest.blobs():
            held = sources.setdefault(layer.digest, [])
            if repository not in held:
                held.append(repository)
    return sources
