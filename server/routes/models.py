"""Ollama's model-management endpoints: /api/create and /api/blobs, /api/tags, /api/show, /api/copy,
/api/delete, /api/ps and /api/version.

Create answers NDJSON progress like pull; the others answer one JSON object (or an empty 200).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from blobs import (
    BlobsError,
    DigestMismatchError,
    InvalidDigestError,
    InvalidNameError,
    ModelName,
    ModelNotFoundError,
    NoSpaceError,
    parse_digest,
)
from blobs.model import StoredModel, load_stored_model
from engine.contract.options import coerce_options
from importer import (
    CreateError,
    CreateRequest,
    LocalBlobSink,
    PathGate,
    ProgressEvent,
    create_model,
    discard_quietly,
    discarding_new_blobs_on_error,
    hf_source,
    request_from_modelfile,
)
from modelfile import ParamError, ParseError, parse

from ..context import ServerContext, ctx_of
from ..limits import BodyTooLarge, blob_chunks, content_length_over
from ..gojson import (
    ApiError,
    go_json_kind,
    json_response,
    read_json,
    read_struct,
    rfc3339,
)
from ..hf_pull import fetch_into_store
from ..ndjson import as_api_error, merge_last, stream_or_collect, thread_progress
from ..effective_options import engine_info, speculation_info
from ..show import model_info, modelfile_text, parameters_text, projector_info, tensor_list
from ..types import CopyBody, DeleteBody, ShowBody
from ..validation import stored_model

log = logging.getLogger("tandem.server")

router = APIRouter()


def _old_form_request(ctx: ServerContext, body: dict[str, Any]) -> CreateRequest:
    """The pre-2025 create body `{"name","modelfile","path"}`: the Modelfile is parsed here and its
    files are paths on this machine, relative to `path` (the Modelfile's location) when given. Every path,
    `path` included, is held to TANDEM_CREATE_PATHS (importer.PathGate): by default none may be read."""
    name = body.get("model") or body.get("name")
    if not name or not isinstance(name, str):
        raise ApiError(400, "model is required")
    text = body.get("modelfile") or ""
    path = body.get("path") or ""
    if not isinstance(text, str) or not isinstance(path, str):
        raise ApiError(400, "modelfile and path must be strings")
    gate = PathGate(ctx.settings.create_paths)
    base = gate.admit(Path(path).expanduser(), "path", path) if path else Path.cwd()
    if path and base.is_file():
        if not text:
            text = base.read_text(encoding="utf-8", errors="replace")
        base = base.parent
    if not text:
        raise ApiError(400, "neither 'from' or 'files' was specified")
    try:
        commands = parse(text)
    except ParseError as e:
        raise ApiError(400, str(e)) from None
    warnings: list[str] = []
    req = request_from_modelfile(commands, name, base.resolve(), LocalBlobSink(ctx.store), warnings, gate=gate)
    for w in warnings:
        log.warning("create %s: %s", name, w)
    quant = body.get("quantize") or body.get("quantization")
    if isinstance(quant, str) and quant:
        req.quantize = quant
    if isinstance(body.get("draft_quantize"), str) and body["draft_quantize"]:
        req.draft_quantize = body["draft_quantize"]
    return req


@router.post("/api/create")
async def create(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await read_json(request, "api.CreateRequest")
    stream = body.get("stream")
    stream = True if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(400, f"json: cannot unmarshal {go_json_kind(stream)} into Go struct field CreateRequest.stream of type bool")
    old_form = body.get("modelfile") and not body.get("files") and not body.get("from")
    uploaded: set[str] = set()  # blobs the old form copied in: removed if the create then fails

    def old_form_request() -> CreateRequest:
        with discarding_new_blobs_on_error(ctx.store) as written:
            req = _old_form_request(ctx, body)
        uploaded.update(written)
        return req

    try:
        if old_form:
            req = await anyio.to_thread.run_sync(old_form_request)
        else:
            req = CreateRequest.from_json(body)
        ModelName.parse(req.model)
    except (CreateError, InvalidNameError, BlobsError, OSError) as e:
        await anyio.to_thread.run_sync(discard_quietly, ctx.store, uploaded)
        raise as_api_error(e) from None

    def work(progress: Callable[[ProgressEvent], None]) -> None:
        if req.from_ and not req.files and hf_source.is_hf_name(req.from_) and not LocalBlobSink(ctx.store).has_model(req.from_):
            # `"from": "hf.co/org/repo:tag"` of a model not pulled yet: pulled first, as Ollama does.
            req.files = fetch_into_store(ctx.store, hf_source.parse_hf_name(req.from_), progress)
            req.from_ = None
        try:
            name = create_model(ctx.store, req, progress)
        except BaseException:
            discard_quietly(ctx.store, uploaded)
            raise
        log.info("created %s", name.display())

    return await stream_or_collect(thread_progress(work), stream, merge_last)


def _blob_digest(digest: str) -> str:
    try:
        return parse_digest(digest)
    except InvalidDigestError:
        raise ApiError(400, "invalid digest format") from None


@router.head("/api/blobs/{digest}")
async def head_blob(request: Request, digest: str) -> Response:
    canonical = _blob_digest(digest)
    if not ctx_of(request).store.has_blob(canonical):
        return json_response({"error": f'blob "{digest}" not found'}, 404)
    return Response(status_code=200)


@router.post("/api/blobs/{digest}")
async def post_blob(request: Request, digest: str) -> Response:
    ctx = ctx_of(request)
    canonical = _blob_digest(digest)
    if ctx.store.has_blob(canonical):
        return Response(status_code=200)
    limit = ctx.settings.max_blob_bytes
    if content_length_over(request.headers, limit):
        raise BodyTooLarge("blob", limit)
    chunks = request.stream().__aiter__()

    def body_chunks() -> Any:
        while True:
            try:
                chunk = anyio.from_thread.run(chunks.__anext__)
            except StopAsyncIteration:
                return
            if chunk:
                yield chunk

    try:
        got, size = await anyio.to_thread.run_sync(lambda: ctx.store.write_blob(blob_chunks(body_chunks(), limit),
                                                                                 expected_digest=canonical))
    except DigestMismatchError as e:
        raise ApiError(400, f'digest mismatch, expected "{digest}", got "{e.got}"') from None
    except NoSpaceError as e:  # Ollama's 500 with Go's text; the partial file is already gone
        raise ApiError(500, str(e)) from None
    log.info("stored blob %s (%d bytes)", got, size)
    return Response(status_code=201)


def _tags(ctx: ServerContext) -> dict[str, Any]:
    models = []
    for entry in ctx.store.list_models():
        try:
            m = load_stored_model(ctx.store, entry.name)
        except (BlobsError, OSError, ValueError) as e:
            log.warning("skipping %s: %s", entry.name, e)
            continue
        name = entry.name.display()
        models.append({"name": name, "model": name, "modified_at": rfc3339(entry.modified_at), "size": entry.size,
                       "digest": entry.digest, "details": m.details()})
    return {"models": models}


@router.get("/api/tags")
@router.head("/api/tags")
async def tags(request: Request) -> Response:
    return json_response(await anyio.to_thread.run_sync(_tags, ctx_of(request)))


def _show(ctx: ServerContext, req: ShowBody, name: str) -> dict[str, Any]:
    model = stored_model(ctx, name, invalid_status=400)
    params = dict(model.params)
    try:  # Ollama's show applies the request's options over the model's parameters
        params.update(coerce_options(req.options))
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    if req.system:
        model = dataclasses.replace(model, system=req.system)
    prompting = ctx.prompts.get(model)
    out: dict[str, Any] = {}
    if model.licenses:
        out["license"] = "\n".join(model.licenses)
    out["modelfile"] = modelfile_text(dataclasses.replace(model, params=params))
    if params:
        out["parameters"] = parameters_text(params)
    if prompting.template_text:
        out["template"] = prompting.template_text
    if model.system:
        out["system"] = model.system
    out["details"] = model.details()
    if model.messages:
        out["messages"] = model.messages
    out["model_info"] = model_info(model, verbose=req.verbose)
    if model.projector_path is not None:
        out["projector_info"] = projector_info(model, verbose=req.verbose)
    # Ollama's ShowHandler fills `tensors` for every GGUF model, verbose or not (its CLI prints them
    # only with --verbose).
    out["tensors"] = tensor_list(model)
    out["capabilities"] = prompting.capabilities()
    out["modified_at"] = rfc3339(model.modified_at)
    out["speculation"] = speculation_info(model, req.options, prompting.facts.has_mtp_head)
    out["engine"] = engine_info(model, req.options, ctx.settings)
    return out


@router.post("/api/show")
async def show(request: Request) -> Response:
    ctx = ctx_of(request)
    req: ShowBody = await read_struct(request, ShowBody, "api.ShowRequest")
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    return json_response(await anyio.to_thread.run_sync(_show, ctx, req, name))


@router.post("/api/copy")
async def copy(request: Request) -> Response:
    ctx = ctx_of(request)
    req: CopyBody = await read_struct(request, CopyBody, "api.CopyRequest")
    try:
        ModelName.parse(req.source)
    except InvalidNameError:
        raise ApiError(400, f"source {json.dumps(req.source)} is invalid") from None
    try:
        ModelName.parse(req.destination)
    except InvalidNameError:
        raise ApiError(400, f"destination {json.dumps(req.destination)} is invalid") from None
    try:
        await anyio.to_thread.run_sync(ctx.store.copy, req.source, req.destination)
    except ModelNotFoundError:
        raise ApiError(404, f"model {json.dumps(req.source)} not found") from None
    log.info("copied %s to %s", req.source, req.destination)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete(request: Request) -> Response:
    ctx = ctx_of(request)
    req: DeleteBody = await read_struct(request, DeleteBody, "api.DeleteRequest")
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    try:
        model = await anyio.to_thread.run_sync(load_stored_model, ctx.store, name)
    except InvalidNameError:
        raise ApiError(400, "invalid model name") from None
    except ModelNotFoundError:
        raise ApiError(404, f"model '{name}' not found") from None
    try:
        await anyio.to_thread.run_sync(ctx.store.delete, name)
    except ModelNotFoundError:
        raise ApiError(404, f"model '{name}' not found") from None
    # Its engine goes too, unless another name (a copy) still runs on the same weights.
    if not await anyio.to_thread.run_sync(_weights_in_use, ctx, model):
        await ctx.lifecycle.unload(model)
    log.info("deleted %s", name)
    return Response(status_code=200)


def _weights_in_use(ctx: ServerContext, model: StoredModel) -> bool:
    for entry in ctx.store.list_models():
        try:
            other = load_stored_model(ctx.store, entry.name)
        except (BlobsError, OSError, ValueError):
            continue
        if (other.model_path, other.draft_path) == (model.model_path, model.draft_path):
            return True
    return False


@router.get("/api/ps")
async def ps(request: Request) -> Response:
    ctx = ctx_of(request)
    models = []
    for r in ctx.lifecycle.loaded():
        facts = r.facts
        size = facts.memory_bytes or r.model.size
        on_gpu = facts.device.startswith("cuda")
        models.append({
            "name": r.name, "model": r.name, "size": size, "digest": r.model.digest, "details": r.model.details(),
            "expires_at": rfc3339(r.expires_at.astimezone()), "size_vram": size if on_gpu else 0,
            "context_length": r.spec.num_ctx,
            # tandem's addition: what runs it
            "engine": {"pid": r.engine.pid, "backend": facts.backend, "device": facts.device,
                       "weight_format": facts.weight_format, "speculative_method": facts.speculative_method,
                       "endpoint": facts.endpoint, "attached": facts.attached,
                       "draft_architecture": facts.draft_architecture,
                       "draft_weight_format": facts.draft_weight_format,
                       # sequences it serves at once (TANDEM_NUM_PARALLEL / OLLAMA_NUM_PARALLEL)
                       "num_parallel": facts.num_parallel},
        })
    return json_response({"models": models})


#: The Ollama release whose API this server mirrors, reported as /api/version's `version`: clients gate
#: features on it (a "0.1.0" read as a very old Ollama). The shapes and messages follow the Ollama
#: source snapshot tagged v0.33.0-rc2 (release candidate of 0.33.0), reported as its release number
#: because clients parse X.Y.Z. Raise it when the routes are brought up to a newer Ollama.
OLLAMA_API_VERSION = "0.33.0"


@router.get("/api/version")
@router.head("/api/version")
async def version(request: Request) -> Response:
    # tandem's own version in a field of its own (Ollama clients read only `version`).
    return json_response({"version": OLLAMA_API_VERSION, "tandem_version": ctx_of(request).version})
