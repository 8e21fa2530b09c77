"""Turning a parsed Modelfile into a `CreateRequest`, as Ollama's client does (`Modelfile.CreateRequest`).

Local files named by FROM / DRAFT are hashed and handed to a `BlobSink` first: the local store when
the CLI works on disk, or `/api/blobs` when a server runs. The request then refers to them by digest,
exactly like the JSON an Ollama client sends.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

from modelfile import Command, ParamError, format_params

from .request import CreateError, CreateRequest

_PATH_HINT = re.compile(r"^(\.{1,2}/|/|~)|\.(gguf|safetensors)$", re.IGNORECASE)
# Files Ollama's client collects from a FROM directory besides the weights.
_WEIGHT_SUFFIXES = (".gguf", ".safetensors")


class BlobSink(Protocol):
    """Where a Modelfile's local files go before the create request refers to them by digest."""

    def upload_file(self, path: Path) -> str:
        """Store the file; return its digest `sha256:<hex>`."""
        ...


def expand_path(value: str, base_dir: Path) -> Path:
    """Ollama's rules: absolute, `~`, `~user`, else relative to the Modelfile's directory."""
    if value.startswith("~"):
        return Path(os.path.expanduser(value))
    p = Path(value)
    return p if p.is_absolute() else base_dir / p


def _collect_files(path: Path, role: str) -> list[Path]:
    if path.is_dir():
        weights = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in _WEIGHT_SUFFIXES)
        if not weights:
            raise CreateError(f"{role} {path}: no GGUF or safetensors file in this directory")
        extras = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix == ".json" or p.name.startswith("tokenizer")))
        return weights + (extras if any(w.suffix == ".safetensors" for w in weights) else [])
    return [path]


def _upload(paths: list[Path], sink: BlobSink) -> dict[str, str]:
    files: dict[str, str] = {}
    for p in paths:
        files[p.name] = sink.upload_file(p)
    return files


def request_from_modelfile(commands: list[Command], model: str, base_dir: Path, sink: BlobSink,
                           warnings: list[str] | None = None) -> CreateRequest:
    """Build the create request for ``model`` from Modelfile ``commands`` (paths relative to ``base_dir``)."""
    req = CreateRequest(model=model)
    from_paths: list[Path] = []
    raw_params: dict[str, list[str]] = {}
    for cmd in commands:
        if cmd.name == "model":
            path = expand_path(cmd.args, base_dir)
            if cmd.args and path.exists():
                from_paths.append(path.resolve())
                req.files.update(_upload(_collect_files(path, "FROM"), sink))
            elif _PATH_HINT.search(cmd.args):
                raise CreateError(f"FROM {cmd.args}: no such file or directory")
            else:
                req.from_ = cmd.args
        elif cmd.name == "draft":
            path = expand_path(cmd.args, base_dir)
            if not path.exists():
                raise CreateError(f"stat {path}: no such file or directory")
            if path.resolve() in from_paths:
                raise CreateError(f"DRAFT must not reference the same local path as FROM: {path}")
            req.draft_files.update(_upload(_collect_files(path, "DRAFT"), sink))
        elif cmd.name == "adapter":
            path = expand_path(cmd.args, base_dir)
            if not path.exists():
                raise CreateError(f"stat {path}: no such file or directory")
            req.adapters.update(_upload(_collect_files(path, "ADAPTER"), sink))
        elif cmd.name == "template":
            req.template = cmd.args
        elif cmd.name == "system":
            req.system = cmd.args
        elif cmd.name == "renderer":
            req.renderer = cmd.args
        elif cmd.name == "parser":
            req.parser = cmd.args
        elif cmd.name == "requires":
            req.requires = cmd.args
        elif cmd.name == "license":
            req.license.append(cmd.args)
        elif cmd.name == "message":
            role, _, content = cmd.args.partition(": ")
            req.messages.append({"role": role, "content": content})
        else:
            raw_params.setdefault(cmd.name, []).append(cmd.args)
    # A DRAFT named before FROM in the file is checked here too.
    for digest in req.draft_files.values():
        if digest in req.files.values():
            raise CreateError("DRAFT must not reference the same local path as FROM")
    try:
        params, warns = format_params(raw_params)
    except ParamError as e:
        raise CreateError(str(e)) from None
    if warnings is not None:
        warnings.extend(warns)
    req.parameters = params
    req.check()
    return req
