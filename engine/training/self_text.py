"""Text the target writes itself: its greedy answers to rendered chat prompts, the text its drafter will draft for.

The prompts come rendered (the command line applies the model's own chat template, ``server/cli/drafter_prompts.py``
says which requests); each is answered greedily for up to ``max_new`` tokens or to an end-of-generation token, and
prompt and answer together become training text (the head's pairs inside the prompt teach the template's tokens).
Several prompts are answered side by side (``Model.forward_batch``): a decode step is bound by reading the weights,
so eight answers cost little more per step than one, and writing the text stops dominating a large target's run.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from engine.models.transformer import Model, SequenceRows


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


@torch.no_grad()
def answer_side_by_side(target: Model, prompts: Sequence[Sequence[int]], max_new: int,
                        stop: frozenset[int]) -> list[list[int]]:
    """``answer_greedily`` for each prompt, the answers decoded together: one forward per step over every
    answer still going."""
    caches = [target.new_cache(len(p) + max_new) for p in prompts]
    outs = [list(p) for p in prompts]
    nexts = [int(target.forward(list(p), c, logits_for="last")[-1].argmax()) for p, c in zip(prompts, caches)]
    live = list(range(len(prompts)))
    for step in range(max_new):
        going = []
        for i in live:
            outs[i].append(nexts[i])
            if nexts[i] not in stop and step + 1 < max_new:
                going.append(i)
        live = going
        if not live:
            break
        logits = target.forward_batch([SequenceRows([nexts[i]], caches[i], "last") for i in live])
        for i, lg in zip(live, logits):
            nexts[i] = int(lg[-1].argmax())
    return outs


def self_written_tokens(target: Model, prompts: Sequence[Sequence[int]], budget: int, max_new: int,
                        stop: frozenset[int], progress: Callable[[int, int], None] | None = None,
                        width: int = 16) -> list[int]:
    """Prompts and answers, one after another, until ``budget`` tokens (or the prompts run out); ``width``
    prompts are answered at a time."""
    tokens: list[int] = []
    for at in range(0, len(prompts), width):
        if len(tokens) >= budget:
            break
        for answer in answer_side_by_side(target, prompts[at:at + width], max_new, stop):
            tokens.extend(answer)
        if progress is not None:
            progress(min(len(tokens), budget), budget)
    return tokens[:budget]
