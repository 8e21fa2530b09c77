"""The HTTP calls tandem makes to a vLLM OpenAI server: health, model list, tokenize, detokenize, and a
streamed ``/v1/completions`` read as parsed events.

Why completions and not vLLM's chat endpoint: the server renders every prompt itself (templates, tools, thinking,
Ollama's raw mode), exactly as for the native engine, so vLLM only ever continues a token sequence, and both
engines see the same prompt tokens.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx

from engine.backend_process import error_text, event_error_text, sse_data
from engine.contract.protocol import EngineError

CONNECT_TIMEOUT = 5.0


class VllmUnavailableError(EngineError):
    """vLLM did not answer (refused, reset): the request fails, and the runtime's health check decides whether the
    engine is replaced."""

    def __init__(self, message: str):
        super().__init__(message, status=500)


class VllmApi:
    """One vLLM endpoint (``base_url`` without ``/v1``) serving ``model``."""

    def __init__(self, base_url: str, model: str = ""):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT))

    def close(self) -> None:
        self._http.close()

    def healthy(self, timeout: float) -> bool:
        try:
            return self._http.get("/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> list[str]:
        return [m["id"] for m in self._json("GET", "/v1/models").get("data", [])]

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        return [int(t) for t in self._json("POST", "/tokenize", body)["tokens"]]

    def detokenize(self, ids: list[int]) -> str:
        return str(self._json("POST", "/detokenize", {"model": self.model, "tokens": list(ids)})["prompt"])

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, json=body, timeout=60.0)
        except httpx.HTTPError as e:
            raise VllmUnavailableError(f"vLLM at {self.base_url} did not answer ({type(e).__name__})") from None
        if response.status_code != 200:
            raise EngineError(f"vLLM refused the request: {error_text(response, 'vLLM')}",
                              400 if response.status_code < 500 else 500)
        return response.json()

    def stream_completion(self, body: dict[str, Any]) -> "CompletionStream":
        return CompletionStream(self, {**body, "model": self.model, "stream": True})


class CompletionStream:
    """A streamed completion: iterate for its events (the parsed ``data:`` payloads, [DONE] ends it); ``close()``
    from any thread drops the connection, which vLLM takes as the request's abort."""

    def __init__(self, api: VllmApi, body: dict[str, Any]):
        self._api = api
        self._body = body
        self._response: httpx.Response | None = None
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            request = self._api._http.build_request("POST", "/v1/completions", json=self._body)
            self._response = self._api._http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise VllmUnavailableError(f"vLLM at {self._api.base_url} did not answer ({type(e).__name__})") from None
        try:
            if self._response.status_code != 200:
                self._response.read()
                raise EngineError(f"vLLM refused the request: {error_text(self._response, 'vLLM')}",
                                  400 if self._response.status_code < 500 else 500)
            for payload in sse_data(self._response):
                if payload == b"[DONE]":
                    return
                event = json.loads(payload)
                if "error" in event and not event.get("choices"):
                    raise EngineError(f"vLLM failed the request: {event_error_text(event)}", 500)
                yield event
        except (httpx.HTTPError, httpx.StreamError, OSError) as e:
            if self._closed:  # closed from another thread (a cancel): the read it broke ends the stream
                return
            raise VllmUnavailableError(f"vLLM at {self._api.base_url} dropped the stream ({type(e).__name__})") from None
        finally:
            self._response.close()

    def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()
