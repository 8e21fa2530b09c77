"""Embeddings: Ollama's `/api/embed` and legacy `/api/embeddings`, and OpenAI's `/v1/embeddings`, as Ollama
serves them (server/routes.go EmbedHandler and EmbeddingsHandler; openai's EmbeddingsMiddleware).

An embedding model (its GGUF declares a pooling type: a `bert` encoder) embeds each input in the engine
process; the vectors come back as the model pools them and are L2-normalised here, as Ollama's handler
does, then cut to `dimensions` and normalised again. The legacy endpoint returns the model's own output
(normalised unless the model says it does not normalise). A completion model is refused, after the
empty-input case that only loads it, with the status today's Ollama answers (501 on /api/embed and /v1,
500 on the legacy endpoint).
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from blobs.model import StoredModel
from engine.contract.protocol import EmbedRequest, EmbedResult, EngineCrashedError, EngineError

from ..context import ServerContext, ctx_of
from ..gojson import ApiError, jfield, json_response, read_struct
from ..effective_options import merged_options
from ..lifecycle import Lease, QueueFullError
from ..types import EmbedBody, EmbeddingBody
from ..validation import parse_keep_alive, stored_model

log = logging.getLogger("tandem.server")
router = APIRouter()


@dataclass
class OpenAIEmbedBody:
    """POST /v1/embeddings (openai.EmbedRequest): only these fields reach the embed handler."""

    input: Any = jfield("any")
    model: str = jfield("string", "")
    dimensions: int = jfield("int", 0)
    encoding_format: str = jfield("string", "")


def _inputs(value: Any) -> list[str]:
    """Ollama's reading of `input`: a non-empty string is one input, a list must hold only strings."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ApiError(400, "invalid input type")
        return list(value)
    if value is not None:
        raise ApiError(400, "invalid input type")
    return []


def _stored(ctx: ServerContext, name: str) -> StoredModel:
    """The model, or Ollama's embed answers: an empty name is 404 `model '' not found`, a malformed one 400
    `invalid model name`, an unknown one 404."""
    if not name:
        raise ApiError(404, "model '' not found")
    return stored_model(ctx, name, invalid_status=400)


def normalize(vec: np.ndarray) -> np.ndarray:
    """Ollama's normalize: float32, divided by max(L2 norm, 1e-12); NaN or Inf is an error."""
    v = np.asarray(vec, dtype=np.float32)
    if not np.isfinite(v).all():
        raise ApiError(400, "embedding contains NaN or Inf values")
    norm = np.float32(1.0 / max(float(np.sqrt(np.sum(v * v, dtype=np.float32))), 1e-12))
    return v * norm


def _float32_json(v: np.ndarray) -> list[float]:
    """A float32 vector as Go encodes []float32: each value's shortest float32 spelling."""
    return [float(str(x)) for x in v.astype(np.float32)]


@dataclass
class _Embedded:
    vectors: list[np.ndarray]
    prompt_eval_count: int
    load_ns: int


async def _acquire(ctx: ServerContext, model: StoredModel, options: Any, keep_alive: float) -> Lease:
    try:
        return await ctx.lifecycle.acquire(model, options, keep_alive)
    except QueueFullError as e:
        raise ApiError(503, str(e)) from None
    except EngineError as e:
        raise ApiError(e.status, str(e)) from None


async def _embed(ctx: ServerContext, endpoint: str, name: str, model: StoredModel, inputs: list[str], *,
                 truncate: bool, raw_options: dict[str, Any] | None, keep_alive: float,
                 unsupported_status: int) -> _Embedded:
    """Load the model (for every request, as Ollama's handler schedules the runner first), then embed
    ``inputs`` in the engine. The vectors are the model's pooled output, not yet normalised."""
    options = merged_options(model, raw_options)
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    if inputs and not prompting.is_embedding:
        # Ollama loads the model before its runner refuses; the answer is the same without the load.
        raise ApiError(unsupported_status, f'"{name}" does not support embeddings')
    t0 = time.perf_counter_ns()
    lease = await _acquire(ctx, model, options, keep_alive)
    load_ns = time.perf_counter_ns() - t0
    if not inputs:
        lease.release()
        return _Embedded([], 0, load_ns)
    if options.explicit_or("num_ctx", 1) <= 0:
        # Ollama's embed handler takes an explicit num_ctx as the context, 0 included: nothing fits in it
        lease.release()
        raise ApiError(400, "input after truncation exceeds maximum context length")
    retried = False
    while True:
        num_ctx = options.effective_num_ctx(lease.runner.facts.context_length)
        try:
            result: EmbedResult = await anyio.to_thread.run_sync(
                lease.engine.embed, EmbedRequest(inputs=inputs, truncate=truncate, num_ctx=num_ctx))
            break
        except EngineCrashedError as e:
            lease.crashed = True
            if retried:
                log.error("%s %s: %s", endpoint, name, e)
                raise ApiError(500, str(e)) from None
            # nothing was answered yet: a new engine answers instead (once), as for a generation (server.pipeline)
            log.warning("%s %s: the engine was lost before it answered; trying again on a new engine", endpoint, name)
        except EngineError as e:
            raise ApiError(e.status, str(e)) from None
        finally:
            lease.release()
        retried = True
        lease = await _acquire(ctx, model, options, keep_alive)
    log.info("%s %s: %d input(s), %d tokens in %.3fs", endpoint, model.name.display(), len(inputs),
             result.prompt_eval_count, result.duration_ns / 1e9)
    return _Embedded([np.asarray(v, dtype=np.float32) for v in result.embeddings], result.prompt_eval_count,
                     load_ns)


