"""Building a model in the blob store from a `CreateRequest` (the one code path behind CLI and API).

The order follows Ollama's CreateHandler: resolve the base (FROM model name or uploaded files), add
the draft, then the text layers, then the config blob, then the manifest. Nothing becomes visible
until the manifest is written, and the manifest is written atomically, so a failed create never leaves a
half-built model; the blobs it wrote itself (converted, quantized, text and config layers) are removed as it
fails, unless some manifest references them. Blobs that existed before (a client's uploads) are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from blobs import (
    MEDIA_TYPE_ADAPTER,
    MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_DRAFT,
    MEDIA_TYPE_HF_DRAFT_FILE,
    MEDIA_TYPE_HF_FILE,
    MEDIA_TYPE_LICENSE,
    MEDIA_TYPE_MESSAGES,
    MEDIA_TYPE_MODEL,
    MEDIA_TYPE_PARAMS,
    MEDIA_TYPE_PROJECTOR,
    MEDIA_TYPE_PROMPT,
    MEDIA_TYPE_SYSTEM,
    MEDIA_TYPE_TEMPLATE,
    MEDIA_TYPE_TUNING,
    BlobStore,
    InvalidNameError,
    Layer,
    Manifest,
    ModelName,
    ModelNotFoundError,
    marshal_json,
)
from engine.contract.gguf import read_metadata
from engine.contract.options import OPTION_ALIASES, Options
from modelfile.gotemplate import TemplateError, parse_template

from .adapter import adapter_layer
from .architectures import folder_converter
from .hf_to_gguf import convert_folder
from .hf_tokenizer import has_tokenizer
from .inspect import GGUFSummary, check_draft_pair, check_runnable, summarize_gguf
from .uploads import sort_weights, split_projectors
from .pair_precheck import precheck_folder_pair
from .quantize import parse_quant_type, quantize_gguf
from .request import CreateError, CreateRequest, Progress, ProgressEvent, no_progress
from .hf.safetensors import folder_paths

_SEMVER_RE = re.compile(r"^v?(\d+)(\.\d+)?(\.\d+)?(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Weights:
    layer: Layer
    summary: GGUFSummary


@contextmanager
def discarding_new_blobs_on_error(store: BlobStore) -> Iterator[set[str]]:
    """Record the blobs written in this block (by this thread); if it raises, remove those that no manifest
    references, at once rather than at the next `serve`. Yields the recorded digests, so a caller whose create
    continues elsewhere can discard them when that part fails (`store.discard_unreferenced`)."""
    with store.recording_new_blobs() as written:
        try:
            yield written
        except BaseException:
            discard_quietly(store, written)
            raise


def discard_quietly(store: BlobStore, digests: set[str]) -> None:
    """store.discard_unreferenced, logged rather than raised: cleaning up must not hide the create's own error."""
    try:
        removed = store.discard_unreferenced(digests)
    except Exception as e:  # noqa: BLE001 - the original failure is what the caller reports
        log.warning("could not remove the blobs of a failed create: %s", e)
        return
    if removed:
        log.info("removed %d blob(s) of a failed create", len(removed))


def create_model(store: BlobStore, req: CreateRequest, progress: Progress = no_progress) -> ModelName:
    """Build ``req.model`` in ``store``; returns the stored name. Raises CreateError on bad input; the blobs
    a failed create wrote are gone when it raises."""
    with discarding_new_blobs_on_error(store):
        return _create_model(store, req, progress)


