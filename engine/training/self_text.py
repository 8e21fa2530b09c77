"""Text the target writes itself: its greedy answers to rendered chat prompts, the text its drafter will draft for.

The prompts come rendered (the command line applies the model's own chat template, ``server/cli/drafter_prompts.py``
says which requests); each is answered greedily for up to ``max_new`` tokens or to an end-of-generation token, and
prompt and answer together become training text (the head's pairs inside the prompt teach the template's tokens).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from engine.models.transformer import Model


@torch.no_grad()
def answer_greedily(target: Model, prompt: Sequence[int], max_new: int, stop: frozenset[int]) -> list[int]:
    """``prompt`` followed by the target's greedy continuation (to ``max_new`` tokens or an end token)."""
    cache = target.new_cache(len(prompt) + max_new)
    logits = target.forward(list(prompt), cache, logits_for="last")
    out = list(prompt)
    for _ in range(max_new):
        token = int(logits[-1].argmax())
        out.append(token)
        if token in stop:
            break
        logits = target.forward([token], cache, logits_for="last")
    return out


def self_written_tokens(target: Model, prompts: Sequence[Sequence[int]], budget: int, max_new: int,
                        stop: frozenset[int], progress: Callable[[int, int], None] | None = None) -> list[int]:
    """Prompts and answers, one after another, until ``budget`` tokens (or the prompts run out)."""
    tokens: list[int] = []
    for prompt in prompts:
        if len(tokens) >= budget:
            break
        tokens.extend(answer_greedily(target, prompt, max_new, stop))
        if progress is not None:
            progress(min(len(tokens), budget), budget)
    return tokens[:budget]
