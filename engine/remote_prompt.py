"""A request's prompt tokens for an engine that runs on another server (vLLM, llama-server), built as the native
engine builds them: a ``context`` prefix (Ollama's deprecated token list), then the prompt; cut to leave room for
the answer, since neither server shifts its context: a prompt that fills it keeps ``num_keep`` tokens and its end,
leaving a quarter of the context or the answer's ``num_predict``."""

from __future__ import annotations

from typing import Callable

from engine.contract.protocol import ContextLengthError, EngineError, GenerateRequest


def prompt_tokens(req: GenerateRequest, num_ctx: int, vocab_size: int,
                  tokenize: Callable[[str, bool | None], list[int]]) -> list[int]:
    prefix = [int(t) for t in (req.raw_tokens or [])]
    bad = next((t for t in prefix if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise EngineError(f"invalid context: token id {bad} is outside the vocabulary (0 to {vocab_size - 1})", 400)
    add_bos = req.add_bos if req.add_bos is not None else (None if not prefix else False)
    tokens = prefix + (tokenize(req.prompt, add_bos) if req.prompt or not prefix else [])
    if len(tokens) > num_ctx and not req.truncate:
        raise ContextLengthError("the input length exceeds the context length")
    if len(tokens) >= num_ctx:
        want = req.options.num_predict if req.options.num_predict > 0 else num_ctx // 4
        room = max(1, min(want, num_ctx // 2))
        keep = min(max(req.options.num_keep, 0), num_ctx - room - 1)
        tokens = tokens[:keep] + tokens[len(tokens) - (num_ctx - room - keep):]
    return tokens