def _create_model(store: BlobStore, req: CreateRequest, progress: Progress) -> ModelName:
    try:
        name = ModelName.parse(req.model)
    except InvalidNameError:
        raise CreateError("invalid model name") from None
    req.check()
    # a projector GGUF among the FROM files (a second FROM) is the model's vision layer, not its weights
    files, projectors = split_projectors(store, req.files)
    if projectors and not files and not req.from_:
        raise CreateError("FROM: only a projector was given; FROM the model's GGUF too (a projector adds vision to it)")
    req = replace(req, files=files)

    base_layers: list[Layer] = []
    base_config: dict[str, Any] = {}
    if req.from_ and not req.files:
        base_layers, base_config = _load_base(store, req.from_)

    if req.files and req.draft_files:
        precheck_folder_pair(req.files, req.draft_files, store.blob_path)
    target = _target_weights(store, req, base_layers, progress)
    draft = _draft_weights(store, req, base_layers, target, progress)

    layers: list[Layer] = [target.layer]
    if draft is not None:
        layers.append(draft.layer)
    layers += _projector_layers(store, projectors, base_layers, target.summary)
    layers += [l for l in base_layers if l.media_type == MEDIA_TYPE_ADAPTER]
    layers += _vllm_folder_layers(store, req, base_layers)
    if req.adapters:
        layers.append(adapter_layer(store, req.adapters, store.blob_path(target.layer.digest), progress))

    layers += _text_layers(store, req, base_layers, progress)

    config = _config(target.summary, draft.summary if draft else None, req, base_config)
    config_digest, config_size = store.add_json_blob(config)
    manifest = Manifest(config=Layer(MEDIA_TYPE_CONFIG, config_digest, config_size), layers=layers)
    progress(ProgressEvent("writing manifest"))
    store.write_manifest(name, manifest)
    progress(ProgressEvent("success"))
    return name


def _load_base(store: BlobStore, from_: str) -> tuple[list[Layer], dict[str, Any]]:
    try:
        base = store.read_manifest(from_)
    except InvalidNameError:
        raise CreateError(f"invalid model name {from_!r} in FROM") from None
    except ModelNotFoundError:
        raise CreateError(f"model '{from_}' not found", status=404) from None
    config = json.loads(store.read_blob(base.config.digest) or b"{}")
    parent = store.resolve(from_).display()
    layers = []
    for layer in base.layers:
        if layer.media_type in (MEDIA_TYPE_MODEL, MEDIA_TYPE_DRAFT) and not layer.from_:
            layer = Layer(layer.media_type, layer.digest, layer.size, from_=parent, name=layer.name)
        layers.append(layer)
    return layers, config


def _gguf_from_files(store: BlobStore, files: dict[str, str], role: str, progress: Progress = no_progress,
                     check: Callable[[GGUFSummary], None] | None = None, donor_digest: str | None = None) -> str:
    """The digest of the one GGUF among uploaded files; a safetensors folder is converted into one.

    ``check`` vets a converted GGUF before it enters the store; ``donor_digest`` is the GGUF whose
    tokenizer an MTP head uploaded without tokenizer files adopts (the target's).
    """
    ggufs, safetensors = sort_weights(store, files, role)
    if ggufs and safetensors:
        raise CreateError(f"{role}: both GGUF and safetensors weights were given; give one model")
    if safetensors:
        return _converted_gguf(store, files, role, progress, check, donor_digest)
    if not ggufs:
        raise CreateError(f"no GGUF file among the {role} files ({', '.join(sorted(files))})")
    if len(set(ggufs)) > 1:
        raise CreateError(f"{role}: expected one GGUF file, got {len(ggufs)} (split GGUFs are not supported; merge them first)")
    return ggufs[0]


def _converted_gguf(store: BlobStore, files: dict[str, str], role: str, progress: Progress,
                    check: Callable[[GGUFSummary], None] | None, donor_digest: str | None) -> str:
    """Convert an uploaded Hugging Face folder to GGUF and add it to the store (atomically, once vetted)."""
    paths = folder_paths({name: store.blob_path(digest) for name, digest in files.items()})
    donor = None
    if donor_digest is not None and not has_tokenizer(paths):
        donor, _ = read_metadata(store.blob_path(donor_digest))
    status = "converting model" if role == "FROM" else "converting draft model"
    # As for quantizing: the GGUF is written outside the store and copied in through add_file, which
    # verifies and renames atomically; a failure before that leaves the store as it was.
    with tempfile.TemporaryDirectory(prefix="tandem-convert-") as tmp_dir:
        tmp = Path(tmp_dir) / "model.gguf"
        progress(ProgressEvent(status, total=0, completed=0))
        report = lambda done, total: progress(ProgressEvent(status, total=total, completed=done))  # noqa: E731
        converter = folder_converter(paths)  # an architecture with a conversion of its own (bert, eagle3)
        if converter is not None:
            converter(paths, tmp, role, progress=report, tokenizer_donor=donor)
        else:
            convert_folder(paths, tmp, role, tokenizer_donor=donor, progress=report)
        if check is not None:
            check(summarize_gguf(tmp))
        digest, _ = store.add_file(tmp)
    return digest


