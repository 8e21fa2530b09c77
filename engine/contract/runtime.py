"""What the engine process asks of a loaded model, whichever engine runs it (engine.process.worker): the native
``engine.runtime.ModelRuntime``, ``engine.vllm.runtime.VllmRuntime`` and ``engine.llamacpp.runtime.LlamaCppRuntime``
each answer all of it, so the worker never tells them apart; a fourth engine is one runtime and one line in
``engine.process.runtimes``."""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

from .protocol import EmbedRequest, EmbedResult, GenerateRequest, GenerateResult, ModelFacts, TokenChunk
from .streaming import Sink


class EngineRuntime(Protocol):
    facts: ModelFacts  # sent to the server once loaded

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...

    def embed(self, req: EmbedRequest) -> EmbedResult: ...

    def generate(self, req: GenerateRequest,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        """The answer's chunks, then one result; ``should_stop`` polled to end early (a cancelled request)."""
        ...

    def stream(self, req: GenerateRequest, should_stop: Callable[[], bool], sink: Sink) -> None:
        """Start the generation and return: its chunks and result (or its error) go to ``sink`` as they come, from
        whichever thread the engine runs it on, and ``sink.end()`` last (engine.contract.streaming)."""
        ...

    def healthy(self) -> bool:
        """Whether what serves the model still answers (a backend server can freeze while this process runs on);
        False silences the heartbeat, so the server's watchdog replaces the engine."""
        ...

    def finish_writes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for writes the load left running (the packed-weight cache); True when done."""
        ...

    def close(self) -> None:
        """Unload: release the weights, stop a backend server it started (never one it attached to)."""
        ...
