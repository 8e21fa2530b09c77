"""Pulling a model from Hugging Face into the blob store: `hf.co/<org>/<repo>[:<quant>]`.

`importer.hf_source` resolves the name: the GGUF whose file name carries the quant tag (`latest` means
Q4_K_M, or the only GGUF), or, for a repo without GGUF files, its safetensors folder (config, weights,
tokenizer). Files come through huggingface_hub, so HF_ENDPOINT, HF_TOKEN, the HF cache and offline mode
(HF_HUB_OFFLINE) behave as everywhere else; they are copied into the blob store (a GGUF whose LFS digest
the store already holds is not downloaded again) and the model is created from them through the one
create path, reporting Ollama-style progress throughout.

Both `/api/pull` and `/api/create` with `"from": "hf.co/..."` use it, so it is no route's own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from blobs import ModelName
from importer import CreateRequest, ProgressEvent, create_model, hf_source
from importer.hf_source import HFRef, HFSourceError

log = logging.getLogger("tandem.pull")

Progress = Callable[[ProgressEvent], None]


class PullError(HFSourceError):
    """A download whose digest is not the one Hugging Face listed (400, like every HFSourceError unless it says
    otherwise)."""


def fetch_into_store(store: Any, ref: HFRef, progress: Progress) -> dict[str, str]:
    """Download what ``ref`` stands for and copy it into the blob store: the create request's `files`
    (file name -> digest). A file whose LFS digest the store already holds is not downloaded again."""
    progress(ProgressEvent("pulling manifest"))
    sel = hf_source.locate(ref)
    log.info("pulling %s: %s from hf.co/%s", ref.name.display(), ", ".join(f.name for f in sel.files), ref.repo_id)
    digests: dict[str, str] = {}
    fetched: list[tuple[Path, hf_source.HFFile]] = []
    for f in sel.files:
        if f.digest and store.has_blob(f.digest):  # already here (another tag, an earlier pull)
            progress(ProgressEvent(f.status, digest=f.digest, total=f.size or 0, completed=f.size or 0))
            digests[f.name] = f.digest
        else:
            fetched.append((hf_source.download(sel.listing, f, progress), f))
    progress(ProgressEvent("verifying sha256 digest"))
    for path, f in fetched:
        got, _ = store.add_file(path)
        if f.digest and got != f.digest:
            raise PullError(f"digest mismatch, expected \"{f.digest}\", got \"{got}\"")
        digests[f.name] = got
    return {f.basename: digests[f.name] for f in sel.files}


def pull_model(store: Any, value: str, progress: Progress) -> ModelName:
    ref = hf_source.parse_hf_name(value)
    req = CreateRequest(model=str(ref.name), files=fetch_into_store(store, ref, progress))
    # create_model goes on with "parsing GGUF", ..., "writing manifest", "success".
    return create_model(store, req, progress)
