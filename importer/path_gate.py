"""Which server-local files a create over HTTP may read: only regular files under the operator's directories.

A create request that names paths (the old `{"modelfile", "path"}` form) would otherwise let any local process,
or any web page from an allowed origin, copy any file the server can read into the store (where it is 0644 and
served back by digest), and tell from the error text whether a path exists. Files reach a server as blobs
(`/api/blobs` + `files`); a path is read only when it resolves (symlinks followed first) under a directory the
operator listed, is a regular file, and so is every file of a directory it names. Every refusal reads the same,
whether the path is missing, unreadable, outside, a FIFO or a device, so the answer reveals nothing about it.

The CLI working on its own store reads the user's files without a gate: that is the user reading their files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

from .request import CreateError


class PathGate:
    """The allow-list (resolved directories) an HTTP create's local paths are held to. Empty: none allowed."""

    def __init__(self, roots: Iterable[str | os.PathLike[str]]) -> None:
        self.roots = tuple(Path(os.path.realpath(r)) for r in roots if str(r))

    def refusal(self, role: str, value: str) -> CreateError:
        """The one answer for every path that may not be read, naming only what the client itself sent."""
        return CreateError(f"{role} {value}: local paths are not readable through the API; upload the files "
                           "with /api/blobs and name them in 'files' (or the operator lists the directory in "
                           "TANDEM_CREATE_PATHS)", status=400)

    def allows(self, path: Path) -> bool:
        """Whether ``path``, symlinks resolved, lies under an allowed directory (it need not exist)."""
        try:
            real = Path(os.path.realpath(path))
        except (ValueError, OSError):  # a NUL byte, a symlink loop: not a path anything may read
            return False
        return any(real == root or root in real.parents for root in self.roots)

    def admit(self, path: Path, role: str, value: str) -> Path:
        """``path`` resolved, if it is a regular file or a directory under an allowed root; else the refusal."""
        if not self.allows(path):
            raise self.refusal(role, value)
        real = Path(os.path.realpath(path))
        try:
            mode = os.stat(real).st_mode
        except OSError:
            raise self.refusal(role, value) from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) or not os.access(real, os.R_OK):
            raise self.refusal(role, value)
        return real

    def admit_files(self, files: list[Path], role: str, value: str) -> list[Path]:
        """Each of a directory's collected files resolved and checked like the directory itself (a symlink
        in an allowed directory that points outside it refuses the whole request)."""
        out = []
        for f in files:
            real = self.admit(f, role, value)
            if not stat.S_ISREG(os.stat(real).st_mode):
                raise self.refusal(role, value)
            out.append(real)
        return out
