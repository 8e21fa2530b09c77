"""qwen35 (hybrid Gated DeltaNet + gated attention) against transformers' Qwen3_5ForCausalLM (float64) on tiny
random models written as GGUF in llama.cpp's layout (tests/hf_tiny_qwen35.py): 3 recurrent layers then one
full-attention layer, 4 value heads over 2 key heads (the tiled value-head order matters), partial RoPE; and
qwen35moe against Qwen3_5MoeForCausalLM (8 experts, top-2, a sigmoid-gated shared expert, no dense FFN).
The reference casts to float32 inside the delta rule, so the tolerance is float32-level."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine.cache.recurrent import HybridCache  # noqa: E402
from engine.models import deltanet  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from tests import hf_tiny, hf_tiny_qwen35  # noqa: E402
from tests.model_checks import TOL, cached_greedy, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402

SEQ = 80  # longer than one chunk of the parallel form (64): the state carries between chunks


@pytest.fixture(scope="module", params=["tied", "untied", "moe"])
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    return hf_tiny_qwen35.make_pair(tmp_path_factory.mktemp(request.param), tied=request.param != "untied",
                                    moe=request.param == "moe")


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


@pytest.fixture(scope="module")
def ref(pair):
    ids = random_ids(pair.vocab_size, SEQ)
    return ids, hf_tiny.hf_logits(pair.hf, ids)


def test_config(pair, model):
    cfg = model.config
    r = cfg.recurrent
    moe = pair.spec.n_expert > 0
    assert cfg.arch == ("qwen35moe" if moe else "qwen35") and cfg.attn_output_gate and cfg.qk_norm
    if moe:
        assert (cfg.moe.n_expert, cfg.moe.n_expert_used, cfg.moe.n_ff_expert, cfg.moe.n_ff_shared) == (8, 2, 32, 48)
        assert cfg.n_ff == 0  # no feed_forward_length in the file
    else:
        assert cfg.moe is None
    assert r.layers == (True, True, True, False)
    assert (r.conv_kernel, r.n_k_heads, r.n_v_heads, r.head_k_dim, r.head_v_dim) == (4, 2, 4, 16, 16)
    assert (cfg.head_dim, cfg.rope_dim, cfg.rope_style) == (32, 8, "neox")
    assert cfg.tied_output == pair.spec.tied_output
    assert isinstance(model.new_cache(16), HybridCache)


def test_prefill_chunked(model, ref):
    ids, want = ref
    logits = model(ids, model.new_cache(128))
    assert _close(logits, want) < TOL


def test_prefill_exact_width(model, ref):
    """A forward no wider than EXACT_WIDTH runs the per-token recurrence: same logits."""
    ids, want = ref
    n = deltanet.EXACT_WIDTH
    assert _close(model(ids[:n], model.new_cache(64)), want[:n]) < TOL


def test_decode_token_by_token(model, ref):
    ids, want = ref
    cache = model.new_cache(128)
    prefill = model(ids[:20], cache)
    steps = [model([t], cache) for t in ids[20:]]
    assert _close(torch.cat([prefill, *steps]), want) < TOL


def test_verification_width_with_truncate_and_redo(model, ref, pair):
    """(k+1)-wide forwards whose tail is wrong, truncated to the accepted prefix (the recurrent state restored
    to the recorded one) and continued, as the decode loop does after a rejection."""
    ids, want = ref
    for width in (2, 5, 9):
        got = verify_with_rollback(model, ids, pair.vocab_size, width=width, capacity=128)
        assert _close(got, want) < TOL


def test_wide_verification_after_prefix(model, ref):
    ids, want = ref
    cache = model.new_cache(128)
    model(ids[:40], cache)
    assert _close(model(ids[40:46], cache), want[40:46]) < TOL


def test_greedy_generation(pair, model):
    prompt = random_ids(pair.vocab_size, 8, seed=3)
    want = hf_tiny.hf_greedy(pair.hf, prompt, 16)
    assert cached_greedy(model, prompt, 16) == want
