"""Packed kernel layouts kept beside the model store, so a model's next load maps them instead of repacking.

Building the qdot layout (every weight's integer codes re-ordered for the kernel, its group scales
converted) is most of a quantized model's load: about 4 of the 4.8 s the 1.5B Q4_K_M takes. The result
depends only on the GGUF's bytes, the format and the layout code, so it is saved once, after a load that
had to build it, as one file per (source, format), and memory-mapped by later loads: the tensors are
views of the file's pages, read on first use, never copied.

A cache file names what it was built from (``identity``: the source's digest, or its path, size and
mtime outside the store; the format; ``LAYOUT_VERSION``; torch's version). One that does not match, cannot
be read, or holds an entry of the wrong shape is ignored and rebuilt; writes go to a temporary file
renamed into place, so a crash never leaves a half-written cache under the real name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path

import torch

from engine.ops.memory import advise_file_mappings, recache_in_huge_folios

log = logging.getLogger("tandem.engine")

# Bump whenever engine.ops.linear's qdot packing (pack_codes, pack_group_values) or the kernel's
# reading of it changes: every older cache file then stops matching and is rebuilt.
LAYOUT_VERSION = 3  # 2: K-quants keep their 8-bit scale codes and f16 super-block factors; 3: 5-bit planes
STALE_TEMP_SECONDS = 3600  # a temp file this old belongs to a writer that died

_DIGEST = re.compile(r"sha256-([0-9a-f]{64})$")


def source_identity(path: str | os.PathLike) -> str:
    """A store blob is named by its content digest; any other file by its real path, size and mtime."""
    m = _DIGEST.search(os.path.basename(os.fspath(path)))
    if m:
        return "sha256:" + m.group(1)
    st = os.stat(path)
    return f"file:{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


class PackCache:
    """The packed tensors of one GGUF in one format: ``get`` what an earlier load saved, ``put`` what this
    load built; ``save`` writes the file when anything had to be built."""

    def __init__(self, directory: str | os.PathLike, source: str | os.PathLike, fmt: str):
        self.directory = Path(directory)
        self.identity = {"layout": LAYOUT_VERSION, "source": source_identity(source), "format": fmt,
                         "torch": str(torch.__version__)}
        digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()[:24]
        # a store blob's files start with 16 digits of its digest: blobs.BlobStore removes them with it
        prefix = self.identity["source"].split(":", 1)[1][:16] if self.identity["source"].startswith("sha256:") \
            else "file"
        self.path = self.directory / f"{prefix}-{fmt}-{digest}.pt"
        self._entries: dict[str, dict[str, torch.Tensor]] = {}
        self._built: dict[str, dict[str, torch.Tensor]] = {}
        self.hits = self.misses = 0
        self._writer: threading.Thread | None = None
        self._open()

    def _open(self) -> None:
        try:
            data = torch.load(self.path, mmap=True, weights_only=True)
        except FileNotFoundError:
            return
        except Exception as e:  # unreadable: rebuilt by this load
            log.warning("packed-weight cache %s is unreadable (%s); rebuilding it", self.path, e)
            return
        if not isinstance(data, dict) or data.get("identity") != self.identity or \
                not isinstance(data.get("entries"), dict):
            log.warning("packed-weight cache %s does not match its source; rebuilding it", self.path)
            return
        self._entries = data["entries"]
        advise_file_mappings(self.path)  # pages read back after an eviction come in 2 MB folios

    def get(self, key: str, specs: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor] | None:
        """The tensors saved under ``key``, if each has the shape and dtype the caller expects."""
        entry = self._entries.get(key)
        if entry is not None and set(entry) >= set(specs) and \
                all(tuple(entry[name].shape) == tuple(shape) and entry[name].dtype == dtype
                    for name, (shape, dtype) in specs.items()):
            self.hits += 1
            self._built[key] = entry
            return entry
        self.misses += 1
        return None

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        self._built[key] = tensors

    def save(self, background: bool = False) -> None:
        """Write every entry this load used, if any had to be built (atomically: temp file, then rename).

        ``background``: in a thread of its own, so the load it follows is not slowed by the write (about
        2.5 s for the 1.5B's 1 GB); the thread is not a daemon, so an engine that exits normally finishes
        it first. A killed one leaves at most a temp file, removed by a later save."""
        self.wait()
        if not self.misses:
            return
        entries, self.misses = dict(self._built), 0
        if background:
            self._writer = threading.Thread(target=self._write, args=(entries,), name="tandem-pack-cache")
            self._writer.start()
        else:
            self._write(entries)

    def wait(self, timeout: float | None = None) -> bool:
        """Until a background save has finished, or ``timeout`` seconds; True when none is running."""
        if self._writer is not None:
            self._writer.join(timeout)
            if self._writer.is_alive():
                return False
            self._writer = None
        return True

    def _write(self, entries: dict[str, dict[str, torch.Tensor]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in self.directory.glob(".pack-*.tmp"):  # left by an engine killed mid-write
            try:
                if time.time() - old.stat().st_mtime > STALE_TEMP_SECONDS:
                    old.unlink()
            except OSError:
                pass
        fd, tmp = tempfile.mkstemp(prefix=".pack-", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save({"identity": self.identity, "entries": entries}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if not isinstance(e, OSError):
                raise
            log.warning("could not write the packed-weight cache %s: %s", self.path, e)
            return
        try:
            recache_in_huge_folios(self.path)  # later loads map it in 2 MB pages
        except OSError as e:  # a cache in small pages still works
            log.debug("could not re-read %s in 2 MB folios: %s", self.path, e)
