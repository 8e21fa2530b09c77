"""Ollama's NDJSON answers: a stream of JSON objects, or one object for `stream: false`.

An error before the first object gets a proper status and `{"error": ...}`; an error after it (the
status line is already sent) becomes a final `{"error": ...}` line. Work that reports progress (create,
pull) runs in a thread whose events feed the stream, its failures mapped to Ollama's statuses.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from typing import Any, AsyncIterator, Callable

from fastapi.responses import Response, StreamingResponse

from blobs import (
    BlobsError,
    DigestMismatchError,
    InvalidDigestError,
    InvalidNameError,
    ModelNotFoundError,
)
from importer import CreateError, ProgressEvent
from modelfile import ParamError, ParseError

from .gojson import INTERNAL_ERROR, ApiError, json_bytes, json_response

log = logging.getLogger("tandem.server")


async def stream_or_collect(chunks: AsyncIterator[dict[str, Any]], stream: bool,
                            merge: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> Response:
    """Answer with an NDJSON stream (errors after the first line become a final error line) or, for
    stream=false, one object merged from all chunks. An error before the first chunk is a status."""
    it = chunks.__aiter__()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        raise ApiError(500, "no response") from None
    except BaseException:
        await _aclose(it)
        raise
    if not stream:
        items = [first]
        try:
            async for item in it:
                items.append(item)
        finally:
            await _aclose(it)
        return json_response(merge(items))

    async def body() -> AsyncIterator[bytes]:
        try:
            yield json_bytes(first)
            async for item in it:
                yield json_bytes(item)
        except ApiError as e:
            yield json_bytes({"error": e.message})
        finally:
            await _aclose(it)

    return StreamingResponse(body(), media_type="application/x-ndjson")


async def _aclose(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass


def merge_last(items: list[dict[str, Any]]) -> dict[str, Any]:
    return items[-1]


async def thread_progress(work: Callable[[Callable[[ProgressEvent], None]], Any]) -> AsyncIterator[dict[str, Any]]:
    """Run ``work(progress)`` in a thread and yield its ProgressEvents as JSON objects. CreateError /
    blob errors become ApiErrors with their status."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    def progress(ev: ProgressEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ev.to_json())

    def run() -> None:
        try:
            work(progress)
        except BaseException as e:  # handed to the consumer
            loop.call_soon_threadsafe(queue.put_nowait, e)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    threading.Thread(target=run, name="tandem-progress", daemon=True).start()
    while True:
        item = await queue.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise as_api_error(item)
        yield item


def as_api_error(e: BaseException) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, CreateError):
        return ApiError(e.status, str(e))
    if isinstance(e, ModelNotFoundError):
        return ApiError(404, str(e))
    if isinstance(e, (InvalidNameError, InvalidDigestError, DigestMismatchError, ParseError, ParamError)):
        return ApiError(400, str(e))
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return ApiError(500, "no space left on device")  # Ollama's status and Go's text, no path
    if isinstance(e, BlobsError):
        return ApiError(400, str(e))
    if isinstance(e, OSError):
        return ApiError(500, str(e))
    log.exception("unexpected error", exc_info=e)
    return ApiError(500, INTERNAL_ERROR)  # the exception's text is in the log, never in the answer
