"""`tandem serve`'s HTTP server: uvicorn, with a shutdown that ends streams cleanly.

uvicorn's own graceful shutdown (SIGTERM, Ctrl-C) stops accepting connections, waits for open responses
and, past its timeout, cancels them mid-write: a client streaming a long generation got no final line.
Here the shutdown first drains the model lifecycle (running generations get SHUTDOWN_GRACE seconds to finish,
then end with a final `{"error": ...}` line, or an SSE error event on /v1), so uvicorn's wait ends as soon
as those answers are written and only then are the engines stopped (the app's lifespan).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import uvicorn

from .lifecycle import ModelLifecycle

SHUTDOWN_GRACE = 2.0  # seconds running generations get to finish before they are ended
# uvicorn's bound on the whole wait for open connections; past it, what is still open is cut.
_CONNECTIONS_TIMEOUT = SHUTDOWN_GRACE + 5.0


class DrainingServer(uvicorn.Server):
    """A uvicorn.Server whose shutdown drains the model lifecycle while uvicorn waits for connections."""

    def __init__(self, config: uvicorn.Config, lifecycle: ModelLifecycle):
        super().__init__(config)
        self._lifecycle = lifecycle
        self._drain: asyncio.Task | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._drain = asyncio.get_running_loop().create_task(self._lifecycle.drain(SHUTDOWN_GRACE))
        try:
            await super().shutdown(sockets)
        finally:
            if not self._drain.done():
                self._drain.cancel()


def serve(app: Any, lifecycle: ModelLifecycle, host: str, port: int, log_level: str) -> None:
    """Run ``app`` until SIGTERM or Ctrl-C (a second Ctrl-C skips the wait, as uvicorn's does)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=_CONNECTIONS_TIMEOUT)
    server = DrainingServer(config, lifecycle)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:  # the port was taken or startup failed: exit non-zero, as uvicorn.run does
        sys.exit(3)
