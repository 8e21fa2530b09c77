"""engine.cache.kv: O(1) truncation, prefix reuse, overflow, and sliding-window exactness under speculation."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from engine.cache.kv import ContextOverflowError, KVCache


def _cache(capacity=16, layers=2, heads=2, dim=4):
    return KVCache(layers, heads, dim, capacity)


def _kv(layers, heads, n, dim, fill):
    k = torch.full((layers, heads, n, dim), float(fill))
    return k, -k


def _append(c: KVCache, k: torch.Tensor, v: torch.Tensor, tokens: list[int]) -> None:
    """Write every layer (``k``: [n_layer, n_kv_heads, n, head_dim]) and commit, as a model forward does."""
    for layer in range(c.n_layer):
        c.store(layer, k[layer], v[layer])
    c.commit(tokens)


def test_new_from_config():
    cfg = SimpleNamespace(n_layer=3, n_head_kv=2, head_dim=8, v_head_dim=8, context_length=32)
    c = KVCache.new(cfg, device="cpu", dtype=torch.bfloat16)
    assert c.k.shape == (3, 2, 32, 8) and c.v.shape == (3, 2, 32, 8)
    assert c.k.dtype == torch.bfloat16 and c.capacity == 32 and c.length == 0 and c.tokens == []
    assert KVCache.new(cfg, 10).capacity == 10


def test_append_and_views():
    c = _cache()
    k, v = _kv(2, 2, 3, 4, 1)
    _append(c, k, v, [5, 6, 7])
    assert c.length == 3 and c.tokens == [5, 6, 7]
    assert torch.equal(c.keys(1), k[1]) and torch.equal(c.values(0), v[0])
    k2, v2 = _kv(2, 2, 2, 4, 2)
    _append(c, k2, v2, [8, 9])
    assert c.keys(0).shape == (2, 5, 4)
    assert torch.equal(c.keys(0)[:, 3:], k2[0])


def test_store_commit_protocol():
    """What the model does: store every layer at [length, length+n), then commit once."""
    c = _cache()
    _append(c, *_kv(2, 2, 4, 4, 1), [1, 2, 3, 4])
    for layer in range(2):
        kk, vv = c.store(layer, torch.full((2, 3, 4), 9.0), torch.full((2, 3, 4), -9.0), key_start=2)
        assert kk.shape == (2, 5, 4)  # positions 2..6
        assert torch.equal(kk[:, :2], torch.ones(2, 2, 4)) and torch.equal(kk[:, 2:], torch.full((2, 3, 4), 9.0))
    assert c.length == 4  # not advanced until commit
    c.commit([5, 6, 7])
    assert c.length == 7 and c.tokens == [1, 2, 3, 4, 5, 6, 7]


def test_truncate_is_o1():
    c = _cache()
    _append(c, *_kv(2, 2, 10, 4, 3), list(range(10)))
    k_ptr, v_ptr = c.k.data_ptr(), c.v.data_ptr()
    before = c.k.clone()
    c.truncate(4)
    assert c.length == 4 and c.tokens == [0, 1, 2, 3]
    assert c.k.data_ptr() == k_ptr and c.v.data_ptr() == v_ptr
    # Storage untouched: truncation is only a length. (Only the written slots are compared: the
    # rest is torch.empty memory, which may hold NaNs that never compare equal.)
    assert torch.equal(c.k[:, :, :10], before[:, :, :10])
    _append(c, *_kv(2, 2, 3, 4, 5), [7, 7, 7])
    c.truncate(4)  # a rollback is a truncation to the earlier length
    assert c.length == 4 and c.tokens == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        c.truncate(5)
    with pytest.raises(ValueError):
        c.truncate(-1)
    c.reset()
    assert c.length == 0 and c.tokens == []


def test_reuse_prefix():
    c = _cache()
    _append(c, *_kv(2, 2, 6, 4, 1), [1, 2, 3, 4, 5, 6])
    assert c.common_prefix([1, 2, 3, 9]) == 3
    assert c.common_prefix([]) == 0
    assert c.reuse_prefix([1, 2, 3, 9, 9]) == 3
    assert c.length == 3 and c.tokens == [1, 2, 3]
    # A new prompt entirely in the cache: keep all but its last token, so it can be forwarded for logits.
    assert c.reuse_prefix([1, 2, 3]) == 2 and c.length == 2
    _append(c, *_kv(2, 2, 1, 4, 1), [3])
    assert c.reuse_prefix([1, 2, 3], leave_last=False) == 3
    assert c.reuse_prefix([1, 2, 3, 4, 5]) == 3  # longer than the cache
    assert c.reuse_prefix([7]) == 0 and c.length == 0


def test_overflow():
    c = _cache(capacity=5)
    _append(c, *_kv(2, 2, 4, 4, 1), [1, 2, 3, 4])
    with pytest.raises(ContextOverflowError, match="num_ctx"):
        _append(c, *_kv(2, 2, 2, 4, 1), [5, 6])
    with pytest.raises(ContextOverflowError):
        c.store(0, torch.zeros(2, 2, 4), torch.zeros(2, 2, 4))
    assert c.length == 4 and c.tokens == [1, 2, 3, 4]
    _append(c, *_kv(2, 2, 1, 4, 1), [5])
    assert c.free == 0


def _window_attention(q, keys, values, qpos, kpos, window):
    """Reference: attention of each query over keys with kpos <= qpos and kpos > qpos - window."""
    s = q @ keys.T
    allowed = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > qpos[:, None] - window)
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ values


def test_sliding_window_exact_under_speculation():
    """Repeated append/truncate rounds, each wider than the window's remainder, reading through the
    window the way the model does (key_start = length - window + 1): every committed position must
    see exactly the keys of its true prefix, never a rejected draft's."""
    torch.manual_seed(0)
    window, dim, total = 4, 8, 40
    true_k = torch.randn(total, dim)
    true_v = torch.randn(total, dim)
    q_all = torch.randn(total, dim)
    c = KVCache(1, 1, dim, total + 8)
    rng = random.Random(0)
    while c.length < total:
        start = c.length
        width = rng.randint(1, 8)  # k + 1 verified positions, often wider than the window
        accepted = min(rng.randint(1, width), total - start)
        # drafts beyond the accepted run carry garbage keys
        k = torch.randn(width, dim)
        v = torch.randn(width, dim)
        end_true = min(start + width, total)
        k[: end_true - start] = true_k[start:end_true]
        v[: end_true - start] = true_v[start:end_true]
        if width > accepted:
            k[accepted] = 100.0  # the first rejected draft differs from the truth
        key_start = max(0, start - window + 1)
        keys, values = c.store(0, k[None], v[None], key_start)
        qpos = torch.arange(start, start + width)
        kpos = torch.arange(key_start, start + width)
        out = _window_attention(q_all[start:start + width] if start + width <= total else
                                torch.cat([q_all[start:], torch.randn(start + width - total, dim)]),
                                keys[0], values[0], qpos, kpos, window)
        c.commit([0] * width)
        c.truncate(start + accepted)
        # the accepted positions' outputs equal the exact windowed attention over the true sequence
        for j in range(accepted):
            p = start + j
            lo = max(0, p - window + 1)
            ref = _window_attention(q_all[p:p + 1], true_k[lo:p + 1], true_v[lo:p + 1],
                                    torch.tensor([p]), torch.arange(lo, p + 1), window)
            assert torch.allclose(out[j], ref[0], atol=1e-5), (p, start, width)
    assert torch.equal(c.keys(0)[0], true_k)
