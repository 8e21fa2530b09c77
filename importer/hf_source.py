"""Hugging Face repositories as model sources: `hf.co/<org>/<repo>[:<tag>]` (or `huggingface.co/...`).

Used by `/api/pull` and by a Modelfile's `FROM` / `DRAFT`. A name resolves to local files in three steps:

1. **list** the repo's files: online through huggingface_hub's `model_info` (HF_ENDPOINT and HF_TOKEN are
   read at call time); offline (HF_HUB_OFFLINE set, or the Hub unreachable) from the local Hugging Face
   cache (HF_HUB_CACHE / HF_HOME): the tree listing a `snapshot_download` cached, else the files of the
   cached snapshot of `main`;
2. **select** what to fetch:
   - a repo with GGUF files: the one whose name carries the tag as a whole word (case-insensitive; `Q4_K`
     does not pick `Q4_K_M`). `latest` (no tag) means Q4_K_M, or the only GGUF. `mmproj` files (vision
     projectors) are skipped; a match split into `-0000N-of-0000M.gguf` parts is refused (not supported
     yet); no match lists the quantizations the repo has;
   - a repo without GGUF files but with top-level `*.safetensors` and a `config.json`: the folder, i.e. its
     top-level `*.safetensors`, `*.json`, `tokenizer*` and `*.jinja` (transformers' `chat_template.jinja`)
     files (what `snapshot_download(allow_patterns=...)` would fetch; sub-folders such as `original/` or
     `onnx/` hold other formats and are left out). The weights' dtype is read from config.json. Its tag
     must be `latest` or name that dtype (`torch_dtype`, or `dtype`, in config.json: `bf16`/`bfloat16`,
     `f16`/`fp16`/`float16`, `f32`/`fp32`/`float32`); any other tag, a quantization in particular, is an
     error that says so (quantize at create time instead);
3. **download** each selected file with `hf_hub_download` into the HF cache (one progress bar per file),
   which is a no-op for a file already cached; offline, only cached files resolve.

Offline, a cache that holds no full tree listing only knows the files downloaded before, so `latest` picks
among those (the only cached GGUF, say). Errors are `HFSourceError`, a `CreateError` with an HTTP status.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from blobs import InvalidNameError, ModelName

from .request import CreateError, Progress, ProgressEvent, no_progress

log = logging.getLogger("tandem.hf")

HF_HOSTS = ("hf.co", "huggingface.co")
DEFAULT_QUANT = "Q4_K_M"
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Tags that name the dtype of a safetensors repo, by the GGUF-style name of that dtype.
_DTYPE_TAGS = {"BF16": ("bf16", "bfloat16"), "F16": ("f16", "fp16", "float16"), "F32": ("f32", "fp32", "float32")}
_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32", "float": "F32"}
# Exceptions (by class name, across huggingface_hub's requests and httpx eras) that mean "no connection".
_CONNECTION_ERRORS = {"ConnectError", "ConnectTimeout", "TimeoutException", "ReadTimeout", "ConnectionError",
                      "Timeout", "OfflineModeIsEnabled", "ProxyError", "NetworkError"}


class HFSourceError(CreateError):
    """A Hugging Face source that cannot be resolved; ``status`` is the HTTP status the API answers with."""


@dataclass(frozen=True)
class HFRef:
    """A parsed `hf.co/<org>/<repo>[:<tag>]`: where the model is stored and what to fetch."""

    name: ModelName  # the stored name (hf.co/org/repo:tag)
    repo_id: str
    quant: str | None  # the tag; None for `latest`

    @property
    def display(self) -> str:
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class HFFile:
    """A file of the repo: its path in the repo and, where known, its LFS sha256 and size."""

    name: str
    sha256: str | None = None
    size: int | None = None

    @property
    def basename(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def digest(self) -> str | None:
        return f"sha256:{self.sha256}" if self.sha256 else None

    @property
    def status(self) -> str:
        """The progress status of its download, Ollama-style (`pulling <first 12 hex digits>`)."""
        return f"pulling {self.sha256[:12]}" if self.sha256 else f"pulling {self.basename}"


@dataclass(frozen=True)
class HFListing:
    repo_id: str
    files: dict[str, HFFile]
    offline_reason: str | None = None  # set when listed from the local cache (then downloads are cache-only)

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None


@dataclass(frozen=True)
class HFSelection:
    ref: HFRef
    kind: Literal["gguf", "safetensors"]
    files: tuple[HFFile, ...]
    listing: HFListing
    dtype: str | None = None  # safetensors: the weights' dtype from config.json (BF16, F16, F32), if known


# --- names ---------------------------------------------------------------------------------------------------


def is_hf_name(value: str) -> bool:
    """Whether ``value`` names a model on Hugging Face (`hf.co/...` or `huggingface.co/...`)."""
    try:
        return ModelName.parse(value).host.lower() in HF_HOSTS
    except InvalidNameError:
        return False


def parse_hf_name(value: str) -> HFRef:
    try:
        name = ModelName.parse(value)
    except InvalidNameError:
        raise HFSourceError("invalid model name") from None
    if name.host.lower() not in HF_HOSTS:
        raise HFSourceError(f"{value} is not a Hugging Face model name (hf.co/<org>/<repo>[:<quant>])")
    quant = None if name.tag.lower() == "latest" else name.tag
    return HFRef(name=name, repo_id=f"{name.namespace}/{name.model}", quant=quant)


# --- choosing files ------------------------------------------------------------------------------------------


def _quant_pattern(quant: str) -> re.Pattern[str]:
    # The tag must stand alone in the file name: Q4_K must not pick Q4_K_M.
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def quant_of(filename: str) -> str:
    m = re.search(r"(?<![A-Za-z0-9])(I?Q\d[A-Za-z0-9_]*|F16|F32|BF16)(?=\.gguf$|[-.])", Path(filename).name, re.IGNORECASE)
    return m.group(1).upper() if m else Path(filename).stem


def _ggufs(files: list[str]) -> list[str]:
    return sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in Path(f).name.lower())


def choose_gguf(files: list[str], quant: str | None, repo: str, note: str = "") -> str:
    """The GGUF for a quant tag: a whole-word match in the file name; `latest` is Q4_K_M or the only one.
    ``note`` is added to the no-match message (offline: which files were considered)."""
    ggufs = _ggufs(files)
    if not ggufs:
        raise HFSourceError(f"hf.co/{repo} has no GGUF files", 404)
    wanted = quant or DEFAULT_QUANT
    matches = [f for f in ggufs if _quant_pattern(wanted).search(Path(f).name)]
    if not matches and quant is None and len(ggufs) == 1:
        matches = ggufs
    if not matches:
        available = ", ".join(sorted({quant_of(f) for f in ggufs}))
        raise HFSourceError(f'no GGUF file for quantization "{wanted}" in hf.co/{repo} (available: {available}{note})', 404)
    whole = [f for f in matches if not _SPLIT_RE.search(f)]
    if not whole:
        raise HFSourceError(f"{matches[0]} is split into several files; split GGUFs are not supported yet")
    return min(whole, key=lambda f: (f.count("/"), len(f)))


def _safetensors_folder(files: list[str]) -> list[str]:
    """The top-level safetensors weights with their config and tokenizer files; [] when it is not such a repo."""
    top = [f for f in files if "/" not in f]
    weights = [f for f in top if f.endswith(".safetensors")]
    if not weights or "config.json" not in top:
        return []
    extras = [f for f in top if f.endswith((".json", ".jinja")) or f.startswith("tokenizer")]
    return sorted(set(weights + extras))


def dtype_of_config(config: dict[str, Any]) -> str | None:
    """BF16 / F16 / F32 from a transformers config (`torch_dtype`, or `dtype` in recent versions)."""
    for c in (config, config.get("text_config") or {}):
        value = c.get("torch_dtype") or c.get("dtype")
        if isinstance(value, str):
            return _DTYPE_NAMES.get(value.lower().removeprefix("torch."))
    return None


def select(ref: HFRef, listing: HFListing) -> HFSelection:
    """What to fetch for ``ref``: the matching GGUF, else the safetensors folder (see the module doc)."""
    names = sorted(listing.files)
    note = f"; only files in the local Hugging Face cache are known: {listing.offline_reason}" if listing.offline else ""
    if _ggufs(names):
        chosen = choose_gguf(names, ref.quant, ref.repo_id, note)
        return HFSelection(ref, "gguf", (listing.files[chosen],), listing)
    folder = _safetensors_folder(names)
    if not folder:
        raise HFSourceError(f"hf.co/{ref.repo_id} has no GGUF files, nor safetensors weights with a config.json{note}",
                            404)
    dtype: str | None = None
    if ref.quant is not None:
        config_path = download(listing, listing.files["config.json"])
        try:
            dtype = dtype_of_config(json.loads(config_path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            raise HFSourceError(f"hf.co/{ref.repo_id}: bad config.json ({e})") from None
        if dtype is None or ref.quant.lower() not in _DTYPE_TAGS[dtype]:
            what = f"safetensors weights in {dtype}" if dtype else "safetensors weights (of a dtype config.json does not say)"
            use = f"hf.co/{ref.repo_id}" + (f" or hf.co/{ref.repo_id}:{dtype.lower()}" if dtype else "")
            raise HFSourceError(f'no GGUF file for quantization "{ref.quant}" in hf.co/{ref.repo_id}: it has {what} '
                                f"and no GGUF files; use {use} (and quantize when creating, e.g. --quantize q8_0)",
                                404)
    return HFSelection(ref, "safetensors", tuple(listing.files[f] for f in folder), listing, dtype)


# --- the hub and the cache -----------------------------------------------------------------------------------


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def cache_dir() -> str | None:
    """HF_HUB_CACHE / HF_HOME read now, not when huggingface_hub was imported (None: its default)."""
    cache = os.environ.get("HF_HUB_CACHE", "").strip()
    if cache:
        return cache
    home = os.environ.get("HF_HOME", "").strip()
    return os.path.join(home, "hub") if home else None


def endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip()
    return value.rstrip("/") or None


def _is_connection_error(e: BaseException) -> bool:
    return isinstance(e, OSError) or any(c.__name__ in _CONNECTION_ERRORS for c in type(e).__mro__)


def _lfs(obj: Any) -> tuple[str | None, int | None]:
    lfs = getattr(obj, "lfs", None)
    if lfs is None:
        return None, getattr(obj, "size", None)
    if isinstance(lfs, dict):
        return lfs.get("sha256") or lfs.get("oid"), lfs.get("size")
    return getattr(lfs, "sha256", None), getattr(lfs, "size", None)


def cached_listing(repo_id: str, reason: str) -> HFListing:
    """The repo as the local cache knows it (``reason``: why the Hub is not asked)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(cache_dir() or constants.HF_HUB_CACHE)
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref_file = storage / "refs" / "main"
    snapshot = storage / "snapshots" / ref_file.read_text().strip() if ref_file.is_file() else None
    if snapshot is None or not snapshot.is_dir():
        raise HFSourceError(f"hf.co/{repo_id} is not in the local Hugging Face cache ({cache}) and {reason}", 404)
    files: dict[str, HFFile] = {}
    try:  # the full listing, when a snapshot_download cached it (huggingface_hub >= 1.x)
        from huggingface_hub import get_cached_repo_tree  # type: ignore[attr-defined]

        for f in get_cached_repo_tree(repo_id, cache_dir=str(cache)):
            sha, size = _lfs(f)
            files[f.path] = HFFile(f.path, sha, size)
    except Exception:
        pass
    for p in sorted(snapshot.rglob("*")):
        rel = p.relative_to(snapshot).as_posix()
        if rel in files or not p.is_file():
            continue
        blob = Path(os.path.realpath(p)).name  # LFS blobs are stored under their sha256
        files[rel] = HFFile(rel, blob if _SHA256_RE.match(blob) else None, p.stat().st_size)
    return HFListing(repo_id, files, offline_reason=reason)


