"""A stored model read back from its manifest: the paths of its weights and its decoded text layers.

This is what the model lifecycle (server.lifecycle) loads and what `show` presents; it only reads the store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .manifest import (
    MEDIA_TYPE_ADAPTER,
    MEDIA_TYPE_DRAFT,
    MEDIA_TYPE_HF_DRAFT_FILE,
    MEDIA_TYPE_HF_FILE,
    MEDIA_TYPE_LICENSE,
    MEDIA_TYPE_MESSAGES,
    MEDIA_TYPE_MODEL,
    MEDIA_TYPE_PARAMS,
    MEDIA_TYPE_PROJECTOR,
    MEDIA_TYPE_PROMPT,
    MEDIA_TYPE_SYSTEM,
    MEDIA_TYPE_TEMPLATE,
    MEDIA_TYPE_TUNING,
    Manifest,
)
from .names import ModelName
from .store import BlobStore


@dataclass(frozen=True)
class StoredModel:
    name: ModelName
    manifest: Manifest
    digest: str  # hex sha256 of the manifest file
    modified_at: datetime
    size: int
    config: dict[str, Any]
    model_path: Path | None
    draft_path: Path | None
    adapter_paths: list[Path] = field(default_factory=list)
    #: the vision projector GGUF (Ollama's projector layer): images reach the model through llama.cpp's --mmproj
    projector_path: Path | None = None
    template: str | None = None
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    licenses: list[str] = field(default_factory=list)
    #: parameter -> where its value came from (the tandem tuning layer; see importer.create)
    tuning: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the Hugging Face folders kept for the vllm engine: (name within the folder, blob path) per file
    hf_files: tuple[tuple[str, Path], ...] = ()
    draft_hf_files: tuple[tuple[str, Path], ...] = ()

    @property
    def parent_model(self) -> str:
        model = self.manifest.layer(MEDIA_TYPE_MODEL)
        return model.from_ or "" if model else ""

    def details(self) -> dict[str, Any]:
        """Ollama's `details` object (/api/tags, /api/show, /api/ps)."""
        c = self.config
        families = c.get("model_families")
        return {
            "parent_model": self.parent_model,
            "format": c.get("model_format", "gguf"),
            "family": c.get("model_family", ""),
            "families": families if families else None,
            "parameter_size": c.get("model_type", ""),
            "quantization_level": c.get("file_type", ""),
        }


def load_stored_model(store: BlobStore, name: ModelName | str) -> StoredModel:
    """Read a model's manifest and text layers. Raises the store's ModelNotFoundError when absent."""
    entry = store.entry(name)
    manifest = entry.manifest

    def text(media_type: str) -> str | None:
        layer = manifest.layer(media_type)
        return store.read_blob(layer.digest).decode("utf-8") if layer else None

    def path(media_type: str) -> Path | None:
        layer = manifest.layer(media_type)
        return store.blob_path(layer.digest) if layer else None

    params_text = text(MEDIA_TYPE_PARAMS)
    messages_text = text(MEDIA_TYPE_MESSAGES)
    tuning_text = text(MEDIA_TYPE_TUNING)
    tuning = json.loads(tuning_text).get("parameters", {}) if tuning_text else {}
    config = json.loads(store.read_blob(manifest.config.digest) or b"{}")
    return StoredModel(
        name=entry.name,
        manifest=manifest,
        digest=entry.digest,
        modified_at=entry.modified_at,
        size=entry.size,
        config=config if isinstance(config, dict) else {},
        model_path=path(MEDIA_TYPE_MODEL),
        draft_path=path(MEDIA_TYPE_DRAFT),
        adapter_paths=[store.blob_path(l.digest) for l in manifest.layers_of(MEDIA_TYPE_ADAPTER)],
        projector_path=path(MEDIA_TYPE_PROJECTOR),
        template=text(MEDIA_TYPE_TEMPLATE) if manifest.layer(MEDIA_TYPE_TEMPLATE) else text(MEDIA_TYPE_PROMPT),
        system=text(MEDIA_TYPE_SYSTEM),
        params=json.loads(params_text) if params_text else {},
        messages=json.loads(messages_text) if messages_text else [],
        licenses=[store.read_blob(l.digest).decode("utf-8") for l in manifest.layers_of(MEDIA_TYPE_LICENSE)],
        tuning=tuning if isinstance(tuning, dict) else {},
        hf_files=tuple((l.name or "", store.blob_path(l.digest)) for l in manifest.layers_of(MEDIA_TYPE_HF_FILE)),
        draft_hf_files=tuple((l.name or "", store.blob_path(l.digest))
                             for l in manifest.layers_of(MEDIA_TYPE_HF_DRAFT_FILE)),
    )
