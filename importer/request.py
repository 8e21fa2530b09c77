"""The create request: Ollama's `/api/create` JSON body as a typed dataclass, and create progress events.

Both entry points (a Modelfile on the command line and a JSON body on the HTTP API) are turned into a
`CreateRequest` first, so that one code path (`importer.create.create_model`) builds every model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.contract.options import ParamError, coerce_options

from .hf.errors import CreateError  # defined below importer/architectures/, which raises it too; importable here

_DIGEST_RE = re.compile(r"^sha256[:-][0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class ProgressEvent:
    """One status line of a create, in Ollama's shape (`{"status": ..., "digest"?, "total"?, "completed"?}`)."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.digest is not None:
            out["digest"] = self.digest
        if self.total is not None:
            out["total"] = self.total
        if self.completed is not None:
            out["completed"] = self.completed
        return out


Progress = Callable[[ProgressEvent], None]


def no_progress(_: ProgressEvent) -> None:
    pass


@dataclass
class CreateRequest:
    """Fields of `/api/create` (api/types.go CreateRequest). Files map a file name to a blob digest."""

    model: str
    from_: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    draft_files: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    license: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    quantize: str | None = None
    draft_quantize: str | None = None
    renderer: str | None = None
    parser: str | None = None
    requires: str | None = None
    #: tandem's own field (Ollama clients never send it): parameter -> where its value in ``parameters``
    #: came from, e.g. a ``tandem bench --apply`` measurement. Stored as the tuning layer.
    tuning: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> "CreateRequest":
        """Validate a JSON body as Ollama's CreateHandler does (same messages, 400 on bad input)."""
        if not isinstance(body, dict):
            raise CreateError("invalid request body")
        model = body.get("model") or body.get("name")
        if not model or not isinstance(model, str):
            raise CreateError("model is required")

        def str_field(key: str) -> str | None:
            value = body.get(key)
            if value is None:
                return None
            if not isinstance(value, str):
                raise CreateError(f"{key} must be a string")
            return value

        def digest_map(key: str) -> dict[str, str]:
            value = body.get(key) or {}
            if not isinstance(value, dict):
                raise CreateError(f"{key} must be an object mapping file names to digests")
            out: dict[str, str] = {}
            for name, digest in value.items():
                if not isinstance(name, str) or name.startswith("/") or ".." in name.split("/") or re.match(r"^[A-Za-z]:", name):
                    raise CreateError("file path must be relative")
                if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
                    raise CreateError("invalid digest format")
                out[name] = "sha256:" + digest[7:].lower()
            return out

        license_value = body.get("license")
        if license_value is None:
            licenses: list[str] = []
        elif isinstance(license_value, str):
            licenses = [license_value]
        elif isinstance(license_value, list) and all(isinstance(x, str) for x in license_value):
            licenses = list(license_value)
        else:
            raise CreateError("license must be a string or a list of strings")

        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise CreateError("parameters must be an object")
        try:  # typed and range-checked before anything is stored: a bad value must not reach a generate
            coerce_options(parameters)
        except ParamError as e:
            raise CreateError(str(e)) from None
        messages = body.get("messages") or []
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str) for m in messages
        ):
            raise CreateError("messages must be a list of {role, content} objects")

        req = cls(
            model=model,
            from_=str_field("from"),
            files=digest_map("files"),
            draft_files=digest_map("draft_files"),
            adapters=digest_map("adapters"),
            template=str_field("template"),
            system=str_field("system"),
            license=licenses,
            parameters=dict(parameters),
            messages=[{"role": m["role"], "content": m.get("content", "")} for m in messages],
            quantize=str_field("quantize") or str_field("quantization"),
            draft_quantize=str_field("draft_quantize"),
            renderer=str_field("renderer"),
            parser=str_field("parser"),
            requires=str_field("requires"),
            tuning=_tuning(body.get("tuning"), parameters),
        )
        req.check()
        return req

    def check(self) -> None:
        if not self.from_ and not self.files:
            raise CreateError("neither 'from' or 'files' was specified")
        if self.draft_quantize and not self.draft_files:
            raise CreateError("draft_quantize requires draft_files")


def _tuning(value: Any, parameters: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Claims about the parameters this create sets: one object per parameter, each naming the value it
    speaks for (stamped here from ``parameters``, so a claim can never describe another value)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise CreateError("tuning must be an object mapping parameter names to objects")
    out: dict[str, dict[str, Any]] = {}
    for name, claim in value.items():
        if name not in parameters:
            raise CreateError(f"tuning describes parameter {name!r}, which parameters does not set")
        out[name] = {**claim, "value": parameters[name]}
    return out
