"""Checks every architecture's model tests share: random token ids, the relative logit error against a
reference, and verification-width forwards with rollback (what the decode loop does after a rejection)."""

from __future__ import annotations

import random

import torch

TOL = 1e-4  # max |Δlogit| relative to the reference's logit scale


def random_ids(vocab_size: int, n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(n)]


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref).abs().max() / ref.abs().max())


def verify_with_rollback(model, ids: list[int], vocab_size: int, *, width: int = 5, seed: int = 7,
                         capacity: int = 64) -> torch.Tensor:
    """Logits of ``ids`` computed as speculation does: forwards ``width`` wide whose tail is wrong, each
    truncated back to its accepted prefix before the next. Returns the accepted positions' logits, in order,
    and checks after every rollback that the cache holds exactly the accepted tokens."""
    rng = random.Random(seed)
    cache = model.new_cache(capacity)
    got: dict[int, torch.Tensor] = {}
    while cache.length < len(ids):
        start = cache.length
        keep = rng.randint(1, width)  # tokens of the chunk that are "accepted"
        true = ids[start:start + keep]
        chunk = true + [rng.randrange(vocab_size) for _ in range(width - len(true))]
        logits = model(chunk, cache)
        for j in range(len(true)):
            got[start + j] = logits[j]
        cache.truncate(start + len(true))  # the rollback: keep what was accepted
        assert cache.tokens == ids[:cache.length]
    return torch.stack([got[i] for i in range(len(ids))])


def cached_greedy(model, prompt: list[int], n_new: int, capacity: int = 64) -> list[int]:
    """Greedy continuation through the model's own cache: the prompt in one forward, then one token at a time."""
    cache = model.new_cache(capacity)
    logits = model(prompt, cache, logits_for="last")
    got: list[int] = []
    for _ in range(n_new):
        got.append(int(logits[-1].argmax()))
        logits = model([got[-1]], cache)
    return got