def _quantized_layer(store: BlobStore, digest: str, quant: str, media_type: str, progress: Progress) -> tuple[str, int]:
    plan = parse_quant_type(quant)
    status = f"quantizing {'draft ' if media_type == MEDIA_TYPE_DRAFT else ''}{plan.target} model"
    # The quantized GGUF is written outside the store (GGUFWriter needs a path) and then copied in
    # through write_blob, which verifies and renames atomically; a crash leaves nothing in the store.
    with tempfile.TemporaryDirectory(prefix="tandem-quantize-") as tmp_dir:
        tmp = os.path.join(tmp_dir, "model.gguf")
        progress(ProgressEvent(status, digest=digest, total=0, completed=0))
        quantize_gguf(store.blob_path(digest), tmp, plan,
                      progress=lambda done, total: progress(ProgressEvent(status, digest=digest, total=total, completed=done)))
        return store.add_file(tmp)


def _weights(store: BlobStore, digest: str, media_type: str, quant: str | None, role: str,
             progress: Progress, from_: str | None = None) -> _Weights:
    progress(ProgressEvent("parsing GGUF"))
    summary = summarize_gguf(store.blob_path(digest))
    check_runnable(summary, role)
    size = store.blob_path(digest).stat().st_size
    if quant:
        digest, size = _quantized_layer(store, digest, quant, media_type, progress)
        summary = summarize_gguf(store.blob_path(digest))
    progress(ProgressEvent(f"using existing layer {digest}"))
    return _Weights(Layer(media_type, digest, size, from_=from_), summary)


def _target_weights(store: BlobStore, req: CreateRequest, base_layers: list[Layer], progress: Progress) -> _Weights:
    if req.files:
        digest = _gguf_from_files(store, req.files, "FROM", progress, check=lambda s: check_runnable(s, "model"))
        return _weights(store, digest, MEDIA_TYPE_MODEL, req.quantize, "model", progress)
    model = next((l for l in base_layers if l.media_type == MEDIA_TYPE_MODEL), None)
    if model is None:
        raise CreateError(f"model '{req.from_}' has no model layer")
    w = _weights(store, model.digest, MEDIA_TYPE_MODEL, req.quantize, "model", progress, from_=model.from_)
    return w


def _draft_weights(store: BlobStore, req: CreateRequest, base_layers: list[Layer], target: _Weights,
                   progress: Progress) -> _Weights | None:
    if req.draft_files:
        def vet(summary: GGUFSummary) -> None:
            check_runnable(summary, "draft")
            check_draft_pair(target.summary, summary)

        digest = _gguf_from_files(store, req.draft_files, "DRAFT", progress, check=vet,
                                  donor_digest=target.layer.digest)
        if digest == target.layer.digest or (req.files and digest in req.files.values()):
            raise CreateError("DRAFT must not reference the same model as FROM")
        draft = _weights(store, digest, MEDIA_TYPE_DRAFT, req.draft_quantize, "draft", progress)
    else:
        inherited = next((l for l in base_layers if l.media_type == MEDIA_TYPE_DRAFT), None)
        if inherited is None:
            return None
        draft = _weights(store, inherited.digest, MEDIA_TYPE_DRAFT, req.draft_quantize, "draft", progress,
                         from_=inherited.from_)
    check_draft_pair(target.summary, draft.summary)
    return draft


