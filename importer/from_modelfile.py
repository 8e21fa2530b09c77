"""Turning a parsed Modelfile into a `CreateRequest`, as Ollama's client does (`Modelfile.CreateRequest`).

Local files named by FROM / DRAFT are hashed and handed to a `BlobSink` first: the local store when
the CLI works on disk, or `/api/blobs` when a server runs. The request then refers to them by digest,
exactly like the JSON an Ollama client sends.

`FROM hf.co/<org>/<repo>[:<tag>]` names the stored model of that name when the sink's side has one (a
pulled model), and otherwise a Hugging Face repo: the GGUF for the tag, or the safetensors folder, is
downloaded through huggingface_hub (`importer.hf_source`, with pull's progress events) and then handed to
the sink like a local file. `DRAFT hf.co/...` always resolves on Hugging Face (a DRAFT never names a
stored model). Everything is checked and downloaded before the first file reaches the sink, so a
failing Modelfile leaves the store untouched.

On a server (`/api/create`'s old form) a `PathGate` holds every FROM/DRAFT/ADAPTER path to the operator's
allow-list: outside it a path is not even looked at (so a name that is not a path hint stays a model name), and
what may not be read is refused with one message, whatever the reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

from modelfile import Command, ParamError, format_params

from blobs import NotRegularFileError

from . import hf_source
from .path_gate import PathGate
from .request import CreateError, CreateRequest, Progress, no_progress

_PATH_HINT = re.compile(r"^(\.{1,2}/|/|~)|\.(gguf|safetensors)$", re.IGNORECASE)
# Files Ollama's client collects from a FROM directory besides the weights.
_WEIGHT_SUFFIXES = (".gguf", ".safetensors")


class BlobSink(Protocol):
    """Where a Modelfile's local files go before the create request refers to them by digest."""

    def upload_file(self, path: Path) -> str:
        """Store the file; return its digest `sha256:<hex>`."""
        ...

    # Optional: `has_model(name) -> bool`, whether the store the create runs against holds the model
    # `name` (so that `FROM hf.co/...` of a pulled model uses it). Without it, hf.co names are downloaded.


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
        extras = sorted(p for p in path.iterdir()
                        if p.is_file() and (p.suffix in (".json", ".jinja") or p.name.startswith("tokenizer")))
        # As Ollama's client: a sentence-transformers folder keeps module configs one level down
        # (1_Pooling/config.json), and vocab.txt is a BERT tokenizer's only vocabulary file.
        extras += sorted(p for p in path.glob("*/*.json") if p.is_file())
        extras += [p for p in [path / "vocab.txt"] if p.is_file()]
        return weights + (extras if any(w.suffix == ".safetensors" for w in weights) else [])
    return [path]


def _upload_name(p: Path, items: list[tuple[Path, str | None]]) -> str:
    """The name a file is uploaded under: its base name, or ``folder/name`` for a file one level below the
    folder's other files (a sentence-transformers module config, ``1_Pooling/config.json``)."""
    if any(q.parent == p.parent.parent for q, _ in items):
        return f"{p.parent.name}/{p.name}"
    return p.name


def _is_local(path: Path, gate: PathGate | None) -> bool:
    """Whether a Modelfile argument names a local file: it exists (and, on a server, is inside the allow-list,
    checked first so that nothing outside it is probed)."""
    if gate is not None and not gate.allows(path):
        return False
    return path.exists()


def _local_files(path: Path, role: str, value: str, gate: PathGate | None,
                 real_of: dict[Path, tuple[Path, str, str]]) -> list[Path]:
    """The files a local FROM/DRAFT/ADAPTER path stands for; through the gate, each checked and resolved
    (``real_of`` maps a file to the path to read and what to say if it cannot be read)."""
    if gate is None:
        return _collect_files(path, role)
    gate.admit(path, role, value)
    files = _collect_files(path, role)
    for f, real in zip(files, gate.admit_files(files, role, value)):
        real_of[f] = (real, role, value)
    return files


def _stored(sink: BlobSink, name: str) -> bool:
    has_model = getattr(sink, "has_model", None)
    return bool(has_model(name)) if has_model is not None else False


def _from_hf(value: str, role: str, progress: Progress) -> list[tuple[Path, str | None]]:
    """The files of an hf.co name, downloaded (CreateError when it cannot be resolved)."""
    try:
        _, fetched = hf_source.fetch(value, progress)
    except CreateError as e:
        raise CreateError(f"{role} {value}: {e}", e.status) from None
    return [(path, f.digest) for path, f in fetched]


