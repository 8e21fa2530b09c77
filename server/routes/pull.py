"""`/api/pull` and `/api/push`, streaming Ollama-style progress: a registry name (the Ollama library, any OCI
registry, `TANDEM_REGISTRY` for names without a host; `importer.registry`), or for a pull a Hugging Face model
(`hf.co/<org>/<repo>[:<quant>]`, `server.hf_pull`)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blobs import BlobsError, InvalidNameError, ModelName
from importer import CreateError, hf_source
from importer.registry import Credentials, pull_model as registry_pull, push_model

from ..context import ServerContext, ctx_of
from ..gojson import ApiError, read_json
from ..hf_pull import Progress, pull_model as hf_pull
from ..ndjson import as_api_error, merge_last, stream_or_collect, thread_progress

log = logging.getLogger("tandem.pull")

router = APIRouter()


def _name_and_stream(body: dict) -> tuple[str, ModelName, bool]:
    """The model named as given, parsed, and whether to stream."""
    name = body.get("model") or body.get("name")
    if not name or not isinstance(name, str):
        raise ApiError(400, "model is required")
    try:
        parsed = ModelName.parse(name)
    except InvalidNameError:
        raise ApiError(400, "invalid model name") from None
    stream = body.get("stream")
    return name, parsed, True if stream is None else bool(stream)


def _registry_options(ctx: ServerContext, body: dict) -> dict:
    reg = ctx.settings.registry
    return {"insecure": bool(body.get("insecure")), "registry": reg.url or None,
            "credentials": Credentials(reg.user, reg.password) if reg.user else None}


@router.post("/api/pull")
async def pull(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await read_json(request, "api.PullRequest")
    value, name, stream = _name_and_stream(body)
    if name.host.lower() in hf_source.HF_HOSTS:
        try:
            hf_source.parse_hf_name(value)  # a bad name is a status, before any progress
        except CreateError as e:
            raise ApiError(e.status, str(e)) from None

        def work(progress: Progress) -> None:
            log.info("pulled %s", hf_pull(ctx.store, value, progress).display())
    else:
        options = _registry_options(ctx, body)

        def work(progress: Progress) -> None:
            registry_pull(ctx.store, value, progress, downloads=ctx.downloads, **options)

    return await stream_or_collect(thread_progress(work), stream, merge_last)


@router.post("/api/push")
async def push(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await read_json(request, "api.PushRequest")
    _, name, stream = _name_and_stream(body)
    if name.host.lower() in hf_source.HF_HOSTS:
        raise ApiError(400, "pushing to Hugging Face is not supported; push to an OCI registry")
    try:
        ctx.store.resolve(name)
    except BlobsError as e:  # a missing model is Ollama's 404 before any progress
        raise as_api_error(e) from None
    options = _registry_options(ctx, body)

    def work(progress: Progress) -> None:
        push_model(ctx.store, str(name), progress, **options)

    return await stream_or_collect(thread_progress(work), stream, merge_last)
