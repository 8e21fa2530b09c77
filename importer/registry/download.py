"""Blobs fetched from a registry into the store: in parallel byte ranges, resumable, verified, shared.

A blob's parts are appended to files under ``<models>/downloads/sha256-<hex>/`` as they arrive, so a pull killed or
cut off part-way continues the next time from the bytes already there (a dropped connection is retried at once).
Parts stay there until every blob of the model is whole (a blob in the store that no manifest names yet would be
pruned at the next start, and fetched again); then ``commit`` has the store write each blob from its parts, checking
its sha256 before it takes its name, and the parts go. A digest that does not match removes the parts, so nothing of
a corrupted blob stays. Two pulls of the same blob in one server share one download (``Downloads``); in two
processes, the second waits on the first's lock.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx

from blobs import BlobStore, DigestMismatchError, Layer

from .client import RegistryClient
from .errors import RegistryError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process lock
    fcntl = None  # type: ignore[assignment]

PARTS = 16  # a large blob's ranges, as Ollama splits it
MIN_PART_SIZE = 1 << 20  # smaller blobs come in fewer parts
PARALLEL = 4  # ranges read at once
RETRIES = 5  # dropped connections a part survives
REPORT_EVERY = 0.1  # seconds between progress reports of a download


@dataclass(frozen=True)
class PullSettings:
    """How a pull splits and reads blobs; the defaults suit a real registry, tests make parts small."""

    parts: int = PARTS
    min_part_size: int = MIN_PART_SIZE
    parallel: int = PARALLEL
    retries: int = RETRIES


def part_bounds(size: int, settings: PullSettings) -> list[tuple[int, int]]:
    """``[start, end)`` of each part of a blob of ``size`` bytes."""
    if size <= 0:
        return [(0, 0)]
    part = max(settings.min_part_size, -(-size // max(1, settings.parts)))
    return [(start, min(size, start + part)) for start in range(0, size, part)]


class _Job:
    def __init__(self) -> None:
        self.completed = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.completed += n


class Downloads:
    """The blob downloads in progress in this server: a second pull of a blob waits on the first's download and
    reports its progress instead of fetching it again."""

    def __init__(self, settings: PullSettings | None = None):
        self.settings = settings or PullSettings()
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def fetch(self, store: BlobStore, client: RegistryClient, layer: Layer, report: Callable[[int], None]) -> None:
        """Have every part of ``layer``'s blob on disk, calling ``report(bytes so far)`` as they come."""
        with self._lock:
            job = self._jobs.get(layer.digest)
            if job is None:
                job = self._jobs[layer.digest] = _Job()
                threading.Thread(target=self._run, args=(job, store, client, layer), name="tandem-pull-blob",
                                 daemon=True).start()
        while not job.done.wait(REPORT_EVERY):
            report(job.completed)
        if job.error is not None:
            if isinstance(job.error, RegistryError):
                raise RegistryError(str(job.error), job.error.status)
            raise job.error
        report(layer.size)

    def commit(self, store: BlobStore, layer: Layer) -> None:
        """Store ``layer``'s blob from its fetched parts (verified: its sha256 must be its digest), and remove them."""
        folder = _parts_dir(store, layer.digest)
        with _exclusive(folder):
            if store.has_blob(layer.digest):  # another pull of it committed first
                shutil.rmtree(folder, ignore_errors=True)
                return
            paths = _part_paths(folder, part_bounds(layer.size, self.settings))
            try:
                store.write_blob(_concatenated(paths), expected_digest=layer.digest)
            except DigestMismatchError as e:
                raise RegistryError(f"digest mismatch, file must be downloaded again: want {e.expected}, got {e.got}") \
                    from None
            except FileNotFoundError:  # parts removed under it (another pull's failed commit): fetch again
                raise RegistryError(f"pull {layer.digest[7:19]}: the downloaded parts went missing; pull again") \
                    from None
            finally:
                shutil.rmtree(folder, ignore_errors=True)  # stored, or never to verify: the parts go

    def discard(self, store: BlobStore, layer: Layer) -> None:
        """Remove the fetched parts of ``layer``'s blob (a pull that cannot complete leaves nothing)."""
        folder = _parts_dir(store, layer.digest)
        with _exclusive(folder):
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, job: _Job, store: BlobStore, client: RegistryClient, layer: Layer) -> None:
        try:
            _download(store, client, layer, job, self.settings)
        except BaseException as e:  # handed to every puller waiting on it
            job.error = e
        finally:
            with self._lock:
                self._jobs.pop(layer.digest, None)
            job.done.set()


def _parts_dir(store: BlobStore, digest: str) -> Path:
    return store.root / "downloads" / digest.replace(":", "-")


def _part_paths(folder: Path, bounds: list[tuple[int, int]]) -> list[Path]:
    return [folder / f"part-{i}" for i in range(len(bounds))]


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Hold the flock of ``folder``'s lock file, beside it (another process pulling the same blob waits here); the
    lock file goes with the holder that removes it, so a waiter that got the lock of a removed file takes the new
    one."""
    path = folder.parent / (folder.name + ".lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:
            break
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        os.close(fd)


def _download(store: BlobStore, client: RegistryClient, layer: Layer, job: _Job, settings: PullSettings) -> None:
    folder = _parts_dir(store, layer.digest)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder):
        if store.has_blob(layer.digest):  # another process finished it while this one waited
            return
        folder.mkdir(exist_ok=True)
        bounds = part_bounds(layer.size, settings)
        paths = _part_paths(folder, bounds)
        job.add(sum(min(_size(p), end - start) for p, (start, end) in zip(paths, bounds)))
        with ThreadPoolExecutor(max(1, settings.parallel), thread_name_prefix="tandem-pull-part") as pool:
            for done in [pool.submit(_part, client, layer.digest, p, start, end, job, settings.retries)
                         for p, (start, end) in zip(paths, bounds)]:
                done.result()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _part(client: RegistryClient, digest: str, path: Path, start: int, end: int, job: _Job, retries: int) -> None:
    """Append the bytes of ``[start, end)`` missing from ``path``; a dropped connection is read again from where it
    stopped, up to ``retries`` times."""
    want = end - start
    path.touch()  # an empty blob's one part is a file too
    for attempt in range(retries + 1):
        have = _size(path)
        if have > want:  # never written by tandem: start the part again
            os.truncate(path, 0)
            job.add(-have)
            have = 0
        if have == want:
            return
        try:
            with client.blob_range(digest, start + have, end) as r, open(path, "ab") as f:
                for chunk in r.iter_bytes():  # as received: a chunker would drop what it held at a cut
                    chunk = chunk[:want - have]
                    f.write(chunk)
                    have += len(chunk)
                    job.add(len(chunk))
                    if have == want:
                        break
        except (httpx.HTTPError, httpx.StreamError, OSError):
            time.sleep(min(2.0, 0.2 * (attempt + 1)))
    if _size(path) != want:
        raise RegistryError(f"pull {digest[7:19]}: the registry dropped the connection {retries + 1} times")


def _concatenated(paths: list[Path]) -> Iterator[bytes]:
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                yield chunk
