"""The FastAPI application: `create_app()` wires the store, model lifecycle, metrics and routes together.

Everything a request needs hangs off `app.state.ctx` (a `server.context.ServerContext`), so two apps in one process
(tests do this) share nothing. Middleware order follows Ollama's gin router: CORS, then the loopback
Host check, then the routes.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import logging
import socket
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blobs import BlobStore

from ..context import ServerContext
from ..gojson import INTERNAL_ERROR, ApiError, json_response
from ..limits import BodyLimitMiddleware
from ..metrics import Metrics, MetricsMiddleware
from ..prompting import PromptCache
from . import anthropic, embed, generate, models, openai, pull, responses
from ..lifecycle import EngineHandle, ModelLifecycle
from ..settings import Settings

log = logging.getLogger("tandem.server")


def tandem_version() -> str:
    try:
        from importlib.metadata import version

        return version("tandem")
    except Exception:
        return "0.1.0"


# --- middleware -------------------------------------------------------------------------------

# Ollama's CORS AllowHeaders (incl. the OpenAI SDK's x-stainless-* headers).
_ALLOW_HEADERS = ("Authorization, Content-Type, User-Agent, Accept, X-Requested-With, OpenAI-Beta, "
                  "x-stainless-arch, x-stainless-async, x-stainless-custom-poll-interval, x-stainless-helper-method, "
                  "x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-poll-helper, "
                  "x-stainless-retry-count, x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout")
_ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
_EXTENSION_SCHEMES = ("chrome-extension://", "safari-extension://", "moz-extension://", "ms-browser-extension://")


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1")
    return None


async def _plain(send: Send, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": (headers or []) + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class CORSMiddleware:
    """gin-contrib/cors as Ollama configures it: listed origins (one `*` wildcard each), browser
    extensions, 403 for any other Origin, 204 for a preflight."""

    def __init__(self, app: ASGIApp, origins: list[str]):
        self.app = app
        self.origins = origins

    def allowed(self, origin: str) -> bool:
        if origin.startswith(_EXTENSION_SCHEMES):
            return True
        return any(o == "*" or o == origin or ("*" in o and fnmatch.fnmatchcase(origin, o)) for o in self.origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        host = _header(scope, b"host") or ""
        if not origin or origin in (f"http://{host}", f"https://{host}"):
            await self.app(scope, receive, send)
            return
        if not self.allowed(origin):
            await _plain(send, 403)
            return
        cors = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS":
            await _plain(send, 204, headers=cors + [
                (b"access-control-allow-methods", _ALLOW_METHODS.encode()),
                (b"access-control-allow-headers", _ALLOW_HEADERS.encode()),
                (b"access-control-max-age", b"43200"),
            ])
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        await self.app(scope, receive, with_cors)


def allowed_host(host: str) -> bool:
    """Ollama's allowedHost plus the address checks of allowedHostsMiddleware."""
    host = host.lower()
    if host in ("", "localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
        return addr.is_loopback or addr.is_private or addr.is_unspecified or _is_local_ip(addr)
    except ValueError:
        pass
    if host == socket.gethostname().lower():
        return True
    return any(host.endswith("." + tld) for tld in ("localhost", "local", "internal"))


def _is_local_ip(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        return str(addr) in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False


def _split_host(value: str) -> str:
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HostCheckMiddleware:
    """Bound to loopback, answer only requests whose Host is local (DNS-rebinding protection); 403 else."""

    def __init__(self, app: ASGIApp, enabled: bool):
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        host = _split_host(_header(scope, b"host") or "")
        if not allowed_host(host):
            await _plain(send, 403)
            return
        await self.app(scope, receive, send)


def _route_of(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


# --- the app ------------------------------------------------------------------------------------


def create_app(store: BlobStore | None = None, settings: Settings | None = None,
               engine_factory: Callable[[], EngineHandle] | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    store = store or BlobStore(settings.models)
    metrics = Metrics()
    ctx = ServerContext(store=store, settings=settings, lifecycle=ModelLifecycle(settings, engine_factory, pack_dir=store.root / store.DERIVED_DIR),
                        metrics=metrics, prompts=PromptCache(), version=tandem_version())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.noprune:
            try:
                removed = await anyio.to_thread.run_sync(store.prune)
                if removed:
                    log.info("pruned %d unused blob(s) and temp file(s)", len(removed))
            except OSError as e:
                log.warning("prune failed: %s", e)
        log.info("tandem %s: models in %s, keep_alive %s, max queue %d, context %d", ctx.version, store.root,
                 "forever" if settings.keep_alive == float("inf") else f"{settings.keep_alive:g}s",
                 settings.max_queue, settings.context_length)
        try:
            yield
        finally:
            await ctx.lifecycle.shutdown()

    app = FastAPI(title="tandem", version=ctx.version, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        if request.url.path.startswith("/v1/"):
            return openai.error_response(exc.status, exc.message, exc.param)
        return json_response({"error": exc.message}, exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # gin's plain-text answers for unknown routes and methods
        if exc.status_code == 404:
            return PlainTextResponse("404 page not found", 404)
        if exc.status_code == 405:
            return PlainTextResponse("405 method not allowed", 405)
        return json_response({"error": str(exc.detail)}, exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        # The details go to the log only: exception text can carry paths and internals, and a client
        # can do nothing with it.
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        message = INTERNAL_ERROR
        if request.url.path.startswith("/v1/"):
            return openai.error_response(500, message)
        return json_response({"error": message}, 500)

    @app.get("/")
    @app.head("/")
    async def root() -> Response:
        # The extra header lets tandem's CLI tell its own server from another Ollama-compatible one.
        return PlainTextResponse("Ollama is running", headers={"x-tandem-version": ctx.version})

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        ctx.metrics.loaded_models.set(len(ctx.lifecycle.loaded()))
        body, content_type = ctx.metrics.render()
        return Response(body, media_type=content_type)

    app.include_router(generate.router)
    app.include_router(models.router)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(pull.router)
    app.include_router(embed.router)
    app.include_router(anthropic.router)

    # add_middleware wraps outside-in in reverse order: metrics sees every answer, CORS runs before the host check.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_bytes)
    app.add_middleware(HostCheckMiddleware, enabled=settings.host.is_loopback())
    app.add_middleware(CORSMiddleware, origins=settings.origins)
    app.add_middleware(MetricsMiddleware, metrics=metrics, route_of=_route_of)
    return app
