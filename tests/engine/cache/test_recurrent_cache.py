"""HybridCache (engine/cache/recurrent.py) on a tiny qwen35: rollback restores each recurrent layer's state as
recorded at the accepted length, truncating where no state is recorded raises, and prefix reuse across
requests stops at the last recorded offset (prompt-boundary checkpoints, the current length, or 0)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine.cache.recurrent import HybridCache  # noqa: E402
from engine.models import deltanet  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from tests import hf_tiny_qwen35  # noqa: E402
from tests.model_checks import random_ids, relative_error  # noqa: E402

P, W = 24, 6  # prefix (chunked form), verification width (exact recurrence)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.set_num_threads(1)
    pair = hf_tiny_qwen35.make_pair(tmp_path_factory.mktemp("q35"))
    return load_model(pair.path, fmt="f32")


@pytest.fixture(scope="module")
def ids(model):
    return random_ids(model.config.vocab_size, 64, seed=5)


def _states(cache: HybridCache) -> list[torch.Tensor]:
    return [t for pair in cache.states for t in pair]


def _rollback_then_redo(model, ids, j: int, cache_cls=HybridCache) -> tuple[torch.Tensor, HybridCache]:
    """Prefix, a W-wide forward whose tokens after the first j are wrong, truncate to P + j, then the true
    continuation: the logits of the continuation."""
    cache = cache_cls.new(model.config, 64)
    model(ids[:P], cache)
    wrong = ids[P:P + j] + [(t + 1) % model.config.vocab_size for t in ids[P + j:P + W]]
    model(wrong, cache)
    cache.truncate(P + j)
    assert cache.tokens == ids[:P + j]
    return model(ids[P + j:P + W + 2], cache), cache


def test_restore_each_offset_then_redo_equals_fresh(model, ids):
    fresh = model.new_cache(64)
    model(ids[:P], fresh)
    want = model(ids[P:P + W + 2], fresh)  # one forward, no rejection
    for j in range(W + 1):
        got, cache = _rollback_then_redo(model, ids, j)
        assert relative_error(got, want[j:].double()) < 1e-5, j
        ref = model.new_cache(64)
        model(ids[:P], ref)
        if j:
            model(ids[P:P + j], ref)
        model(ids[P + j:P + W + 2], ref)
        for a, b in zip(_states(cache), _states(ref)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class _NoRestore(HybridCache):
    """A cache that only cuts the length, as an attention cache does (no snapshot restored)."""

    def truncate(self, n: int) -> None:
        states = self.states
        super().truncate(n)
        self.states = states


def test_skipping_the_snapshot_is_caught(model, ids):
    """The check above fails when the recurrent state is not restored: the wrong tokens stay in the state."""
    fresh = model.new_cache(64)
    model(ids[:P], fresh)
    want = model(ids[P:P + W + 2], fresh)
    got, _ = _rollback_then_redo(model, ids, 2, _NoRestore)
    assert relative_error(got, want[2:].double()) > 1e-3


def test_truncate_without_a_recorded_state_raises(model, ids):
    n = deltanet.EXACT_WIDTH + 8  # chunked: only the states after the last two positions are recorded
    cache = model.new_cache(64)
    model(ids[:n], cache)
    before = _states(cache)
    with pytest.raises(ValueError, match="no recurrent state recorded"):
        cache.truncate(n - 3)
    assert cache.length == n and all(a is b for a, b in zip(before, _states(cache)))
    cache.truncate(n)  # the current length and 0 always have a state
    cache.truncate(n - 1)
    cache.truncate(0)
    assert cache.length == 0 and all(float(t.abs().max()) == 0 for t in _states(cache))


def test_records_cleared_by_a_rollback(model, ids):
    """After a rollback only the restored position is recorded: the loop never returns behind it."""
    cache = model.new_cache(64)
    model(ids[:8], cache)
    model(ids[8:12], cache)
    cache.truncate(10)
    with pytest.raises(ValueError):
        cache.truncate(9)


def test_prefix_reuse_stops_at_recorded_offsets(model, ids):
    prompt = ids[:P]
    cache = model.new_cache(64)
    cache.reuse_prefix(prompt)
    model(prompt, cache)  # prompt boundary: a checkpoint at P
    for t in ids[P:P + 4]:  # decode: single tokens
        model([t], cache)
    cache.truncate(P + 3)  # the last sampled token is not forwarded before the next request
    follow_up = ids[:P + 3] + ids[40:44]
    # the whole cached log is a prefix of the follow-up: everything is kept
    assert cache.reuse_prefix(follow_up) == P + 3
    want = model(follow_up[P + 3:], cache)
    fresh = model.new_cache(64)
    ref = model(follow_up, fresh)
    assert relative_error(want, ref[P + 3:].double()) < 1e-5
    # diverging after the prompt boundary: back to the checkpoint at P (not to the divergence)
    other = ids[:P] + ids[50:54]
    assert cache.reuse_prefix(other) == P
    got = model(other[P:], cache)
    fresh = model.new_cache(64)
    assert relative_error(got, model(other, fresh)[P:].double()) < 1e-5
    # that request's own boundary (P + 4) is a checkpoint beside the first one's
    assert cache.reuse_prefix(other + ids[60:62]) == P + 4
    assert cache.reuse_prefix(ids[:P] + ids[20:22]) == P
    # the same prompt again: everything but its last token (re-run for its logits)
    assert cache.reuse_prefix(ids[:P]) == P - 1
    # diverging inside the prompt: no state recorded before P - 1, reuse stops at 0
    inside = ids[:P - 5] + ids[55:60]
    assert cache.reuse_prefix(inside) == 0
    assert cache.length == 0


def test_memory_counts_records(model, ids):
    cache = model.new_cache(64)
    model(ids[:P], cache)
    base = cache.nbytes()
    model(ids[P:P + W], cache)  # W records, each an ssm state per recurrent layer
    r = model.config.recurrent
    ssm = sum(r.layers) * r.n_v_heads * r.head_k_dim * r.head_v_dim * 4
    assert cache.nbytes() - base >= W * ssm