def _projector_layers(store: BlobStore, projectors: list[str], base_layers: list[Layer],
                      target: GGUFSummary) -> list[Layer]:
    """Ollama's projector layer: the one given (checked against the model's width), else the base model's."""
    if not projectors:
        return [l for l in base_layers if l.media_type == MEDIA_TYPE_PROJECTOR]
    if len(projectors) > 1:
        raise CreateError(f"FROM: {len(projectors)} projector GGUFs were given; a model takes one")
    [digest] = projectors
    metadata, _ = read_metadata(store.blob_path(digest))
    width = metadata.get("clip.vision.projection_dim") or metadata.get("clip.audio.projection_dim")
    if isinstance(width, int) and target.embedding_length and width != target.embedding_length:
        raise CreateError(f"the projector's output width {width} does not match the model's embedding width "
                          f"{target.embedding_length}: it was made for another model")
    return [Layer(MEDIA_TYPE_PROJECTOR, digest, store.blob_path(digest).stat().st_size)]


def _vllm_folder_layers(store: BlobStore, req: CreateRequest, base_layers: list[Layer]) -> list[Layer]:
    """For a model on the vllm engine (``PARAMETER engine vllm``), the Hugging Face folders it was created from,
    one layer per file (vLLM loads the folder, not tandem's GGUF); else none. A model that inherits its weights
    inherits its folders; one whose weights came from a GGUF has no folder vLLM could load and is refused."""
    params: dict[str, Any] = {}
    inherited_params = next((l for l in base_layers if l.media_type == MEDIA_TYPE_PARAMS), None)
    if inherited_params is not None:
        params.update(json.loads(store.read_blob(inherited_params.digest)))
    params.update(req.parameters)
    options = Options.merged(params, None)
    if options.engine != "vllm":
        return []
    from engine.contract.vllm_launch import native_only_option

    why = native_only_option(options)
    if why is not None:
        raise CreateError(why)
    layers: list[Layer] = []
    for files, media_type, role in ((req.files, MEDIA_TYPE_HF_FILE, "FROM"),
                                    (req.draft_files, MEDIA_TYPE_HF_DRAFT_FILE, "DRAFT")):
        if files:
            if not any(name.endswith(".safetensors") for name in files):
                raise CreateError(f"the vllm engine loads a Hugging Face safetensors folder, and {role} is a GGUF "
                                  "file; create the model FROM the folder (or an hf.co/ repository without GGUF "
                                  "files), or serve it with engine native")
            layers += [Layer(media_type, digest, store.blob_path(digest).stat().st_size, name=name)
                       for name, digest in sorted(files.items())]
        else:
            kept = [l for l in base_layers if l.media_type == media_type]
            if role == "FROM" and not kept:
                raise CreateError(f"the vllm engine loads a Hugging Face safetensors folder, and model "
                                  f"'{req.from_}' was not created from one (or not for the vllm engine); create "
                                  "the model FROM the folder, or serve it with engine native")
            if role == "DRAFT" and not kept and any(l.media_type == MEDIA_TYPE_DRAFT for l in base_layers):
                raise CreateError(f"the vllm engine loads the DRAFT as a Hugging Face safetensors folder, and model "
                                  f"'{req.from_}' has a DRAFT without one; give DRAFT as a folder")
            layers += kept
    return layers


def _text_layer(store: BlobStore, media_type: str, data: bytes, progress: Progress) -> Layer:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    existed = store.has_blob(digest)
    digest, size = store.write_blob(data, expected_digest=digest)
    progress(ProgressEvent(f"{'using existing' if existed else 'creating new'} layer {digest}"))
    return Layer(media_type, digest, size)