def _upload(sink: BlobSink, p: Path, real_of: dict[Path, tuple[Path, str, str]], gate: PathGate | None) -> str:
    """Hand one file to the sink; a gated file that changed since it was checked (gone, no longer regular)
    gets the gate's one refusal too."""
    if p not in real_of:
        return sink.upload_file(p)
    real, role, value = real_of[p]
    try:
        return sink.upload_file(real)
    except (NotRegularFileError, FileNotFoundError, PermissionError, IsADirectoryError):
        assert gate is not None
        raise gate.refusal(role, value) from None


def request_from_modelfile(commands: list[Command], model: str, base_dir: Path, sink: BlobSink,
                           warnings: list[str] | None = None, progress: Progress = no_progress,
                           gate: PathGate | None = None) -> CreateRequest:
    """Build the create request for ``model`` from Modelfile ``commands`` (paths relative to ``base_dir``).
    ``progress`` gets the download progress of Hugging Face sources; ``gate``, on a server, limits which
    local paths may be read."""
    req = CreateRequest(model=model)
    from_paths: list[Path] = []
    raw_params: dict[str, list[str]] = {}
    # (files map to fill, [(local path, expected digest or None)]): uploaded once everything checked out.
    uploads: list[tuple[dict[str, str], list[tuple[Path, str | None]]]] = []
    real_of: dict[Path, tuple[Path, str, str]] = {}
    for cmd in commands:
        if cmd.name == "model":
            path = expand_path(cmd.args, base_dir)
            if cmd.args and _is_local(path, gate):
                files = _local_files(path, "FROM", cmd.args, gate, real_of)
                from_paths.append(path.resolve())
                uploads.append((req.files, [(p, None) for p in files]))
            elif _PATH_HINT.search(cmd.args):
                if gate is not None:
                    raise gate.refusal("FROM", cmd.args)
                raise CreateError(f"FROM {cmd.args}: no such file or directory")
            elif hf_source.is_hf_name(cmd.args) and not _stored(sink, cmd.args):
                files = _from_hf(cmd.args, "FROM", progress)
                from_paths += [p.resolve() for p, _ in files]
                uploads.append((req.files, files))
            else:
                req.from_ = cmd.args
        elif cmd.name == "draft":
            path = expand_path(cmd.args, base_dir)
            if _is_local(path, gate):
                if path.resolve() in from_paths:
                    raise CreateError(f"DRAFT must not reference the same local path as FROM: {path}")
                uploads.append((req.draft_files, [(p, None) for p in _local_files(path, "DRAFT", cmd.args, gate, real_of)]))
            elif hf_source.is_hf_name(cmd.args) and not _PATH_HINT.search(cmd.args):
                files = _from_hf(cmd.args, "DRAFT", progress)
                if any(p.resolve() in from_paths for p, _ in files):
                    raise CreateError(f"DRAFT must not reference the same model as FROM: {cmd.args}")
                uploads.append((req.draft_files, files))
            elif gate is not None:
                raise gate.refusal("DRAFT", cmd.args)
            else:
                raise CreateError(f"stat {path}: no such file or directory")
        elif cmd.name == "adapter":
            path = expand_path(cmd.args, base_dir)
            if not _is_local(path, gate):
                if gate is not None:
                    raise gate.refusal("ADAPTER", cmd.args)
                raise CreateError(f"stat {path}: no such file or directory")
            uploads.append((req.adapters, [(p, None) for p in _local_files(path, "ADAPTER", cmd.args, gate, real_of)]))
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
    try:
        params, warns = format_params(raw_params)
    except ParamError as e:
        raise CreateError(str(e)) from None
    req.parameters = params
    if not req.from_ and not any(items for _, items in uploads):
        req.check()  # neither FROM nor files: refused before anything is uploaded
    for files, items in uploads:
        for p, expected in items:
            digest = _upload(sink, p, real_of, gate)
            if expected and digest != expected:
                raise CreateError(f'{p.name}: digest mismatch, expected "{expected}", got "{digest}"')
            files[_upload_name(p, items)] = digest
    # A DRAFT named before FROM in the file is checked here too. Only weights count: a drafter folder
    # usually ships the very tokenizer.json (and often config files) of its target.
    target_weights = {d for name, d in req.files.items() if name.lower().endswith(_WEIGHT_SUFFIXES)}
    for name, digest in req.draft_files.items():
        if name.lower().endswith(_WEIGHT_SUFFIXES) and digest in target_weights:
            raise CreateError("DRAFT must not reference the same local path as FROM")
    if warnings is not None:
        warnings.extend(warns)
    req.check()
    return req
