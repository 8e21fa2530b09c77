"""`/api/pull` for Hugging Face GGUF repositories: `hf.co/<org>/<repo>[:<quant>]`.

The quant tag picks the GGUF whose file name carries it (case-insensitive; `latest` means Q4_K_M, or the
only GGUF). The file is fetched with huggingface_hub's `hf_hub_download`, so HF_ENDPOINT, HF_TOKEN, the
HF cache and offline mode (HF_HUB_OFFLINE) behave as everywhere else; then it is copied into the blob
store and the model is created from it, streaming Ollama-style progress throughout.

Ollama's own registry is not reachable from tandem: any other name gets a clear 400.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blobs import InvalidNameError, ModelName
from importer import CreateError, CreateRequest, ProgressEvent, create_model

from .gojson import ApiError, read_json
from .native import ctx_of, merge_last, stream_or_collect, thread_progress

log = logging.getLogger("tandem.pull")

router = APIRouter()

HF_HOSTS = ("hf.co", "huggingface.co")
DEFAULT_QUANT = "Q4_K_M"
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)

Progress = Callable[[ProgressEvent], None]


class PullError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HFTarget:
    name: ModelName  # where the model is stored (hf.co/org/repo:tag)
    repo_id: str
    quant: str | None  # None: the default choice


def parse_pull_name(value: str) -> HFTarget:
    try:
        name = ModelName.parse(value)
    except InvalidNameError:
        raise PullError("invalid model name") from None
    if name.host.lower() not in HF_HOSTS:
        raise PullError(f"pulling from {name.host} is not supported; use hf.co/<org>/<repo>[:<quant>]")
    quant = None if name.tag.lower() == "latest" else name.tag
    return HFTarget(name=name, repo_id=f"{name.namespace}/{name.model}", quant=quant)


def _quant_pattern(quant: str) -> re.Pattern[str]:
    # The tag must stand alone in the file name: Q4_K must not pick Q4_K_M.
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def quant_of(filename: str) -> str:
    m = re.search(r"(?<![A-Za-z0-9])(I?Q\d[A-Za-z0-9_]*|F16|F32|BF16)(?=\.gguf$|[-.])", Path(filename).name, re.IGNORECASE)
    return m.group(1).upper() if m else Path(filename).stem


def choose_gguf(files: list[str], quant: str | None, repo: str) -> str:
    """The GGUF for a quant tag: a whole-word match in the file name; `latest` is Q4_K_M or the only one."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in Path(f).name.lower())
    if not ggufs:
        raise PullError(f"hf.co/{repo} has no GGUF files", 404)
    wanted = quant or DEFAULT_QUANT
    matches = [f for f in ggufs if _quant_pattern(wanted).search(Path(f).name)]
    if not matches and quant is None and len(ggufs) == 1:
        matches = ggufs
    if not matches:
        available = ", ".join(sorted({quant_of(f) for f in ggufs}))
        raise PullError(f'no GGUF file for quantization "{wanted}" in hf.co/{repo} (available: {available})', 404)
    whole = [f for f in matches if not _SPLIT_RE.search(f)]
    if not whole:
        raise PullError(f"{matches[0]} is split into several files; split GGUFs are not supported yet")
    return min(whole, key=lambda f: (f.count("/"), len(f)))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def _cache_dir() -> str | None:
    """HF_HUB_CACHE / HF_HOME read now, not when huggingface_hub was imported."""
    cache = os.environ.get("HF_HUB_CACHE", "").strip()
    if cache:
        return cache
    home = os.environ.get("HF_HOME", "").strip()
    return os.path.join(home, "hub") if home else None


def _endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip()
    return value.rstrip("/") or None


