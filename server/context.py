"""What every request handler reaches through `request.app.state.ctx`: the app's store, settings,
model lifecycle, metrics, prompt cache and the registry downloads in progress.

It lives apart from `routes/app.py` so that route modules can name it without importing the module that
includes their routers (which would be an import cycle); two apps in one process (tests do this) each
have their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from blobs import BlobStore
from importer.registry import Downloads

from .metrics import Metrics
from .prompting import PromptCache
from .lifecycle import ModelLifecycle
from .settings import Settings


@dataclass
class ServerContext:
    store: BlobStore
    settings: Settings
    lifecycle: ModelLifecycle
    metrics: Metrics
    prompts: PromptCache
    version: str
    downloads: Downloads = field(default_factory=Downloads)  # shared by concurrent pulls of one blob


def ctx_of(request: Request) -> ServerContext:
    return request.app.state.ctx
