"""Docker v2 manifests as Ollama writes them, and Go-compatible JSON encoding.

Byte compatibility matters: the manifest digest reported by /api/tags is the sha256 of
the manifest file, and blobs created from JSON (params, messages, config) are
content-addressed, so the same input must produce the same bytes Ollama produces.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .names import BlobsError

__all__ = [
    "MEDIA_TYPE_MANIFEST",
    "MEDIA_TYPE_MANIFEST_LIST",
    "MEDIA_TYPE_CONFIG",
    "MEDIA_TYPE_MODEL",
    "MEDIA_TYPE_DRAFT",
    "MEDIA_TYPE_ADAPTER",
    "MEDIA_TYPE_PROJECTOR",
    "MEDIA_TYPE_TEMPLATE",
    "MEDIA_TYPE_PROMPT",
    "MEDIA_TYPE_SYSTEM",
    "MEDIA_TYPE_PARAMS",
    "MEDIA_TYPE_MESSAGES",
    "MEDIA_TYPE_LICENSE",
    "MEDIA_TYPE_EMBED",
    "MEDIA_TYPE_TENSOR",
    "MEDIA_TYPE_JSON",
    "MEDIA_TYPE_TUNING",
    "InvalidManifestError",
    "Layer",
    "Manifest",
    "marshal_json",
]

MEDIA_TYPE_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_TYPE_MANIFEST_LIST = "application/vnd.ollama.manifest.list.v2+json"
MEDIA_TYPE_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_TYPE_MODEL = "application/vnd.ollama.image.model"
MEDIA_TYPE_DRAFT = "application/vnd.ollama.image.draft"
MEDIA_TYPE_ADAPTER = "application/vnd.ollama.image.adapter"
MEDIA_TYPE_PROJECTOR = "application/vnd.ollama.image.projector"
MEDIA_TYPE_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_TYPE_PROMPT = "application/vnd.ollama.image.prompt"
MEDIA_TYPE_SYSTEM = "application/vnd.ollama.image.system"
MEDIA_TYPE_PARAMS = "application/vnd.ollama.image.params"
MEDIA_TYPE_MESSAGES = "application/vnd.ollama.image.messages"
MEDIA_TYPE_LICENSE = "application/vnd.ollama.image.license"
MEDIA_TYPE_EMBED = "application/vnd.ollama.image.embed"
MEDIA_TYPE_TENSOR = "application/vnd.ollama.image.tensor"
MEDIA_TYPE_JSON = "application/vnd.ollama.image.json"
#: tandem's own layer: where speculation PARAMETERs came from (``tandem bench --apply``), one claim per
#: parameter. Ollama skips layer types it does not know, so a tuned model stays an ordinary Ollama model.
MEDIA_TYPE_TUNING = "application/vnd.tandem.tuning"
#: tandem's own layers: the Hugging Face folder a model (or its DRAFT) was created from, one layer per file named
#: by its path within the folder, kept for the vllm engine (``PARAMETER engine vllm``), which loads the folder.
MEDIA_TYPE_HF_FILE = "application/vnd.tandem.hf.file"
MEDIA_TYPE_HF_DRAFT_FILE = "application/vnd.tandem.hf.draft.file"


class InvalidManifestError(BlobsError, ValueError):
    pass


# --- Go encoding/json compatible marshalling -------------------------------------------

# Go's encoder HTML-escapes by default (SetEscapeHTML(true)) and always escapes the JS
# line terminators; Python leaves all of these raw.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _go_string(s: str) -> str:
    # Python and Go agree on the rest: \" \\ \n \r \t \b \f and lowercase \u00XX for other
    # control characters, raw UTF-8 for everything else.
    return json.dumps(s, ensure_ascii=False).translate(_GO_ESCAPES)


def _go_float(f: float) -> str:
    """Format a float64 the way encoding/json does (shortest round-trip digits).

    Python's repr differs for integral values ('1.0' vs Go's '1') and exponents
    ('1e-07' vs '1e-7', '1e+16' vs '10000000000000000').
    """
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {f!r}")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    d = Decimal(repr(f))
    if 1e-6 <= abs(f) < 1e21:
        return format(d.normalize(), "f")
    sign, digits, exp = d.normalize().as_tuple()
    mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    e = exp + len(digits) - 1
    return f"{'-' if sign else ''}{mant}e{'-' if e < 0 else '+'}{abs(e):02d}".replace("e-0", "e-")


def _encode(obj: Any, out: list[str], sort_keys: bool) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_go_string(obj))
    elif isinstance(obj, int):
        out.append(str(int(obj)))
    elif isinstance(obj, float):
        out.append(_go_float(obj))
    elif isinstance(obj, dict):
        items = sorted(obj.items()) if sort_keys else obj.items()
        out.append("{")
        for i, (k, v) in enumerate(items):
            if not isinstance(k, str):
                raise TypeError(f"json: unsupported map key type {type(k).__name__}")
            if i:
                out.append(",")
            out.append(_go_string(k))
            out.append(":")
            _encode(v, out, sort_keys)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _encode(v, out, sort_keys)
        out.append("]")
    else:
        raise TypeError(f"json: unsupported type {type(obj).__name__}")


def marshal_json(obj: Any, *, sort_keys: bool = False, newline: bool = False) -> bytes:
    """Encode like Go: json.Marshal (``newline=False``) or json.Encoder.Encode (``newline=True``).

    ``sort_keys=True`` reproduces how Go encodes a ``map[string]any`` (Ollama's params
    layer); struct-like data keeps its given key order.
    """
    out: list[str] = []
    _encode(obj, out, sort_keys)
    if newline:
        out.append("\n")
    return "".join(out).encode("utf-8")


# --- Manifest types ----------------------------------------------------------------------


def _req_str(d: dict, key: str) -> str:
    v = d.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise InvalidManifestError(f"manifest field {key!r} must be a string")
    return v


@dataclass
class Layer:
    media_type: str
    digest: str  # 'sha256:<hex>'
    size: int
    from_: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # Field order and omitempty follow Ollama's Go struct tags.
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.from_:
            d["from"] = self.from_
        if self.name:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Layer":
        if not isinstance(d, dict):
            raise InvalidManifestError("manifest layer must be an object")
        size = d.get("size", 0)
        if size is None:
            size = 0
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidManifestError("manifest layer size must be a non-negative integer")
        return cls(
            media_type=_req_str(d, "mediaType"),
            digest=_req_str(d, "digest"),
            size=size,
            from_=_req_str(d, "from") or None,
            name=_req_str(d, "name") or None,
        )


@dataclass
class Manifest:
    config: Layer
    layers: list[Layer]
    schema_version: int = 2
    media_type: str = MEDIA_TYPE_MANIFEST
    # Newer Ollama tags single manifests with these (omitempty); kept so they round-trip.
    runner: str | None = None
    format: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
        }
        if self.runner:
            d["runner"] = self.runner
        if self.format:
            d["format"] = self.format
        return d

    def to_json(self) -> bytes:
        """The exact bytes Ollama's WriteManifest produces (json.Encoder: compact + '\\n')."""
        return marshal_json(self.to_dict(), newline=True)

    @classmethod
    def from_dict(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise InvalidManifestError("manifest must be a JSON object")
        if d.get("mediaType") == MEDIA_TYPE_MANIFEST_LIST:
            raise InvalidManifestError("manifest is a manifest list; resolve it through a BlobStore")
        layers = d.get("layers")
        if layers is None:
            layers = []
        if not isinstance(layers, list):
            raise InvalidManifestError("manifest layers must be an array")
        schema = d.get("schemaVersion", 0)
        if not isinstance(schema, int) or isinstance(schema, bool):
            raise InvalidManifestError("manifest schemaVersion must be an integer")
        config = d.get("config")
        return cls(
            config=Layer.from_dict(config) if config is not None else Layer("", "", 0),
            layers=[Layer.from_dict(x) for x in layers],
            schema_version=schema,
            media_type=_req_str(d, "mediaType"),
            runner=_req_str(d, "runner") or None,
            format=_req_str(d, "format") or None,
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> "Manifest":
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidManifestError(f"invalid manifest JSON: {e}") from e
        return cls.from_dict(obj)

    def layer(self, media_type: str) -> Layer | None:
        return next((x for x in self.layers if x.media_type == media_type), None)

    def layers_of(self, media_type: str) -> list[Layer]:
        return [x for x in self.layers if x.media_type == media_type]

    def all_layers(self) -> list[Layer]:
        """Config first, then layers; entries without a digest are skipped."""
        return [x for x in [self.config, *self.layers] if x.digest]

    def blobs(self) -> list[Layer]:
        """all_layers() with each digest once (a blob two layers share is fetched or sent once)."""
        seen: dict[str, Layer] = {}
        for layer in self.all_layers():
            seen.setdefault(layer.digest, layer)
        return list(seen.values())

    @property
    def size(self) -> int:
        """Sum of config and layer sizes, like Ollama's Manifest.Size (shared blobs count twice)."""
        return self.config.size + sum(x.size for x in self.layers)
