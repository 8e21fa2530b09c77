"""The distribution API's calls a pull and a push make (manifests, blob ranges, uploads), each answered once more with
a token after a 401 challenge (``auth``); failures become RegistryErrors worded as Ollama words them."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Callable, Iterator
from urllib.parse import urljoin

import httpx

from .auth import Credentials, authorization, parse_challenge
from .errors import RegistryError
from .reference import MANIFEST_TYPES, RegistryRef

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0


def _reason(e: httpx.HTTPError) -> str:
    """Why a request got no answer, in Go's words (Ollama's errors end with them), never the exception's text."""
    if isinstance(e, httpx.TimeoutException):
        return "i/o timeout"
    cause: BaseException | None = e
    while cause is not None:  # httpx wraps httpcore's error, which wraps the socket's
        if isinstance(cause, socket.gaierror):
            return "no such host"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return "connection refused" if isinstance(e, httpx.ConnectError) else "connection reset by peer"


def _registry_message(r: httpx.Response) -> str:
    """The first message of a registry's ``{"errors": [...]}`` body, else its status."""
    try:
        errors = r.json().get("errors") or []
        first = errors[0]
        return str(first.get("message") or first.get("code")).lower()
    except (ValueError, AttributeError, IndexError, TypeError):
        return f"registry answered {r.status_code}"


def status_error(r: httpx.Response, what: str) -> RegistryError:
    if r.status_code == 404:
        return RegistryError(f"{what}: file does not exist", 404)
    if r.status_code in (401, 403):
        return RegistryError(f"{what}: unauthorized: access denied", 401)
    return RegistryError(f"{what}: {_registry_message(r)}")


class RegistryClient:
    """One model's repository on one registry; thread-safe (a pull reads several parts of a blob at once)."""

    def __init__(self, ref: RegistryRef, credentials: Credentials | None = None):
        self.ref = ref
        self._credentials = credentials
        self._http = httpx.Client(timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT), follow_redirects=True)
        self._auth: str | None = None
        self._auth_lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, url: str, what: str, *, headers: dict[str, str] | None = None,
             content: bytes | None = None, stream: bool = False) -> httpx.Response:
        """One request; after a 401 whose challenge can be answered, the same request once more with the answer
        (which later requests carry from the start). A registry that cannot be reached is a RegistryError."""
        for attempt in range(2):
            sent = dict(headers or {})
            if self._auth:
                sent["Authorization"] = self._auth
            try:
                r = self._http.send(self._http.build_request(method, url, headers=sent, content=content),
                                    stream=stream)
            except httpx.HTTPError as e:
                raise RegistryError(f'{what}: {method.title()} "{url}": {_reason(e)}') from None
            if r.status_code != 401 or attempt:
                return r
            challenge = parse_challenge(r.headers.get("www-authenticate"))
            with self._auth_lock:
                answer = authorization(self._http, challenge, self._credentials) if challenge else None
                if answer is None or answer == sent.get("Authorization"):
                    return r
                self._auth = answer
            r.close()
        raise AssertionError("unreachable")

    # -- pull ------------------------------------------------------------------------------------
    def manifest(self) -> bytes:
        """The manifest's bytes, exactly as the registry serves them (their digest is the model's)."""
        what = "pull model manifest"
        r = self.send("GET", self.ref.manifest_url(), what, headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if r.status_code != 200:
            raise status_error(r, what)
        return r.content

    @contextmanager
    def blob_range(self, digest: str, start: int, end: int) -> Iterator[httpx.Response]:
        """A response streaming bytes ``start`` to ``end`` (exclusive) of a blob."""
        what = f"pull {digest[7:19]}"
        r = self.send("GET", self.ref.blob_url(digest), what, headers={"Range": f"bytes={start}-{end - 1}"},
                      stream=True)
        try:
            if r.status_code not in (200, 206):
                r.read()
                raise status_error(r, what)
            if r.status_code == 200 and (start != 0 or int(r.headers.get("content-length") or -1) != end):
                raise RegistryError(f"{what}: the registry does not serve byte ranges")
            yield r
        finally:
            r.close()

    # -- push ------------------------------------------------------------------------------------
    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the repository holds, None when it holds none."""
        r = self.send("HEAD", self.ref.blob_url(digest), f"push {digest[7:19]}")
        if r.status_code == 200:
            return int(r.headers.get("content-length") or 0)
        if r.status_code == 404:
            return None
        raise status_error(r, f"push {digest[7:19]}")

    def _location(self, r: httpx.Response, what: str) -> str:
        location = r.headers.get("location")
        if not location:
            raise RegistryError(f"{what}: the registry gave no upload location")
        return urljoin(str(r.request.url), location)

    def upload(self, digest: str, size: int, read: Callable[[int, int], bytes], progress: Callable[[int], None],
               chunk_size: int, mount_from: list[str]) -> None:
        """Put a blob in the repository: mounted from another repository of the registry that holds it where the
        registry allows, else uploaded (one PUT up to ``chunk_size``, chunked PATCHes beyond). ``read(start, n)``
        gives the blob's bytes."""
        what = f"push {digest[7:19]}"
        r: httpx.Response | None = None
        for source in mount_from:
            r = self._post_upload(what, {"mount": digest, "from": source})
            if r.status_code == 201:  # mounted: nothing to send
                progress(size)
                return
            if r.status_code == 202:
                break  # no mount, but an upload session to use
        if r is None or r.status_code != 202:
            r = self._post_upload(what, {})
        if r.status_code != 202:
            raise status_error(r, what)
        location = self._location(r, what)
        if size <= chunk_size:
            r = self.send("PUT", _with_digest(location, digest), what, content=read(0, size),
                          headers={"Content-Type": "application/octet-stream"})
        else:
            for start in range(0, size, chunk_size):
                data = read(start, min(chunk_size, size - start))
                r = self.send("PATCH", location, what, content=data,
                              headers={"Content-Type": "application/octet-stream",
                                       "Content-Range": f"{start}-{start + len(data) - 1}"})
                if r.status_code != 202:
                    raise status_error(r, what)
                location = self._location(r, what)
                progress(start + len(data))
            r = self.send("PUT", _with_digest(location, digest), what, content=b"")
        if r.status_code != 201:
            raise status_error(r, what)
        progress(size)

    def _post_upload(self, what: str, query: dict[str, str]) -> httpx.Response:
        url = self.ref.url("blobs/uploads/")
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        return self.send("POST", url, what, content=b"")

    def put_manifest(self, data: bytes, media_type: str) -> None:
        what = "push manifest"
        r = self.send("PUT", self.ref.manifest_url(), what, content=data, headers={"Content-Type": media_type})
        if r.status_code not in (200, 201):
            raise status_error(r, what)


def _with_digest(location: str, digest: str) -> str:
    return location + ("&" if "?" in location else "?") + f"digest={digest}"
