"""The HTTP calls tandem makes to llama-server: health, tokenize, detokenize, and a streamed ``/completion`` read as
parsed events. The prompt always goes as token ids: the server renders every prompt itself (templates, tools,
thinking, raw mode), exactly as for the native engine, so llama-server only continues a token sequence."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx

from engine.backend_process import error_text, event_error_text, sse_data
from engine.contract.protocol import EngineError

CONNECT_TIMEOUT = 5.0


class LlamaCppUnavailableError(EngineError):
    def __init__(self, message: str):
        super().__init__(message, status=500)


class LlamaCppApi:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT))

    def close(self) -> None:
        self._http.close()

    def healthy(self, timeout: float) -> bool:
        try:
            return self._http.get("/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            r = self._http.post(path, json=body)
        except httpx.HTTPError as e:
            raise LlamaCppUnavailableError(f"llama-server did not answer: {type(e).__name__}") from None
        if r.status_code != 200:
            raise EngineError(error_text(r, "llama-server"), 400 if r.status_code < 500 else 500)
        return r.json()

    def props(self) -> dict[str, Any]:
        try:
            return self._http.get("/props").json()
        except (httpx.HTTPError, ValueError):
            return {}

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        return [int(t) for t in self._post("/tokenize", {"content": text, "add_special": add_special,
                                                         "parse_special": True})["tokens"]]

    def detokenize(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"tokens": ids})["content"])

    def stream_completion(self, body: dict[str, Any]) -> "CompletionStream":
        return CompletionStream(self._http, body)


class CompletionStream:
    """A streamed ``/completion``: iterate for its events (dicts); ``close()`` ends it early, and llama-server
    frees the slot of a request whose connection went away."""

    def __init__(self, http: httpx.Client, body: dict[str, Any]):
        self._cm = http.stream("POST", "/completion", json={**body, "stream": True})
        self._closed = False
        try:
            self._response = self._cm.__enter__()
        except httpx.HTTPError as e:
            raise LlamaCppUnavailableError(f"llama-server did not answer: {type(e).__name__}") from None
        if self._response.status_code != 200:
            self._response.read()
            message = error_text(self._response, "llama-server")
            self.close()
            raise EngineError(message, 400 if self._response.status_code < 500 else 500)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for payload in sse_data(self._response):
                event = json.loads(payload)
                if "error" in event:
                    raise EngineError(event_error_text(event), 500)
                yield event
        except httpx.HTTPError:
            if not self._closed:
                raise LlamaCppUnavailableError("llama-server closed the stream") from None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._cm.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - closing a connection that already broke
                pass
