"""Where a model name lives in a registry, as Ollama resolves it: ``gemma3`` is
``registry.ollama.ai/library/gemma3:latest``, ``user/model:tag`` is under the same host, ``host[:port]/ns/model:tag``
names its host. ``TANDEM_REGISTRY`` (``http://127.0.0.1:5000``) stands for the default host, so an air-gapped site
or a test serves the library's names from a registry of its own; the model keeps its library name in the store."""

from __future__ import annotations

from dataclasses import dataclass

from blobs import InvalidNameError, ModelName
from blobs.names import DEFAULT_HOST, fold

from .errors import RegistryError

#: The manifest types a pull accepts: Ollama's (Docker's schema 2) and OCI's image manifest, whose layers Ollama's
#: registry and a distribution registry both serve.
MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json", "application/vnd.oci.image.manifest.v1+json")


@dataclass(frozen=True)
class RegistryRef:
    name: ModelName  # the name in the store
    base_url: str  # scheme://host[:port], no trailing slash
    repository: str  # namespace/model, as the registry's /v2/ paths name it

    def url(self, path: str) -> str:
        return f"{self.base_url}/v2/{self.repository}/{path}"

    def manifest_url(self) -> str:
        return self.url(f"manifests/{self.name.tag}")

    def blob_url(self, digest: str) -> str:
        return self.url(f"blobs/{digest}")


def resolve(value: str | ModelName, *, insecure: bool = False, registry: str | None = None) -> RegistryRef:
    """``value``'s registry location; ``insecure`` reaches a named host over plain http (Ollama's flag), ``registry``
    (TANDEM_REGISTRY) replaces the default host, its scheme given with it (https when it names none)."""
    try:
        name = ModelName.parse(value)
    except InvalidNameError:
        raise RegistryError("invalid model name", 400) from None
    if registry and fold(name.host) == DEFAULT_HOST:
        base = registry.strip().rstrip("/")
        if "://" not in base:
            base = ("http://" if insecure else "https://") + base
    else:
        base = ("http://" if insecure else "https://") + name.host
    scheme = base.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise RegistryError(f"registry {base} is not an http or https address", 400)
    return RegistryRef(name=name, base_url=base, repository=f"{name.namespace}/{name.model}")
