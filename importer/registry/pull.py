"""``tandem pull`` / ``/api/pull`` from a registry: the manifest, then each blob the store lacks (``download``), then
the manifest written, byte for byte as served, last. Progress as Ollama streams it: ``pulling manifest``, ``pulling
<digest12>`` with ``digest`` / ``total`` / ``completed``, ``verifying sha256 digest``, ``writing manifest``,
``success``. A failed pull removes the blobs it added that no model uses."""

from __future__ import annotations

import hashlib
import logging

from blobs import BlobStore, InvalidManifestError, Layer, Manifest, ModelName
from importer.request import Progress, ProgressEvent

from .auth import Credentials
from .client import RegistryClient
from .download import Downloads
from .errors import RegistryError
from .reference import MANIFEST_TYPES, resolve

log = logging.getLogger("tandem.pull")


def parse_pulled_manifest(data: bytes) -> Manifest:
    try:
        manifest = Manifest.from_json(data)
    except InvalidManifestError:
        raise RegistryError("pull model manifest: the registry served no valid manifest") from None
    if manifest.schema_version != 2 or manifest.media_type not in MANIFEST_TYPES:
        raise RegistryError(f"pull model manifest: unsupported manifest type {manifest.media_type!r}")
    for layer in manifest.all_layers():
        if not (layer.digest.startswith("sha256:") and len(layer.digest) == 71):
            raise RegistryError(f"pull model manifest: invalid layer digest {layer.digest!r}")
    return manifest


def pull_model(store: BlobStore, value: str, progress: Progress, *, downloads: Downloads, insecure: bool = False,
               registry: str | None = None, credentials: Credentials | None = None) -> ModelName:
    ref = resolve(value, insecure=insecure, registry=registry)
    progress(ProgressEvent("pulling manifest"))
    with RegistryClient(ref, credentials) as client:
        data = client.manifest()
        manifest = parse_pulled_manifest(data)
        blobs = manifest.blobs()
        missing = [layer for layer in blobs if not store.has_blob(layer.digest)]
        try:
            for layer in blobs:
                _fetch(store, client, layer, progress, downloads)
            progress(ProgressEvent("verifying sha256 digest"))
            try:
                for layer in missing:
                    downloads.commit(store, layer)
            except RegistryError:  # a blob that cannot verify: its model cannot be pulled, nothing of it stays
                for layer in missing:
                    downloads.discard(store, layer)
                raise
            progress(ProgressEvent("writing manifest"))
            store.write_manifest_bytes(ref.name, data)
        except BaseException:
            # what this pull added and no model uses goes
            store.discard_unreferenced(layer.digest for layer in missing)
            raise
    log.info("pulled %s (%s) from %s", ref.name.display(), "sha256:" + hashlib.sha256(data).hexdigest()[:12],
             ref.base_url)
    progress(ProgressEvent("success"))
    return ref.name


def _fetch(store: BlobStore, client: RegistryClient, layer: Layer, progress: Progress, downloads: Downloads) -> None:
    status = f"pulling {layer.digest[7:19]}"
    if store.has_blob(layer.digest):  # another model's, or an earlier pull's
        progress(ProgressEvent(status, digest=layer.digest, total=layer.size, completed=layer.size))
        return
    downloads.fetch(store, client, layer,
                    lambda n: progress(ProgressEvent(status, digest=layer.digest, total=layer.size, completed=n)))
