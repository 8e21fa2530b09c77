"""A real tandem server for the tests: `create_app` served by uvicorn in a background thread, and a store
holding a tiny qwen2 target with a 1-layer drafter of the same vocabulary (the real engine process runs
behind them). Shared by the server, CLI, bench and pull tests.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import httpx
import uvicorn

from benchmarks.serving import free_port
from blobs import BlobStore
from importer import CreateRequest, create_model
from server.routes.app import create_app
from server.settings import Settings, parse_host
from tests.tiny_gguf import TinySpec, write_tiny_gguf

#: The speculation fields tandem adds to every final answer (/api and /v1).
SPEC_FIELDS = {"drafter", "draft_n", "draft_n_accepted", "draft_rounds", "acceptance_rate", "mean_accepted_length",
               "acceptance_by_position", "mean_depth", "plain_steps"}


class ServerThread:
    """`create_app` served by uvicorn on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, store: BlobStore, settings: Settings | None = None, engine_factory: Callable | None = None):
        self.port = free_port()
        self.settings = dataclasses.replace(settings or Settings(num_thread=1), host=parse_host(f"127.0.0.1:{self.port}"))
        self.store = store
        self.app = create_app(store, self.settings, engine_factory)
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def lifecycle(self):
        return self.app.state.ctx.lifecycle

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(30)


def write_pair(d: Path) -> tuple[Path, Path]:
    """A tiny qwen2 target and a 1-layer drafter sharing its vocabulary (4096-token context, so long
    generations need no context shift)."""
    target, draft = d / "target.gguf", d / "draft.gguf"
    if not target.exists():
        write_tiny_gguf(target, TinySpec(arch="qwen2", seed=1, context_length=4096))
        write_tiny_gguf(draft, TinySpec(arch="qwen2", n_layer=1, seed=2, context_length=4096))
    return target, draft


def make_store(d: Path, name: str = "tiny") -> BlobStore:
    """A store with `name`: the pair, greedy sampling and a short default num_predict."""
    target, draft = write_pair(d)
    store = BlobStore(d / "models")
    t, _ = store.add_file(target)
    dr, _ = store.add_file(draft)
    create_model(store, CreateRequest(model=name, files={"target.gguf": t}, draft_files={"draft.gguf": dr},
                                      parameters={"temperature": 0.0, "num_predict": 8}))
    return store


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


def parse_time(value: str) -> datetime:
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value)
    assert m, value
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + (m.group(2) or ".0")[:7] + zone)
