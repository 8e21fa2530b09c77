"""Server-sent events that start once their first event is ready (the OpenAI and Anthropic routes).

An error before the first event is raised as it is, so the client gets a proper status and the route's error
body; an `ApiError` after it (the status line is already sent) becomes the route's error event. With
``log_failures``, any other exception after the start is logged and sent as a 500 error event too (its text
never reaches the client). The events are closed at the end either way: closing them ends the generation
inside, which cancels an unfinished one.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable

from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from .gojson import INTERNAL_ERROR, ApiError

log = logging.getLogger("tandem.server")


async def sse_response(events: AsyncIterator[dict[str, Any]], error_event: Callable[[ApiError], dict[str, str]], *,
                       trailer: dict[str, str] | None = None, log_failures: str | None = None) -> Response:
    """``events`` as SSE, ``trailer`` after the last (OpenAI's ``[DONE]``); see the module doc for errors."""
    it = events.__aiter__()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        raise ApiError(500, "no response") from None

    async def body() -> AsyncIterator[dict[str, str]]:
        try:
            yield first
            async for e in it:
                yield e
            if trailer is not None:
                yield trailer
        except ApiError as e:
            yield error_event(e)
        except Exception:
            if log_failures is None:
                raise
            log.exception(log_failures)
            yield error_event(ApiError(500, INTERNAL_ERROR))
        finally:
            close = getattr(it, "aclose", None)
            if close is not None:
                await close()

    return EventSourceResponse(body(), sep="\n", ping=None)
