"""qwen3 (dense) against transformers' Qwen3ForCausalLM (float64) on tiny random models written as GGUF in
llama.cpp's layout: per-head q/k RMSNorm before RoPE, NEOX RoPE, no biases, and a head size (32) that is not
n_embd / n_head (16), tied and untied output."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.config import UnsupportedModelError  # noqa: E402
from engine.models.loader import load_model, read_config  # noqa: E402
from engine.ops.kernels import qdot_status  # noqa: E402
from tests import hf_tiny  # noqa: E402
from tests.model_checks import TOL, cached_greedy, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402

SEQ = 32


@pytest.fixture(scope="module", params=["tied", "untied"])
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    return hf_tiny.make_pair("qwen3", tmp_path_factory.mktemp(request.param), tied=request.param == "tied")


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


def _ids(pair, n, seed=1):
    return random_ids(pair.vocab_size, n, seed)


def test_config(pair, model):
    cfg = model.config
    assert cfg.arch == "qwen3"
    assert (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rope_dim) == (64, 4, 2, 32, 32)
    assert cfg.head_dim != cfg.n_embd // cfg.n_head
    assert cfg.qk_norm and not cfg.qkv_bias and not cfg.post_norms
    assert cfg.rope_style == "neox" and cfg.rope_base == 1_000_000.0
    assert cfg.tied_output == pair.spec.tied_output
    assert cfg.query_scale == pytest.approx(32 ** -0.5)


def test_prefill(pair, model):
    ids = _ids(pair, SEQ)
    ref = hf_tiny.hf_logits(pair.hf, ids)
    logits = model(ids, model.new_cache())
    assert logits.shape == (SEQ, pair.vocab_size)
    assert _close(logits, ref) < TOL


def test_decode_token_by_token(pair, model):
    ids = _ids(pair, SEQ)
    ref = hf_tiny.hf_logits(pair.hf, ids)
    cache = model.new_cache(64)
    prefill = model(ids[:20], cache)
    steps = [model([t], cache) for t in ids[20:]]
    assert _close(torch.cat([prefill, *steps]), ref) < TOL


def test_verification_width_with_truncate_and_redo(pair, model):
    """(k+1)-wide forwards whose tail is wrong: truncate to the accepted prefix and go on, as the decode loop
    does after a rejection."""
    ids = _ids(pair, SEQ)
    ref = hf_tiny.hf_logits(pair.hf, ids)
    assert _close(verify_with_rollback(model, ids, pair.vocab_size), ref) < TOL


def test_greedy_generation(pair, model):
    prompt = _ids(pair, 8, seed=3)
    want = hf_tiny.hf_greedy(pair.hf, prompt, 16)
    assert cached_greedy(model, prompt, 16) == want


@pytest.mark.parametrize("fmt", ["qdot", "auto-int4"])
def test_q4_file(pair, tmp_path, fmt):
    """A Q4_0 file through the integer kernels against the same file dequantized to f32."""
    if fmt == "qdot" and not qdot_status().available:
        pytest.skip(f"qdot kernel not available: {qdot_status().detail}")
    path = hf_tiny.write_variant(pair, "Q4_0", tmp_path)
    ids = _ids(pair, SEQ)
    m32 = load_model(path, fmt="f32")
    ref = m32(ids, m32.new_cache(64))
    m = load_model(path, fmt=fmt)
    out = m(ids, m.new_cache(64))
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
    assert _close(out, ref.double()) < 0.05


def test_missing_qk_norm_is_refused(tmp_path):
    spec = hf_tiny.tiny_spec("qwen3")
    tensors = {k: v for k, v in hf_tiny.to_gguf_tensors(hf_tiny.build_hf(spec, len(hf_tiny.vocab_for(spec)[0])), spec).items()
               if "_norm" not in k or k.startswith("output") or "attn_norm" in k or "ffn_norm" in k}
    with GGUFFile(write_tiny_gguf(tmp_path / "x.gguf", spec, tensors=tensors)) as f:
        with pytest.raises(UnsupportedModelError, match="attn_q_norm"):
            read_config(f)
