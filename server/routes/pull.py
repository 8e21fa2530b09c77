"""`/api/pull`: a Hugging Face model (`hf.co/<org>/<repo>[:<quant>]`, see `server.hf_pull`) into the
store, streaming Ollama-style progress.

Ollama's own registry is not reachable from tandem: any other name gets a clear 400.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from importer import CreateError

from ..context import ctx_of
from ..gojson import ApiError, read_json
from ..hf_pull import Progress, parse_pull_name, pull_model
from ..ndjson import merge_last, stream_or_collect, thread_progress

log = logging.getLogger("tandem.pull")

router = APIRouter()


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
    except CreateError as e:
        raise ApiError(e.status, str(e)) from None

    def work(progress: Progress) -> None:
        try:
            pulled = pull_model(ctx.store, name, progress)
        except CreateError as e:
            raise ApiError(e.status, str(e)) from None
        log.info("pulled %s", pulled.display())

    return await stream_or_collect(thread_progress(work), stream, merge_last)