def list_repo(repo_id: str) -> HFListing:
    """The repo's files with their LFS sha256 and size: from the Hub, or the local cache when offline."""
    if offline():
        return cached_listing(repo_id, "HF_HUB_OFFLINE is set")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
    )

    try:
        info = HfApi(endpoint=endpoint()).model_info(repo_id, files_metadata=True)
    except RepositoryNotFoundError:
        raise HFSourceError(f"hf.co/{repo_id} not found (no such repo on {endpoint() or 'huggingface.co'}, "
                            "or a private one: set HF_TOKEN)", 404) from None
    except GatedRepoError:
        raise HFSourceError(f"hf.co/{repo_id} is gated: accept its terms on huggingface.co and set HF_TOKEN",
                            401) from None
    except HfHubHTTPError as e:
        raise HFSourceError(f"pull model manifest: {e}", 502) from None
    except Exception as e:
        if not _is_connection_error(e):
            raise
        where = endpoint() or "https://huggingface.co"
        try:  # as huggingface_hub does: without a connection, what the cache holds
            listing = cached_listing(repo_id, f"{where} cannot be reached ({e})")
        except HFSourceError:
            raise HFSourceError(f"pull model manifest: cannot reach {where} ({e}), and hf.co/{repo_id} is not in the "
                                "local Hugging Face cache", 502) from None
        log.warning("%s cannot be reached (%s): using the cached hf.co/%s", where, e, repo_id)
        return listing
    files: dict[str, HFFile] = {}
    for s in info.siblings or []:
        sha, size = _lfs(s)
        files[s.rfilename] = HFFile(s.rfilename, sha, size)
    return HFListing(repo_id, files)


