"""A small synchronous client for the tandem (Ollama) API, used by the CLI.

Streaming endpoints are read line by line; a line with `error` raises `APIError`, as Ollama's clients do.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from ...settings import env_value, parse_host


class APIError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status


class ConnectError(APIError):
    pass


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    except ValueError:
        pass
    return response.text.strip() or f"HTTP {response.status_code}"


def default_host() -> str | None:
    """Where the CLI finds a server: TANDEM_HOST, else OLLAMA_HOST (so a shell set up for Ollama reaches
    tandem too), else parse_host's default (127.0.0.1:11434). Both are read as Ollama's envconfig reads them."""
    return env_value(os.environ, "TANDEM_HOST") or env_value(os.environ, "OLLAMA_HOST") or None


class Client:
    def __init__(self, host: str | None = None, timeout: float | None = None):
        spec = parse_host(host if host is not None else default_host())
        self.base_url = spec.url()
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=5.0))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ConnectError(f"could not connect to the tandem server at {self.base_url}; is `tandem serve` running?") from None
        if r.status_code >= 400:
            raise APIError(_error_text(r), r.status_code)
        return r

    def _stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            with self._http.stream("POST", path, json=body, headers={"Accept": "application/x-ndjson"}) as r:
                if r.status_code >= 400:
                    r.read()
                    raise APIError(_error_text(r), r.status_code)
                for line in r.iter_lines():
                    if not line.strip():
                        continue
                    part = json.loads(line)
                    if isinstance(part, dict) and part.get("error"):
                        raise APIError(part["error"])
                    yield part
        except httpx.ConnectError:
            raise ConnectError(f"could not connect to the tandem server at {self.base_url}; is `tandem serve` running?") from None

    # -- API --------------------------------------------------------------------------------------
    def heartbeat(self, timeout: float = 2.0) -> str | None:
        """The server's tandem version when a tandem server answers, "" for another Ollama-compatible
        server, None when nothing answers."""
        try:
            r = self._http.get("/", timeout=timeout)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return r.headers.get("x-tandem-version", "")

    def version(self) -> str:
        """The server's own version: tandem's (`tandem_version`; `version` is the Ollama API it mirrors),
        or an Ollama server's `version`."""
        body = self._request("GET", "/api/version").json()
        return body.get("tandem_version") or body["version"]

    def head_blob(self, digest: str) -> bool:
        try:
            self._request("HEAD", f"/api/blobs/{digest}")
            return True
        except APIError as e:
            if e.status == 404:
                return False
            raise

    def upload_blob(self, path: Path, digest: str) -> None:
        with open(path, "rb") as f:
            self._request("POST", f"/api/blobs/{digest}", content=f)

    def create(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self._stream("/api/create", {**body, "stream": True})

    def pull(self, name: str, insecure: bool = False) -> Iterator[dict[str, Any]]:
        return self._stream("/api/pull", {"model": name, "stream": True, **({"insecure": True} if insecure else {})})

    def push(self, name: str, insecure: bool = False) -> Iterator[dict[str, Any]]:
        return self._stream("/api/push", {"model": name, "stream": True, **({"insecure": True} if insecure else {})})

    def generate(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self._stream("/api/generate", {**body, "stream": True})

    def chat(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self._stream("/api/chat", {**body, "stream": True})

    def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/api/embed", json=body).json()

    def show(self, name: str, verbose: bool = False) -> dict[str, Any]:
        return self._request("POST", "/api/show", json={"model": name, "verbose": verbose}).json()

    def ps(self) -> dict[str, Any]:
        return self._request("GET", "/api/ps").json()

    def tags(self) -> dict[str, Any]:
        return self._request("GET", "/api/tags").json()

    def copy(self, source: str, destination: str) -> None:
        self._request("POST", "/api/copy", json={"source": source, "destination": destination})

    def delete(self, name: str) -> None:
        self._request("DELETE", "/api/delete", json={"model": name})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


class ServerBlobSink:
    """importer.BlobSink over /api/blobs: hash locally, HEAD first, upload only what the server lacks."""

    def __init__(self, client: Client, on_upload: Callable[[Path, str, bool], None] | None = None):
        self.client = client
        self.on_upload = on_upload  # (path, digest, uploaded)
        self.uploaded: list[str] = []

    def upload_file(self, path: Path) -> str:
        digest = sha256_file(path)
        present = self.client.head_blob(digest)
        if not present:
            self.client.upload_blob(path, digest)
            self.uploaded.append(digest)
        if self.on_upload:
            self.on_upload(path, digest, not present)
        return digest

    def has_model(self, name: str) -> bool:
        try:
            self.client.show(name)
        except APIError as e:
            if e.status in (400, 404):  # not there, or not a name the server takes
                return False
            raise
        return True
