"""Content-addressed blob store and manifest directory, laid out exactly like Ollama's.

    <root>/blobs/sha256-<hex>                      blob contents
    <root>/manifests/<host>/<ns>/<model>/<tag>      Docker v2 manifest JSON

Newer Ollama releases may also keep named manifests under <root>/manifests-v2 (symlinks
to manifest blobs, public host spelled 'ollama.com'). Those are read and, crucially,
counted as references so garbage collection never deletes blobs they need; tandem
itself always writes the classic layout.

Crash and concurrency safety rest on three rules:
  * every file is written to a temp name in its final directory, fsynced, then
    os.replace()d into place, so readers see either nothing or complete content;
  * temp blobs are named 'sha256-<hex>-partial-<random>', which can never match the
    blob pattern, and their writer holds a flock on them for as long as it lives (the
    kernel drops a flock when the last descriptor closes, so when the writer dies), so
    remove_dead_partials() - run by prune(), by every new blob write and by the CLI's
    list and create - removes exactly the leftovers of dead writers, never a file a live
    writer in any process is still writing;
  * manifest writes take a shared flock on the manifests directory and delete/prune an
    exclusive one, so a manifest is never written referencing a blob that garbage
    collection is removing at the same moment.
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from .manifest import (
    MEDIA_TYPE_MANIFEST,
    MEDIA_TYPE_MANIFEST_LIST,
    InvalidManifestError,
    Manifest,
    marshal_json,
)
from .names import DEFAULT_HOST, BlobsError, InvalidNameError, ModelName, fold

try:  # flock is what lets separate processes cooperate; without it only threads do
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

__all__ = [
    "BlobStore",
    "ModelEntry",
    "BlobNotFoundError",
    "DigestMismatchError",
    "CorruptBlobError",
    "ModelNotFoundError",
    "InvalidDigestError",
    "NoSpaceError",
    "NotRegularFileError",
    "parse_digest",
    "default_models_root",
]

_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_BLOB_NAME_RE = re.compile(r"sha256-[0-9a-fA-F]{64}")
_MANIFEST_TMP_PREFIX = ".tandem-tmp-"
_PUBLIC_HOSTS = ("registry.ollama.ai", "ollama.com")
_V2_HOST = "ollama.com"
_CHUNK = 1 << 20
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# The sets recording the blobs this thread's writes newly created (see BlobStore.recording_new_blobs).
_RECORDERS: contextvars.ContextVar[tuple[set[str], ...]] = contextvars.ContextVar("tandem_blob_recorders", default=())


# --- errors -------------------------------------------------------------------------------


class InvalidDigestError(BlobsError, ValueError):
    def __init__(self, message: str = "invalid digest format") -> None:
        super().__init__(message)


class BlobNotFoundError(BlobsError, FileNotFoundError):
    def __init__(self, digest: str) -> None:
        self.digest = digest
        super().__init__(f'blob "{digest}" not found')

    def __str__(self) -> str:  # FileNotFoundError would render "[Errno ...]" otherwise
        return self.args[0]


class DigestMismatchError(BlobsError, ValueError):
    def __init__(self, expected: str, got: str) -> None:
        self.expected, self.got = expected, got
        super().__init__(f'digest mismatch, expected "{expected}", got "{got}"')


class CorruptBlobError(BlobsError):
    def __init__(self, digest: str, actual: str) -> None:
        self.digest, self.actual = digest, actual
        super().__init__(f'blob "{digest}" is corrupt: its content hashes to "{actual}"')


class NoSpaceError(BlobsError, OSError):
    """The disk (or quota) is full. Its text is the one a client sees: no path, no errno number."""

    def __init__(self) -> None:
        super().__init__(errno.ENOSPC, "no space left on device")

    def __str__(self) -> str:
        return "no space left on device"


class NotRegularFileError(BlobsError, OSError):
    """add_file was given a FIFO, a device or a directory: reading one could block or never end."""

    def __init__(self) -> None:
        super().__init__(errno.EINVAL, "not a regular file")

    def __str__(self) -> str:
        return "not a regular file"


class ModelNotFoundError(BlobsError, LookupError):
    def __init__(self, name: "str | ModelName") -> None:
        self.name = name if isinstance(name, str) else name.display()
        super().__init__(f"model '{self.name}' not found")

    def __str__(self) -> str:  # LookupError's str() would quote args
        return self.args[0]


# --- helpers ------------------------------------------------------------------------------


def parse_digest(digest: str) -> str:
    """Validate a digest in 'sha256:<hex>' or 'sha256-<hex>' form; return canonical 'sha256:<lowerhex>'."""
    m = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise InvalidDigestError()
    return "sha256:" + m.group(1).lower()


def default_models_root() -> Path:
    """$TANDEM_MODELS (trimmed of spaces and quotes, as Ollama's envconfig does) or ~/.tandem/models."""
    value = os.environ.get("TANDEM_MODELS", "").strip().strip("\"'")
    if value:
        return Path(value)
    return Path.home() / ".tandem" / "models"


def _sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _iter_chunks(data: Any) -> Iterator[bytes]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        for off in range(0, len(view), _CHUNK):
            yield view[off : off + _CHUNK]
        return
    if isinstance(data, str):
        raise TypeError("write_blob needs bytes, a binary file object or an iterable of bytes, not str")
    read = getattr(data, "read", None)
    if read is not None:
        while True:
            chunk = read(_CHUNK)
            if not chunk:
                return
            if isinstance(chunk, str):
                raise TypeError("write_blob needs a binary file object, got a text one")
            yield chunk
        return
    for chunk in data:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"write_blob iterable yielded {type(chunk).__name__}, expected bytes")
        if chunk:
            yield chunk


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not possible on every platform/filesystem.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Partial:
    """A temp file in the destination directory, flock-ed for as long as its writer lives.

    The lock is what tells prune() that the file is still being written; a killed
    writer's lock disappears with its process.
    """

    def __init__(self, directory: Path, prefix: str) -> None:
        while True:
            fd, path = tempfile.mkstemp(prefix=prefix, dir=directory)
            if fcntl is None:
                break
            fcntl.flock(fd, fcntl.LOCK_EX)
            # prune() may have grabbed and unlinked the file between mkstemp and flock.
            try:
                same = os.path.samestat(os.stat(path), os.fstat(fd))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.path = Path(path)
        self.file = open(fd, "wb")
        self._done = False

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)

    def commit(self, final: Path, mode: int = 0o644) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        os.chmod(self.path, mode)
        if fcntl is None:  # Windows can't rename an open file
            self.file.close()
        # Renamed while still locked so prune() can never see a finished-but-unrenamed file as dead.
        os.replace(self.path, final)
        self._done = True
        self.file.close()
        _fsync_dir(final.parent)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self.file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "_Partial":
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def _remove_if_abandoned(path: Path) -> bool:
    """Unlink a temp file unless a live writer still holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            try:
                os.unlink(path)
                return True
            except OSError as e:
                log.warning("could not remove %s: %s", path, e)
                return False
    finally:
        os.close(fd)
    try:
        os.unlink(path)
        return True
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)
        return False


def _find_casefold(base: Path, parts: tuple[str, ...]) -> Path | None:
    """Find base/parts... as a file, matching each part case-insensitively, exact spelling first."""
    if not parts:
        return base if base.is_file() else None
    head, rest = parts[0], parts[1:]
    candidates = [head]
    try:
        with os.scandir(base) as it:
            candidates += sorted(e.name for e in it if e.name != head and fold(e.name) == fold(head))
    except OSError:
        return None
    for cand in candidates:
        found = _find_casefold(base / cand, rest)
        if found is not None:
            return found
    return None


@dataclass
class ModelEntry:
    name: ModelName
    manifest: Manifest
    modified_at: datetime
    digest: str  # hex sha256 of the manifest file bytes, no prefix
    size: int  # sum of config + layer sizes


@dataclass
class _Ref:
    """A named manifest found on disk."""

    path: Path
    name: ModelName  # logical name, in on-disk spelling
    v2: bool


# --- the store ----------------------------------------------------------------------------


class BlobStore:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_models_root()
        # Only used where flock is unavailable; per instance, like everything else.
        self._thread_lock = threading.RLock()

    def __repr__(self) -> str:
        return f"BlobStore({str(self.root)!r})"

    # paths

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests"

    @property
    def manifests_v2_dir(self) -> Path:
        return self.root / "manifests-v2"

    def blob_path(self, digest: str) -> Path:
        return self.blobs_dir / parse_digest(digest).replace(":", "-", 1)

    def manifest_path(self, name: ModelName | str) -> Path:
        """Where tandem writes the manifest for ``name`` (classic layout, exact spelling)."""
        return self.root / ModelName.parse(name).manifest_relpath()

    # blobs

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def write_blob(
        self,
        data: bytes | BinaryIO | Iterable[bytes],
        expected_digest: str | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[str, int]:
        """Store a blob; return ('sha256:<hex>', size). ``progress`` gets the cumulative byte count."""
        expected = parse_digest(expected_digest) if expected_digest is not None else None
        chunks = _iter_chunks(data)
        h = hashlib.sha256()
        size = 0

        if expected is not None and self.has_blob(expected):
            # Nothing to write, but the caller still learns whether its data was right.
            for chunk in chunks:
                h.update(chunk)
                size += len(chunk)
                if progress:
                    progress(size)
            got = "sha256:" + h.hexdigest()
            if got != expected:
                raise DigestMismatchError(expected, got)
            return expected, size

        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.remove_dead_partials()  # the next writer cleans up after a killed one
        prefix = (expected.replace(":", "-") if expected else "sha256") + "-partial-"
        try:
            with _Partial(self.blobs_dir, prefix) as part:
                for chunk in chunks:
                    h.update(chunk)
                    part.write(chunk)
                    size += len(chunk)
                    if progress:
                        progress(size)
                got = "sha256:" + h.hexdigest()
                if expected is not None and got != expected:
                    raise DigestMismatchError(expected, got)
                final = self.blob_path(got)
                if not final.exists():  # an existing blob is left untouched (open readers, mtime)
                    part.commit(final)
                    for recorder in _RECORDERS.get():
                        recorder.add(got)
        except OSError as e:
            # The partial file is gone (the with block aborted it); the caller learns why in plain words.
            if e.errno in _NO_SPACE and not isinstance(e, BlobsError):
                raise NoSpaceError() from None
            raise
        return got, size

    def add_file(self, path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None) -> tuple[str, int]:
        """Copy a local file into the store. Never a hard link: the user may edit the source later.

        Only a regular file is read (NotRegularFileError otherwise): opened non-blocking and checked on the
        open descriptor, so a FIFO cannot block and /dev/zero cannot fill the disk, even if the path was
        swapped after a caller's own check."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFileError()
            os.set_blocking(fd, True)
            f = open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            return self.write_blob(f, progress=progress)

    @contextmanager
    def recording_new_blobs(self) -> Iterator[set[str]]:
        """Collect the digests of the blobs this thread's writes create (not those that already existed),
        so that a failed create can remove exactly what it added (discard_unreferenced). Nests."""
        written: set[str] = set()
        token = _RECORDERS.set(_RECORDERS.get() + (written,))
        try:
            yield written
        finally:
            _RECORDERS.reset(token)

    def discard_unreferenced(self, digests: Iterable[str]) -> list[str]:
        """Remove those of ``digests`` no manifest references (a failed create's own blobs), at once."""
        digests = list(digests)
        if not digests:
            return []
        with self._lock(exclusive=True):
            return self._remove_unreferenced(digests)

    def remove_dead_partials(self) -> list[str]:
        """Remove the partial blob files of dead writers; return their names.

        The rule: a partial file is removed only when its flock can be taken, i.e. no process holds it, i.e.
        its writer has exited (the kernel releases a flock with the writer's last descriptor). A live
        writer in this or any other process keeps its file. Without flock (Windows) nothing is removed here,
        since liveness cannot be told; prune() at serve start still runs."""
        if fcntl is None:  # pragma: no cover - Windows
            return []
        removed = self._remove_partials()
        if removed:
            log.info("removed %d partial blob file(s) of dead writers", len(removed))
        return removed

    def _remove_partials(self) -> list[str]:
        removed: list[str] = []
        try:
            with os.scandir(self.blobs_dir) as it:
                entries = [e for e in it if e.name.startswith("sha256-") and not _BLOB_NAME_RE.fullmatch(e.name)]
        except OSError:  # no blobs directory yet, or not ours to read
            return removed
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False) and _remove_if_abandoned(Path(e.path)):
                    removed.append(e.name)
            except OSError:
                continue
        return removed

    def add_json_blob(self, obj: Any, *, sort_keys: bool = False, newline: bool = False) -> tuple[str, int]:
        """Store ``obj`` encoded as Go's json.Marshal would (see manifest.marshal_json)."""
        return self.write_blob(marshal_json(obj, sort_keys=sort_keys, newline=newline))

    def open_blob(self, digest: str) -> BinaryIO:
        canonical = parse_digest(digest)
        try:
            return open(self.blob_path(canonical), "rb")
        except (FileNotFoundError, IsADirectoryError):
            raise BlobNotFoundError(canonical) from None

    def read_blob(self, digest: str) -> bytes:
        with self.open_blob(digest) as f:
            return f.read()

    def verify_blob(self, digest: str) -> None:
        canonical = parse_digest(digest)
        h = hashlib.sha256()
        with self.open_blob(canonical) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        actual = "sha256:" + h.hexdigest()
        if actual != canonical:
            raise CorruptBlobError(canonical, actual)

    def list_blobs(self) -> list[str]:
        """Digests of all complete blobs on disk."""
        try:
            with os.scandir(self.blobs_dir) as it:
                return sorted(parse_digest(e.name) for e in it if _BLOB_NAME_RE.fullmatch(e.name) and e.is_file())
        except FileNotFoundError:
            return []

    # locking

    @contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover - Windows
            with self._thread_lock:
                yield
            return
        self.manifests_dir.mkdir(parents=True, exist_ok=True)
        # A directory fd can be flock-ed, so no lock file needs to exist in an Ollama store.
        fd = os.open(self.manifests_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    # manifests: lookup

    def _locate(self, name: ModelName) -> list[_Ref]:
        """Every on-disk manifest for ``name``, preferred first (v2 before classic, as Ollama reads)."""
        hosts = [name.host]
        if fold(name.host) in _PUBLIC_HOSTS:
            hosts += [h for h in _PUBLIC_HOSTS if h != fold(name.host)]
        refs: list[_Ref] = []
        for base, v2 in ((self.manifests_v2_dir, True), (self.manifests_dir, False)):
            for host in hosts:
                p = _find_casefold(base, (host, name.namespace, name.model, name.tag))
                if p is None:
                    continue
                ref = self._ref_for(p, base, v2)
                if ref is not None and all(r.path != ref.path for r in refs):
                    refs.append(ref)
        return refs

    @staticmethod
    def _ref_for(path: Path, base: Path, v2: bool) -> _Ref | None:
        parts = path.relative_to(base).parts
        if len(parts) != 4:
            return None
        host, ns, model, tag = parts
        if v2 and fold(host) in _PUBLIC_HOSTS:
            host = DEFAULT_HOST  # Ollama's normalizeLogicalName: one identity for the public registry
        try:
            return _Ref(path, ModelName(host, ns, model, tag), v2)
        except InvalidNameError:
            return None

    def _require(self, name: ModelName | str) -> tuple[ModelName, list[_Ref]]:
        parsed = ModelName.parse(name)
        refs = self._locate(parsed)
        if not refs:
            raise ModelNotFoundError(name)
        return parsed, refs

    def _walk_manifests(self, dedupe: bool = True) -> Iterator[_Ref]:
        """All named manifests; with ``dedupe`` one per model (v2 wins over classic, case-insensitively).

        Garbage collection walks without ``dedupe``: a shadowed twin still pins its blobs,
        because it becomes visible again once the twin that shadows it is deleted.
        """
        seen: set[tuple[str, ...]] = set()
        for base, v2 in ((self.manifests_v2_dir, True), (self.manifests_dir, False)):
            for path in sorted(self._files_at_depth(base, 4)):
                ref = self._ref_for(path, base, v2)
                if ref is None:
                    if not path.name.startswith(_MANIFEST_TMP_PREFIX):
                        log.debug("ignoring %s: not a valid model name", path)
                    continue
                key = ref.name.fold_key()
                if dedupe and key in seen:
                    continue
                seen.add(key)
                yield ref

    @staticmethod
    def _files_at_depth(base: Path, depth: int) -> Iterator[Path]:
        try:
            with os.scandir(base) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        for e in entries:
            try:
                if depth == 1:
                    if e.is_file():  # follows symlinks: v2 manifests are links to blobs
                        yield Path(e.path)
                elif e.is_dir(follow_symlinks=False):
                    yield from BlobStore._files_at_depth(Path(e.path), depth - 1)
            except OSError:
                continue

    # manifests: parsing

    def _parse_manifest_bytes(self, data: bytes) -> Manifest:
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidManifestError(f"invalid manifest JSON: {e}") from e
        if isinstance(obj, dict) and obj.get("mediaType") == MEDIA_TYPE_MANIFEST_LIST:
            return self._select_child(obj)
        return Manifest.from_dict(obj)

    def _list_children(self, obj: dict) -> list[tuple[str | None, dict]]:
        """(child manifest digest if stored as a blob, child object) for a manifest list."""
        children = obj.get("manifests") or []
        if not isinstance(children, list):
            raise InvalidManifestError("manifest list 'manifests' must be an array")
        out: list[tuple[str | None, dict]] = []
        for child in children:
            if not isinstance(child, dict):
                raise InvalidManifestError("manifest list entry must be an object")
            if child.get("mediaType") == MEDIA_TYPE_MANIFEST_LIST:
                raise InvalidManifestError("nested manifest lists are not supported")
            ref = child.get("digest")
            if ref and not child.get("layers") and not (child.get("config") or {}).get("digest"):
                digest = parse_digest(ref)
                resolved = json.loads(self.read_blob(digest))
                if not isinstance(resolved, dict):
                    raise InvalidManifestError(f"manifest blob {digest} is not an object")
                for key in ("runner", "format"):
                    resolved.setdefault(key, child.get(key))
                out.append((digest, resolved))
            else:
                out.append((None, child))
        return out

    def _select_child(self, obj: dict) -> Manifest:
        # GGUF-backed runners first: that is what tandem loads; MLX safetensors last.
        children = [c for _, c in self._list_children(obj) if c.get("mediaType") in (None, "", MEDIA_TYPE_MANIFEST)]
        for runner in ("ollama", "llamacpp", "mlx"):
            for child in children:
                if fold(str(child.get("runner") or "")) == runner:
                    return Manifest.from_dict(child)
        if children:
            return Manifest.from_dict(children[0])
        raise InvalidManifestError("no compatible manifest found")

    def _referenced_by(self, data: bytes) -> set[str]:
        """Blob digests a manifest file keeps alive, including its own (v2 manifests are blobs)."""
        digests = {_sha256_bytes(data)}
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidManifestError(f"invalid manifest JSON: {e}") from e
        if isinstance(obj, dict) and obj.get("mediaType") == MEDIA_TYPE_MANIFEST_LIST:
            manifests = []
            for child_digest, child in self._list_children(obj):
                child_manifest = Manifest.from_dict(child)
                if not child_digest:
                    # Ollama keeps inline children as blobs named by their canonical json.Marshal form.
                    child_digest = _sha256_bytes(marshal_json(child_manifest.to_dict()))
                digests.add(child_digest)
                manifests.append(child_manifest)
        else:
            manifests = [Manifest.from_dict(obj)]
        for m in manifests:
            for layer in m.all_layers():
                digests.add(parse_digest(layer.digest))
        return digests

    def _scan_references(self) -> tuple[set[str], list[Path]]:
        """Digests referenced by all manifests, and the manifests that could not be read."""
        refs: set[str] = set()
        bad: list[Path] = []
        for ref in self._walk_manifests(dedupe=False):
            try:
                data = ref.path.read_bytes()
                if not data.strip():
                    continue  # an empty file references nothing (e.g. a crash during a non-atomic write)
                refs |= self._referenced_by(data)
            except (OSError, BlobsError, ValueError) as e:
                log.warning("bad manifest %s: %s", ref.path, e)
                bad.append(ref.path)
        return refs, bad

    # manifests: public API

    def resolve(self, name: ModelName | str) -> ModelName:
        return self._require(name)[1][0].name

    def read_manifest(self, name: ModelName | str) -> Manifest:
        _, refs = self._require(name)
        try:
            data = refs[0].path.read_bytes()
        except FileNotFoundError:  # deleted since we looked
            raise ModelNotFoundError(name) from None
        return self._parse_manifest_bytes(data)

    def read_manifest_bytes(self, name: ModelName | str) -> bytes:
        _, refs = self._require(name)
        try:
            return refs[0].path.read_bytes()
        except FileNotFoundError:
            raise ModelNotFoundError(name) from None

    def _entry_for(self, ref: _Ref) -> ModelEntry:
        data = ref.path.read_bytes()
        st = ref.path.stat()
        manifest = self._parse_manifest_bytes(data)
        return ModelEntry(
            name=ref.name,
            manifest=manifest,
            # Local time with offset, like Ollama's modified_at.
            modified_at=datetime.fromtimestamp(st.st_mtime).astimezone(),
            digest=hashlib.sha256(data).hexdigest(),
            size=manifest.size,
        )

    def entry(self, name: ModelName | str) -> ModelEntry:
        _, refs = self._require(name)
        try:
            return self._entry_for(refs[0])
        except FileNotFoundError:
            raise ModelNotFoundError(name) from None

    def list_models(self) -> list[ModelEntry]:
        """All readable models, most recently modified first (the order /api/tags uses)."""
        entries = []
        for ref in self._walk_manifests():
            try:
                entries.append(self._entry_for(ref))
            except (OSError, BlobsError, ValueError) as e:
                log.warning("skipping manifest %s: %s", ref.path, e)
        entries.sort(key=lambda e: (-e.modified_at.timestamp(), str(e.name)))
        return entries

    def _write_manifest_bytes(self, name: ModelName, data: bytes) -> None:
        refs = self._locate(name)
        classic = next((r for r in refs if not r.v2), None)
        # Reuse an existing differently-cased spelling so 'Foo' and 'foo' never coexist.
        target = classic.path if classic else self.manifest_path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _Partial(target.parent, _MANIFEST_TMP_PREFIX) as part:
            part.write(data)
            part.commit(target)
        # A newer Ollama reads manifests-v2 first; drop its copy so this write is what both see.
        for r in refs:
            if r.v2:
                self._unlink_manifest(r.path, self.manifests_v2_dir)

    def write_manifest(self, name: ModelName | str, manifest: Manifest) -> None:
        self.write_manifest_bytes(name, manifest.to_json(), manifest)

    def write_manifest_bytes(self, name: ModelName | str, data: bytes, manifest: Manifest | None = None) -> None:
        """Write ``data`` as ``name``'s manifest, byte for byte (a pulled manifest keeps the registry's bytes, so the
        model keeps its digest), once every blob it names is in the store."""
        name = ModelName.parse(name)
        manifest = manifest or Manifest.from_json(data)
        with self._lock(exclusive=False):
            for layer in manifest.all_layers():
                if not self.has_blob(layer.digest):
                    raise BlobNotFoundError(parse_digest(layer.digest))
            self._write_manifest_bytes(name, data)

    def copy(self, src: ModelName | str, dst: ModelName | str) -> None:
        """Point ``dst`` at the same manifest bytes as ``src`` (so the same digest); blobs are shared."""
        dst_name = ModelName.parse(dst)
        with self._lock(exclusive=False):
            src_name, refs = self._require(src)
            if src_name.equal_fold(dst_name) or refs[0].name.equal_fold(dst_name):
                return
            try:
                data = refs[0].path.read_bytes()
            except FileNotFoundError:
                raise ModelNotFoundError(src) from None
            self._write_manifest_bytes(dst_name, data)

    def _unlink_manifest(self, path: Path, base: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        parent = path.parent
        while parent != base and base in parent.parents:
            try:
                parent.rmdir()
            except OSError:  # not empty (or gone): stop climbing
                break
            parent = parent.parent

    def delete(self, name: ModelName | str) -> list[str]:
        """Remove a model and every blob no remaining manifest references; return removed digests."""
        with self._lock(exclusive=True):
            _, refs = self._require(name)
            candidates: set[str] = set()
            for ref in refs:
                try:
                    candidates |= self._referenced_by(ref.path.read_bytes())
                except (OSError, BlobsError, ValueError) as e:
                    log.warning("deleting unreadable manifest %s: %s", ref.path, e)
            for ref in refs:
                self._unlink_manifest(ref.path, self.manifests_v2_dir if ref.v2 else self.manifests_dir)
            return self._remove_unreferenced(candidates)

    def _remove_unreferenced(self, candidates: Iterable[str] | None) -> list[str]:
        """Remove candidate blobs (all blobs if None) that no manifest references. Caller holds the exclusive lock."""
        referenced, bad = self._scan_references()
        if bad:
            # An unreadable manifest might reference anything; deleting would risk its blobs.
            log.warning("not removing blobs: %d unreadable manifest(s), e.g. %s", len(bad), bad[0])
            return []
        pool = self.list_blobs() if candidates is None else sorted(candidates)
        removed = []
        for digest in pool:
            if digest in referenced:
                continue
            try:
                self.blob_path(digest).unlink()
                removed.append(digest)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("could not remove blob %s: %s", digest, e)
            self._remove_derived(digest)
        return removed

    # Files an engine derives from a blob and keeps beside the store (engine.ops.pack_cache's packed weight
    # layouts): ``<root>/packed/<first 16 hex digits of the digest>-*``, removed with their blob.
    DERIVED_DIR = "packed"

    def _remove_derived(self, digest: str) -> None:
        prefix = digest.split(":", 1)[-1][:16] + "-"
        directory = self.root / self.DERIVED_DIR
        if not directory.is_dir():
            return
        for path in directory.glob(prefix + "*"):
            try:
                path.unlink()
            except OSError as e:
                log.warning("could not remove %s: %s", path, e)

    def referenced_digests(self) -> set[str]:
        """'sha256:<hex>' digests of every blob some readable manifest references."""
        return self._scan_references()[0]

    def prune(self) -> list[str]:
        """Remove unreferenced blobs, abandoned temp files and empty manifest directories.

        Returns the removed blobs' digests ('sha256:<hex>') followed by the removed temp
        files' names (which contain no ':'). Temp files still being written are kept.
        """
        with self._lock(exclusive=True):
            removed_tmp: list[str] = []
            removed_tmp += self._remove_partials()  # at serve start even without flock: no writer yet
            for base in (self.manifests_dir, self.manifests_v2_dir):
                removed_tmp += self._prune_manifest_tree(base)
            return self._remove_unreferenced(None) + sorted(removed_tmp)

    def _prune_manifest_tree(self, base: Path) -> list[str]:
        removed: list[str] = []
        if not base.is_dir():
            return removed
        for dirpath, dirnames, filenames in os.walk(base, topdown=False):
            for fn in filenames:
                if fn.startswith(_MANIFEST_TMP_PREFIX) and _remove_if_abandoned(Path(dirpath, fn)):
                    removed.append(fn)
            if Path(dirpath) != base:
                try:
                    os.rmdir(dirpath)  # only succeeds when empty
                except OSError:
                    pass
        return removed
