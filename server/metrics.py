"""Prometheus metrics for one app instance (its own CollectorRegistry, never the global one).

Exposed at GET /metrics:
  tandem_requests_total{endpoint,method,status}      HTTP requests answered
  tandem_request_duration_seconds{endpoint}          wall time until the last byte (streams included)
  tandem_prompt_tokens_total{model}                  prompt tokens (cached + evaluated)
  tandem_prompt_cached_tokens_total{model}           of which reused from the KV cache
  tandem_generated_tokens_total{model}               tokens generated
  tandem_draft_tokens_total{model}                   tokens the drafter proposed
  tandem_draft_accepted_tokens_total{model}          drafted tokens the target accepted
  tandem_draft_rounds_total{model}                   verification rounds
  tandem_target_forwards_total{model}                target decode forwards (rounds + plain steps)
  tandem_loaded_models                               engines currently loaded
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.contract.protocol import GenerateResult


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("tandem_requests", "HTTP requests answered", ["endpoint", "method", "status"], registry=r)
        self.duration = Histogram("tandem_request_duration_seconds", "HTTP request wall time until the last byte",
                                  ["endpoint"], registry=r,
                                  buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.prompt_tokens = Counter("tandem_prompt_tokens", "Prompt tokens (cached + evaluated)", ["model"], registry=r)
        self.prompt_cached = Counter("tandem_prompt_cached_tokens", "Prompt tokens reused from the KV cache", ["model"],
                                     registry=r)
        self.generated_tokens = Counter("tandem_generated_tokens", "Generated tokens", ["model"], registry=r)
        self.draft_tokens = Counter("tandem_draft_tokens", "Tokens proposed by the drafter", ["model"], registry=r)
        self.draft_accepted = Counter("tandem_draft_accepted_tokens", "Drafted tokens accepted by the target",
                                      ["model"], registry=r)
        self.draft_rounds = Counter("tandem_draft_rounds", "Speculative verification rounds", ["model"], registry=r)
        self.target_forwards = Counter("tandem_target_forwards", "Target decode forwards", ["model"], registry=r)
        self.loaded_models = Gauge("tandem_loaded_models", "Engines currently loaded", registry=r)

    def record_generation(self, model: str, result: GenerateResult) -> None:
        spec = result.speculation
        self.prompt_tokens.labels(model).inc(result.prompt_eval_count)
        self.prompt_cached.labels(model).inc(result.prompt_cached)
        self.generated_tokens.labels(model).inc(result.eval_count)
        self.draft_tokens.labels(model).inc(spec.draft_n)
        self.draft_accepted.labels(model).inc(spec.draft_n_accepted)
        self.draft_rounds.labels(model).inc(spec.draft_rounds)
        self.target_forwards.labels(model).inc(spec.target_forwards)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts every response by route template (not raw path: digests and model names would explode
    the label space) and times it until the body's last byte, so streams are timed in full."""

    def __init__(self, app: ASGIApp, metrics: Metrics, route_of: Callable[[Scope], str]):
        self.app = app
        self.metrics = metrics
        self.route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            endpoint = self.route_of(scope)
            self.metrics.requests.labels(endpoint, scope.get("method", ""), str(status["code"])).inc()
            self.metrics.duration.labels(endpoint).observe(time.perf_counter() - start)