def _final(vectors: list[np.ndarray], dimensions: int) -> list[np.ndarray]:
    """/api/embed and /v1: normalise; with 0 < dimensions < size, cut and normalise again."""
    out = []
    for v in vectors:
        v = normalize(v)
        if 0 < dimensions < len(v):
            v = normalize(v[:dimensions])
        out.append(v)
    return out


@router.post("/api/embed")
async def embed(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: EmbedBody = await read_struct(request, EmbedBody, "api.EmbedRequest")
    inputs = _inputs(req.input)
    model = await anyio.to_thread.run_sync(_stored, ctx, req.model)
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    done = await _embed(ctx, "/api/embed", req.model, model, inputs, truncate=req.truncate, raw_options=req.options,
                        keep_alive=keep_alive, unsupported_status=501)
    if not inputs:
        return json_response({"model": req.model, "embeddings": []})
    body: dict[str, Any] = {"model": req.model,
                            "embeddings": [_float32_json(v) for v in _final(done.vectors, req.dimensions)],
                            "total_duration": time.perf_counter_ns() - t0, "load_duration": done.load_ns,
                            "prompt_eval_count": done.prompt_eval_count}
    return json_response({k: v for k, v in body.items() if v or k in ("model", "embeddings")})


@router.post("/api/embeddings")
async def embeddings(request: Request) -> Response:
    ctx = ctx_of(request)
    req: EmbeddingBody = await read_struct(request, EmbeddingBody, "api.EmbeddingRequest")
    if not req.model:
        raise ApiError(400, "model is required")
    model = await anyio.to_thread.run_sync(_stored, ctx, req.model)
    keep_alive = parse_keep_alive(ctx, req.keep_alive)
    inputs = [req.prompt] if req.prompt else []  # an empty prompt only loads the model
    done = await _embed(ctx, "/api/embeddings", req.model, model, inputs, truncate=True, raw_options=req.options,
                        keep_alive=keep_alive, unsupported_status=500)
    if not inputs:
        return json_response({"embedding": []})
    prompting = await anyio.to_thread.run_sync(ctx.prompts.get, model)
    # The runner's own output, as Ollama's legacy endpoint returns it: normalised unless the model's
    # pipeline does not normalise; values are float32 widened to float64.
    v = done.vectors[0]
    if prompting.facts.normalize_embeddings:
        v = normalize(v)
    return json_response({"embedding": [float(x) for x in v]})


@router.post("/v1/embeddings")
async def openai_embeddings(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    ctx = ctx_of(request)
    req: OpenAIEmbedBody = await read_struct(request, OpenAIEmbedBody, "openai.EmbedRequest")
    fmt = req.encoding_format
    if fmt and fmt.lower() not in ("float", "base64"):
        raise ApiError(400, f"Invalid value for 'encoding_format' = {fmt}. Supported values: ['float', 'base64'].")
    value = [""] if req.input == "" else req.input
    if value is None or value == []:
        raise ApiError(400, "invalid input")
    inputs = _inputs(value)
    model = await anyio.to_thread.run_sync(_stored, ctx, req.model)
    keep_alive = parse_keep_alive(ctx, None)
    done = await _embed(ctx, "/v1/embeddings", req.model, model, inputs, truncate=True, raw_options=None,
                        keep_alive=keep_alive, unsupported_status=501)
    data = []
    for i, v in enumerate(_final(done.vectors, req.dimensions)):
        if fmt.lower() == "base64":
            vec: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
        else:
            vec = _float32_json(v)
        data.append({"object": "embedding", "embedding": vec, "index": i})
    log.debug("/v1/embeddings %s: %.3fs", req.model, (time.perf_counter_ns() - t0) / 1e9)
    return json_response({"object": "list", "data": data, "model": req.model,
                          "usage": {"prompt_tokens": done.prompt_eval_count,
                                    "total_tokens": done.prompt_eval_count}})
