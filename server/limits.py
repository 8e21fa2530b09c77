"""Size limits on what a client may send: the request-body limit (a middleware) and the blob-upload
limit (applied by `/api/blobs` while it streams to disk).

Why: every JSON endpoint reads its whole body into memory before decoding it, so without a bound
one request can take all of the server's memory; a blob upload goes to disk, where an endless body
fills the disk. Both answer 413 with the usual `{"error": ...}` (OpenAI's shape under /v1).
"""

from __future__ import annotations

from typing import Any, Iterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .gojson import ApiError

#: Paths whose bodies are not read into memory and have their own limit (``blob_chunks``).
UNBOUNDED_PREFIXES = ("/api/blobs/",)


class BodyTooLarge(ApiError):
    def __init__(self, what: str, limit: int):
        super().__init__(413, f"{what} too large: the limit is {limit} bytes")


def _content_length(scope: Scope) -> int | None:
    for k, v in scope.get("headers", []):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    """Refuse a request body over ``limit`` bytes (0 = no limit): at once when Content-Length says so,
    else as soon as the streamed body passes it. The refusal is raised as an `ApiError` from the
    body read, so the app's own error handler shapes the answer; nothing is buffered here."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.limit <= 0 or scope.get("path", "").startswith(UNBOUNDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        limit = self.limit
        declared = _content_length(scope)
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            if declared is not None and declared > limit:
                raise BodyTooLarge("request body", limit)
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge("request body", limit)
            return message

        await self.app(scope, bounded, send)


def content_length_over(headers: Any, limit: int) -> bool:
    """Whether a declared Content-Length already exceeds ``limit`` (0 = no limit)."""
    try:
        declared = int(headers.get("content-length", ""))
    except ValueError:
        return False
    return 0 < limit < declared


def blob_chunks(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """``chunks`` passed through, raising `BodyTooLarge` once more than ``limit`` bytes arrived
    (0 = no limit). The store's writer removes its partial file when the iteration raises."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if 0 < limit < total:
            raise BodyTooLarge("blob", limit)
        yield chunk


