"""Model names with Ollama's parsing, validation and display rules.

Mirrors ollama/types/model/name.go (ParseName / IsFullyQualified / DisplayShortest)
so that the same strings are accepted, rejected and displayed the same way, and so
that a name maps to the same manifest path Ollama would use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = [
    "BlobsError",
    "InvalidNameError",
    "ModelName",
    "DEFAULT_HOST",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TAG",
    "fold",
]

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Ollama substitutes this for a part that a separator promised but that is empty
# ("model:" or "/model"); it can never validate, which turns such input invalid.
_MISSING = "!MISSING!"

# First character alphanumeric or '_', then the per-part alphabet (name.go isValidPart).
# ASCII-only on purpose: Go compares bytes, and str.isalnum() would admit Unicode digits.
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,349}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,79}")
_MODEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}")
_TAG_RE = _MODEL_RE


class BlobsError(Exception):
    """Base class of every error raised by the blobs package."""


class InvalidNameError(BlobsError, ValueError):
    def __init__(self, message: str = "invalid model name") -> None:
        super().__init__(message)


def fold(s: str) -> str:
    """Case-fold like Go's strings.EqualFold does for the only characters a valid part can hold.

    Plain str.lower() would fold e.g. the Kelvin sign onto 'k', letting a crafted
    directory name match a valid model name.
    """
    return s.lower() if s.isascii() else s


def _cut_promised(s: str, sep: str) -> tuple[str, str, bool]:
    i = s.rfind(sep)
    if i < 0:
        return s, "", False
    before, after = s[:i], s[i + len(sep):]
    return before or _MISSING, after or _MISSING, True


def _parse_bare(s: str) -> tuple[str, str, str, str]:
    """ParseNameBare: split into (host, namespace, model, tag) without defaults."""
    host = namespace = tag = ""
    # '/' can't appear in a tag, so a ':' after the last '/' starts the tag; an
    # earlier ':' belongs to a host port.
    if s.rfind(":") > s.rfind("/"):
        s, tag, _ = _cut_promised(s, ":")
    s, model, promised = _cut_promised(s, "/")
    if not promised:
        return host, namespace, s, tag
    s, namespace, promised = _cut_promised(s, "/")
    if not promised:
        return host, s, model, tag
    scheme, sep, rest = s.partition("://")
    host = rest if sep else scheme
    return host, namespace, model, tag


@dataclass(frozen=True)
class ModelName:
    """A fully qualified model name; the constructor validates so no instance can escape the store root."""

    host: str
    namespace: str
    model: str
    tag: str

    def __post_init__(self) -> None:
        for value, pattern in (
            (self.host, _HOST_RE),
            (self.namespace, _NAMESPACE_RE),
            (self.model, _MODEL_RE),
            (self.tag, _TAG_RE),
        ):
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise InvalidNameError()

    @classmethod
    def parse(cls, s: str) -> "ModelName":
        """Parse ``[host/][namespace/]model[:tag]``, filling Ollama's defaults."""
        if isinstance(s, ModelName):
            return s
        if not isinstance(s, str) or not s:
            raise InvalidNameError()
        host, namespace, model, tag = _parse_bare(s)
        return cls(
            host or DEFAULT_HOST,
            namespace or DEFAULT_NAMESPACE,
            model,
            tag or DEFAULT_TAG,
        )

    def display(self) -> str:
        """Ollama's DisplayShortest: drop the default host (and namespace) but always keep the tag."""
        if fold(self.host) != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if fold(self.namespace) != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    def manifest_relpath(self) -> PurePosixPath:
        return PurePosixPath("manifests", self.host, self.namespace, self.model, self.tag)

    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    def fold_key(self) -> tuple[str, ...]:
        """Key under which names that Ollama treats as the same model compare equal."""
        return tuple(fold(p) for p in self.parts())

    def equal_fold(self, other: "ModelName | str") -> bool:
        return self.fold_key() == ModelName.parse(other).fold_key()