def locate(ref: HFRef) -> HFSelection:
    """List the repo and select the files ``ref`` stands for (only config.json is downloaded, if needed)."""
    return select(ref, list_repo(ref.repo_id))


def _progress_bar(status: str, digest: str | None, progress: Progress) -> type:
    """A tqdm stand-in for hf_hub_download that turns byte counts into Ollama pull progress events
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

        def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
            pass

        def refresh(self, *args: Any, **kwargs: Any) -> None:
            pass

    return Bar


def download(listing: HFListing, f: HFFile, progress: Progress = no_progress) -> Path:
    """``f`` in the local HF cache (downloaded unless cached; cache-only when the listing is offline)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
    )

    repo = listing.repo_id
    try:
        path = hf_hub_download(repo, f.name, endpoint=endpoint(), local_files_only=listing.offline,
                               cache_dir=cache_dir(), tqdm_class=_progress_bar(f.status, f.digest, progress))
    except (EntryNotFoundError, LocalEntryNotFoundError) as e:
        if listing.offline:
            raise HFSourceError(f"hf.co/{repo}: {f.name} is not in the local Hugging Face cache and "
                                f"{listing.offline_reason}", 404) from None
        raise HFSourceError(f"hf.co/{repo}: {f.name}: {e}", 404) from None
    except GatedRepoError:
        raise HFSourceError(f"hf.co/{repo} is gated: accept its terms on huggingface.co and set HF_TOKEN", 401) from None
    except HfHubHTTPError as e:
        raise HFSourceError(f"downloading {f.name}: {e}", 502) from None
    except Exception as e:
        if not _is_connection_error(e):
            raise
        raise HFSourceError(f"downloading {f.name} from hf.co/{repo}: {e}", 502) from None
    return Path(path)


def fetch(value: str | HFRef, progress: Progress = no_progress) -> tuple[HFSelection, list[tuple[Path, HFFile]]]:
    """Resolve and download ``value``: the selection and each selected file's local path (in the HF cache),
    with Ollama's pull progress (`pulling manifest`, then `pulling <digest>` byte counts per file)."""
    ref = value if isinstance(value, HFRef) else parse_hf_name(value)
    progress(ProgressEvent("pulling manifest"))
    sel = locate(ref)
    log.info("%s: %s from hf.co/%s", ref.display, ", ".join(f.name for f in sel.files), ref.repo_id)
    return sel, [(download(sel.listing, f, progress), f) for f in sel.files]