def _text_layers(store: BlobStore, req: CreateRequest, base_layers: list[Layer], progress: Progress) -> list[Layer]:
    """Template, system, params, messages and license layers: the request's, else the base model's."""
    inherited = {l.media_type: l for l in base_layers}
    out: list[Layer] = []

    if req.template is not None:
        _check_template(req.template)
        out.append(_text_layer(store, MEDIA_TYPE_TEMPLATE, req.template.encode(), progress))
    elif MEDIA_TYPE_TEMPLATE in inherited:
        out.append(inherited[MEDIA_TYPE_TEMPLATE])
    elif MEDIA_TYPE_PROMPT in inherited:
        out.append(inherited[MEDIA_TYPE_PROMPT])

    if req.system is not None:
        out.append(_text_layer(store, MEDIA_TYPE_SYSTEM, req.system.encode(), progress))
    elif MEDIA_TYPE_SYSTEM in inherited:
        out.append(inherited[MEDIA_TYPE_SYSTEM])

    # Parameters merge over the base model's (Ollama's setParameters): a request overrides per key.
    params: dict[str, Any] = {}
    if MEDIA_TYPE_PARAMS in inherited:
        params.update(json.loads(store.read_blob(inherited[MEDIA_TYPE_PARAMS].digest)))
    params.update(req.parameters)
    if params:
        out.append(_text_layer(store, MEDIA_TYPE_PARAMS, marshal_json(params), progress))
    claims = _tuning(store, req, inherited.get(MEDIA_TYPE_TUNING), params)
    if claims:
        out.append(_text_layer(store, MEDIA_TYPE_TUNING, marshal_json({"parameters": claims}), progress))

    if req.messages:
        msgs = [{"role": m["role"], "content": m["content"]} for m in req.messages]
        out.append(_text_layer(store, MEDIA_TYPE_MESSAGES, marshal_json(msgs), progress))
    elif MEDIA_TYPE_MESSAGES in inherited:
        out.append(inherited[MEDIA_TYPE_MESSAGES])

    if req.license:
        out += [_text_layer(store, MEDIA_TYPE_LICENSE, text.encode(), progress) for text in req.license]
    else:
        out += [l for l in base_layers if l.media_type == MEDIA_TYPE_LICENSE]
    return out


def _tuning(store: BlobStore, req: CreateRequest, inherited: Layer | None,
            params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Where each parameter came from: the base model's claims, less those for parameters this create
    sets without one (set by hand, so no longer the measured value), plus this create's own. A claim
    survives only while the parameter still holds the value it was made for."""
    claims: dict[str, dict[str, Any]] = {}
    if inherited is not None:
        try:
            old = json.loads(store.read_blob(inherited.digest)).get("parameters", {})
        except (ValueError, AttributeError):
            old = {}  # an unreadable claim is no claim: the parameters themselves are what count
        if isinstance(old, dict):
            by_hand = {OPTION_ALIASES.get(k, k) for k in req.parameters}  # n_max sets draft_num_predict
            claims.update({k: v for k, v in old.items() if k not in by_hand and isinstance(v, dict)})
    claims.update(req.tuning)
    return {k: v for k, v in claims.items() if k in params and v.get("value") == params[k]}


def _check_template(text: str) -> None:
    """Ollama refuses a TEMPLATE that does not parse (400 `template error: ...`)."""
    try:
        parse_template(text)
    except TemplateError as e:
        raise CreateError(f"template error: {e}") from None


def _config(target: GGUFSummary, draft: GGUFSummary | None, req: CreateRequest, base: dict[str, Any]) -> dict[str, Any]:
    """Ollama's ConfigV2, field order as Go marshals the struct."""
    config: dict[str, Any] = {
        "model_format": "gguf",
        "model_family": target.architecture,
        "model_families": [target.architecture],
        "model_type": target.parameter_size,
        "file_type": target.file_type,
    }
    renderer = req.renderer if req.renderer is not None else base.get("renderer")
    parser = req.parser if req.parser is not None else base.get("parser")
    requires = _semver(req.requires) if req.requires is not None else base.get("requires")
    if renderer:
        config["renderer"] = renderer
    if parser:
        config["parser"] = parser
    if requires:
        config["requires"] = requires
    if target.context_length:
        config["context_length"] = target.context_length
    if target.embedding_length:
        config["embedding_length"] = target.embedding_length
    if draft is not None:
        config["draft"] = {"model_format": "gguf", "architecture": draft.architecture}
    config["architecture"] = "amd64"
    config["os"] = "linux"
    config["rootfs"] = {"type": "layers", "diff_ids": []}
    return config


def _semver(value: str) -> str:
    v = value.strip()
    if not _SEMVER_RE.match(v):
        raise CreateError("requires must be a valid semver (e.g. 0.14.0)")
    return v[1:] if v.startswith("v") else v