def list_repo(repo_id: str) -> tuple[list[str], dict[str, tuple[str | None, int | None]]]:
    """File names in the repo and, where the hub says, their (sha256, size). Offline: the cached snapshot."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
    )

    if _offline():
        try:
            folder = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=["*.gguf"],
                                            cache_dir=_cache_dir()))
        except Exception as e:  # LocalEntryNotFoundError and friends
            raise PullError(f"hf.co/{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set ({e})",
                            404) from None
        files = [str(p.relative_to(folder)) for p in folder.rglob("*.gguf")]
        return files, {}
    try:
        info = HfApi(endpoint=_endpoint()).model_info(repo_id, files_metadata=True)
    except RepositoryNotFoundError:
        raise PullError(f"pull model manifest: hf.co/{repo_id} not found", 404) from None
    except GatedRepoError:
        raise PullError(f"hf.co/{repo_id} is gated: accept its terms on huggingface.co and set HF_TOKEN", 401) from None
    except HfHubHTTPError as e:
        raise PullError(f"pull model manifest: {e}", 502) from None
    except OSError as e:
        raise PullError(f"pull model manifest: {e}", 502) from None
    files, meta = [], {}
    for s in info.siblings or []:
        files.append(s.rfilename)
        lfs = getattr(s, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        size = getattr(lfs, "size", None) if lfs is not None else getattr(s, "size", None)
        meta[s.rfilename] = (sha, size)
    return files, meta


def _progress_bar(status: str, digest: str | None, progress: Progress) -> type:
    """A tqdm stand-in for hf_hub_download that turns byte counts into Ollama pull progress lines
    (at most about four a second, plus the last)."""

    class Bar:
        def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any):
            self.total = total or 0
            self.n = initial
            self._last = 0.0
            self._sent: int | None = None
            self._emit(force=True)

        def _emit(self, force: bool = False) -> None:
            now = time.monotonic()
            if self._sent == self.n:
                return
            if force or now - self._last >= 0.25 or (self.total and self.n >= self.total):
                self._last = now
                self._sent = self.n
                progress(ProgressEvent(status, digest=digest, total=self.total, completed=self.n))

        def update(self, n: int = 1) -> None:
            self.n += n
            self._emit()

        def close(self) -> None:
            self._emit(force=True)

        def __enter__(self) -> "Bar":
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

        def set_description(self, *args: Any, **kwargs: Any) -> None:
            pass

        def refresh(self, *args: Any, **kwargs: Any) -> None:
            pass

    return Bar


def pull_model(store: Any, value: str, progress: Progress) -> ModelName:
    target = parse_pull_name(value)
    progress(ProgressEvent("pulling manifest"))
    files, meta = list_repo(target.repo_id)
    filename = choose_gguf(files, target.quant, target.repo_id)
    sha, size = meta.get(filename, (None, None))
    digest = f"sha256:{sha}" if sha else None
    status = f"pulling {sha[:12]}" if sha else f"pulling {Path(filename).name}"
    log.info("pulling %s: %s from hf.co/%s", target.name.display(), filename, target.repo_id)

    if digest and store.has_blob(digest):  # already here (another tag, an earlier pull)
        progress(ProgressEvent(status, digest=digest, total=size or 0, completed=size or 0))
        progress(ProgressEvent("verifying sha256 digest"))
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
        )

        try:
            path = hf_hub_download(target.repo_id, filename, endpoint=_endpoint(), local_files_only=_offline(),
                                   cache_dir=_cache_dir(), tqdm_class=_progress_bar(status, digest, progress))
        except (EntryNotFoundError, LocalEntryNotFoundError) as e:
            raise PullError(f"{filename}: {e}", 404) from None
        except HfHubHTTPError as e:
            raise PullError(f"downloading {filename}: {e}", 502) from None
        progress(ProgressEvent("verifying sha256 digest"))
        got, _ = store.add_file(path)
        if digest and got != digest:
            raise PullError(f"digest mismatch, expected \"{digest}\", got \"{got}\"")
        digest = got
    req = CreateRequest(model=str(target.name), files={Path(filename).name: digest})
    # create_model goes on with "parsing GGUF", ..., "writing manifest", "success".
    return create_model(store, req, progress)


@router.post("/api/pull")
async def pull(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await read_json(request, "api.PullRequest")
    name = body.get("model") or body.get("name")
    if not name or not isinstance(name, str):
        raise ApiError(400, "model is required")
    stream = body.get("stream")
    stream = True if stream is None else bool(stream)
    try:
        parse_pull_name(name)
    except PullError as e:
        raise ApiError(e.status, str(e)) from None

    def work(progress: Progress) -> None:
        try:
            pulled = pull_model(ctx.store, name, progress)
        except PullError as e:
            raise ApiError(e.status, str(e)) from None
        except CreateError as e:
            raise ApiError(e.status, str(e)) from None
        log.info("pulled %s", pulled.display())

    return await stream_or_collect(thread_progress(work), stream, merge_last)
