"""gemma4 (engine.models.gemma4 + the shared layers, the layered KV cache) against transformers' Gemma4ForCausalLM
in float64, on tiny random E2B-like (per-layer embeddings, KV sharing) and 31B-like (K = V, own K/V head
count on global layers) models written as GGUF in llama.cpp's layout."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

from engine.cache.layered import LayeredKVCache, LayerShape  # noqa: E402
from engine.contract.capabilities import SUPPORTED_ARCHITECTURES  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from tests import hf_tiny_gemma4  # noqa: E402
from tests.cpu_formats import fmt_param
from tests.model_checks import TOL, cached_greedy, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402

SEQ = 40  # the window (8) wraps five times


@pytest.fixture(scope="module", params=["e2b", "31b"])
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    return hf_tiny_gemma4.make_gemma4(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


@pytest.fixture(scope="module")
def reference(pair):
    ids = _ids(pair, SEQ)
    with torch.no_grad():
        return ids, pair.hf(torch.tensor([ids])).logits[0].double()


def _ids(pair, n, seed=1):
    return random_ids(pair.vocab_size, n, seed)


def test_registered():
    assert "gemma4" in SUPPORTED_ARCHITECTURES


def test_config(pair, model):
    cfg = model.config
    assert cfg.arch == "gemma4" and cfg.n_layer == 6 and cfg.vocab_size == pair.vocab_size
    assert cfg.local_layers == (True, True, False, True, True, False) and cfg.sliding_window == 8
    assert cfg.layer_head_dim == (16, 16, 32, 16, 16, 32)
    assert cfg.attn_scale == 1.0 and cfg.v_norm and not cfg.rope_freqs_local
    assert (cfg.rope_base, cfg.rope_base_local, cfg.rope_dim, cfg.rope_dim_local) == (1e6, 1e4, 32, 16)
    if pair.variant == "e2b":
        assert cfg.kv_source == (0, 1, 2, 3, 3, 2)  # layers 4, 5 read the last sliding / global layer's K/V
        assert cfg.per_layer_input == 8 and cfg.final_softcap == 30.0
        assert isinstance(model.new_cache(16), LayeredKVCache)
        # per-layer feed_forward_length: the shared layers' FFN is twice as wide
        assert [layer.ffn.w2.in_features for layer in model.layers] == [96] * 4 + [192] * 2
        assert [layer.attn.owns_kv for layer in model.layers] == [True] * 4 + [False] * 2
    else:
        assert cfg.kv_source == tuple(range(6)) and cfg.per_layer_input == 0
        assert cfg.layer_n_head_kv == (2, 2, 1, 2, 2, 1)
        assert [layer.attn.v_from_k for layer in model.layers] == [False, False, True, False, False, True]


def test_prefill(model, reference):
    ids, ref = reference
    cache = model.new_cache(64)
    logits = model(ids, cache)
    assert logits.shape == ref.shape and cache.length == len(ids)
    assert _close(logits, ref) < TOL


def test_token_by_token(model, reference):
    ids, ref = reference
    cache = model.new_cache(64)
    out = torch.cat([model([t], cache) for t in ids])
    assert _close(out, ref) < TOL


def test_verification_with_rejection(pair, model, reference):
    """(k+1)-wide forwards whose tail is wrong, truncated away and redone: the rollback is a length."""
    ids, ref = reference
    assert _close(verify_with_rollback(model, ids, pair.vocab_size), ref) < TOL


def test_prefix_reuse(pair, model):
    ids = _ids(pair, 30)
    cache = model.new_cache(64)
    model(ids, cache)
    new = ids[:17] + _ids(pair, 6, seed=9)
    n = cache.reuse_prefix(new)
    assert n == 17
    tail = model(new[n:], cache)
    fresh = model(new, model.new_cache(64))
    assert torch.allclose(tail, fresh[17:], atol=1e-5)


def test_greedy_generation(pair, model):
    prompt = _ids(pair, 10, seed=3)
    want: list[int] = []
    with torch.no_grad():
        for _ in range(16):  # full forwards: no cache on the reference side
            want.append(int(pair.hf(torch.tensor([prompt + want])).logits[0, -1].argmax()))
    assert cached_greedy(model, prompt, 16) == want


def test_layered_cache_shares_and_rolls_back():
    shapes = [LayerShape(2, 4, 0), LayerShape(1, 8, 1), LayerShape(2, 4, 0)]
    c = LayeredKVCache(shapes, 10)
    assert c.k_layers[2] is None and c.nbytes() == 4 * 2 * (2 * 10 * 4 + 1 * 10 * 8)
    k0 = torch.randn(2, 3, 4)
    keys, _ = c.store(0, k0, k0 + 1)
    c.store(1, torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    k2, v2 = c.read(2, 0, 3)  # layer 2 reads layer 0's entries, written in the same forward
    assert torch.equal(k2, k0) and torch.equal(v2, k0 + 1)
    c.commit([5, 6, 7])
    assert torch.equal(c.keys(2), k0) and c.values(1).shape == (1, 3, 8)
    c.truncate(1)
    assert c.length == 1 and c.tokens == [5] and c.keys(0).shape == (2, 1, 4)
    with pytest.raises(ValueError):
        c.store(2, k0, k0)  # a sharing layer stores nothing
    with pytest.raises(ValueError):
        LayeredKVCache([LayerShape(1, 4, 1), LayerShape(1, 4, 1)], 4)  # reads a later layer


@pytest.mark.parametrize("fmt,dtype", [fmt_param("bf16-packed", None), ("int8", None), ("bf16", torch.bfloat16),
                                       ("qdot", None)])
def test_weight_formats(pair, model, reference, fmt, dtype):
    """Requantized weights (and bf16 activations and cache) keep the f32 model's predictions."""
    from engine.ops.kernels import qdot_status

    if fmt == "qdot" and not qdot_status().available:
        pytest.skip(f"native kernels not available: {qdot_status().detail}")
    ids, _ = reference
    want = model(ids, model.new_cache(64))
    m = load_model(pair.path, fmt=fmt, dtype=dtype)
    cache = m.new_cache(64)
    got = torch.cat([m(ids[:25], cache), m(ids[25:], cache)]).float()
    assert torch.isfinite(got).all()
    agreement = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    # A tiny random gemma4 attends almost one-hot (scale 1 on normed q and k), so rounding moves its
    # logits more than gemma3's; the f32 model itself matches transformers to TOL.
    assert agreement >= 0.8
    assert _close(got, want.double()) < 0.25
