"""engine.models (GGUF loader, layers, transformer) against transformers (float64) on tiny random llama / qwen2 / gemma3 models."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

from engine.cache.kv import ContextOverflowError  # noqa: E402
from engine.contract.capabilities import SUPPORTED_ARCHITECTURES  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.config import UnsupportedArchitectureError, UnsupportedModelError  # noqa: E402
from engine.models.loader import load_model, read_config  # noqa: E402
from engine.models.transformer import ForwardOutput  # noqa: E402
from engine.ops.kernels import qdot_fast, qdot_status
from tests import hf_tiny  # noqa: E402
from tests.cpu_formats import fmt_param  # noqa: E402
from tests.model_checks import TOL, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402
from tests.tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

ARCHS = ["llama", "qwen2", "gemma3"]
SEQ = {"llama": 32, "qwen2": 32, "gemma3": 48}  # gemma3: window 8 wraps 6 times


@pytest.fixture(scope="module", params=ARCHS + ["qwen2-untied"])
def pair(request, tmp_path_factory):
    arch = request.param.split("-")[0]
    tied = not request.param.endswith("untied")
    torch.set_num_threads(1)
    return hf_tiny.make_pair(arch, tmp_path_factory.mktemp(request.param), tied=tied)


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


def _ids(pair, n, seed=1):
    return random_ids(pair.vocab_size, n, seed)


def test_config(pair, model):
    cfg = model.config
    assert cfg.arch == pair.arch
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (
        pair.spec.n_layer, 64, 4, 2, 16)
    assert cfg.vocab_size == pair.vocab_size
    assert cfg.tied_output == pair.spec.tied_output
    assert cfg.rope_base == hf_tiny.ROPE_BASE[pair.arch]
    assert cfg.context_length == 256
    if pair.arch == "gemma3":
        assert cfg.sliding_window == 8
        assert cfg.local_layers == (True,) * 5 + (False,)
        assert cfg.rope_base_local == 10000.0
        assert cfg.embed_scale == pytest.approx(8.0)
        assert cfg.qk_norm and cfg.post_norms and cfg.activation == "gelu_tanh"
    else:
        assert cfg.sliding_window is None and not cfg.post_norms
    assert cfg.qkv_bias == (pair.arch == "qwen2")
    assert cfg.rope_style == ("normal" if pair.arch == "llama" else "neox")


def test_one_forward(pair, model):
    ids = _ids(pair, SEQ[pair.arch])
    ref = hf_tiny.hf_logits(pair.hf, ids)
    cache = model.new_cache()
    logits = model(torch.tensor(ids), cache)
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), pair.vocab_size)
    assert cache.length == len(ids) and cache.tokens == ids
    assert _close(logits, ref) < TOL


def test_token_by_token(pair, model):
    ids = _ids(pair, SEQ[pair.arch])
    ref = hf_tiny.hf_logits(pair.hf, ids)
    cache = model.new_cache(64)
    out = torch.cat([model([t], cache) for t in ids])
    assert _close(out, ref) < TOL


def test_chunks_with_rejection(pair, model):
    """Chunks of 5 where the last drafted tokens are wrong: truncate them away and re-append."""
    ids = _ids(pair, SEQ[pair.arch])
    ref = hf_tiny.hf_logits(pair.hf, ids)
    assert _close(verify_with_rollback(model, ids, pair.vocab_size), ref) < TOL


def test_fused_block_ops_match_pytorch_ops(pair, model):
    """With the native library built, an f32 CPU model runs RMSNorm, RoPE and attention through the fused ops
    (so every HF-oracle test above checks them); switched off, PyTorch's own ops give the same logits."""
    from engine.ops.kernels import qdot_status

    if not qdot_status().available:
        pytest.skip(f"native kernels not available: {qdot_status().detail}")
    assert model.block_ops is not None
    ids = _ids(pair, SEQ[pair.arch])
    fused = model(torch.tensor(ids), model.new_cache())
    try:
        model.use_block_ops(False)
        assert model.block_ops is None
        plain = model(torch.tensor(ids), model.new_cache())
    finally:
        model.use_block_ops(True)
    # float rounding only: the fused attention sums keys in another order than PyTorch's flash kernel
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    bf16 = load_model(pair.path, fmt="bf16", dtype=torch.bfloat16)
    assert bf16.block_ops is None  # the ops are f32-only


def test_greedy_generation(pair, model):
    prompt = _ids(pair, 8, seed=3)
    want = hf_tiny.hf_greedy(pair.hf, prompt, 20)
    cache = model.new_cache(64)
    logits = model(prompt, cache, logits_for="last")
    assert logits.shape == (1, pair.vocab_size)
    got = []
    for _ in range(20):
        t = int(logits[-1].argmax())
        got.append(t)
        logits = model([t], cache)
    assert got == want


def test_return_hidden_and_logits_for(pair, model):
    ids = _ids(pair, 12)
    cache = model.new_cache(32)
    full = model(ids, cache)
    cache.truncate(0)
    out = model(ids, cache, logits_for="last", return_hidden=True)
    assert isinstance(out, ForwardOutput)
    assert out.hidden.shape == (12, 64) and out.prenorm_hidden.shape == (12, 64)
    assert torch.allclose(out.logits[0], full[-1], atol=1e-5)
    # hidden = final_norm(prenorm_hidden); logits = lm_head(hidden)
    assert torch.allclose(model.norm(out.prenorm_hidden), out.hidden)
    assert torch.allclose(model.output(out.hidden[-1:]).float(), out.logits, atol=1e-5)
    cache.truncate(0)
    none = model(ids, cache, logits_for="none", return_hidden=True)
    assert none.logits is None and torch.allclose(none.hidden, out.hidden)
    assert model(ids[:1], model.new_cache(4), logits_for="none") is None


def test_prefix_reuse_gives_same_logits(pair, model):
    ids = _ids(pair, 24)
    cache = model.new_cache(64)
    ref = model(ids, cache)
    new = ids[:15] + _ids(pair, 5, seed=9)
    n = cache.reuse_prefix(new)
    assert n == 15 and cache.length == 15
    tail = model(new[n:], cache)
    fresh = model(new, model.new_cache(64))
    assert torch.allclose(tail, fresh[15:], atol=1e-5)
    assert torch.allclose(fresh[:15], ref[:15], atol=1e-5)


def test_context_overflow(pair, model):
    cache = model.new_cache(10)
    model(_ids(pair, 8), cache)
    with pytest.raises(ContextOverflowError):
        model(_ids(pair, 3), cache)
    assert cache.length == 8  # untouched
    model(_ids(pair, 2), cache)
    assert cache.length == 10


# -- weight formats ----------------------------------------------------------------------------
def _agreement(out, ref):
    return float((out.argmax(-1) == ref.argmax(-1)).float().mean())


def test_a_format_this_cpu_cannot_run_is_refused_at_load(tmp_path):
    """bf16-packed on an AVX2-only CPU (oneDNN raises deep in the first linear) is refused up front, with
    the reason, as a model the engine cannot run; on a CPU that runs it, it loads."""
    from engine.ops.kernels import cpu_flags
    from engine.ops.linear import format_problem

    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="llama"))
    flags = cpu_flags()
    runs = {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags
    assert (format_problem("bf16-packed") is None) == runs
    if runs:
        assert load_model(path, fmt="bf16-packed").fmt == "bf16-packed"
    else:
        with pytest.raises(UnsupportedModelError, match="bf16-packed.*AVX512BW"):
            load_model(path, fmt="bf16-packed")


@pytest.mark.parametrize("fmt,dtype", [("bf16", None), fmt_param("bf16-packed", None), ("int8", None),
                                       fmt_param("bf16-packed", torch.bfloat16), ("qdot", None)])
def test_formats_from_f32(pair, model, fmt, dtype):
    """bf16 / int8 weights (requantized from the f32 file) against f32: top-1 >= 85 %, logits close.
    dtype=bf16: activations and KV cache in bf16 too."""
    ids = _ids(pair, SEQ[pair.arch])
    ref = model(ids, model.new_cache(64))
    m = load_model(pair.path, fmt=fmt, dtype=dtype)
    cache = m.new_cache(64)
    assert cache.dtype == (dtype or torch.float32)
    out = torch.cat([m(ids[:20], cache), m(ids[20:], cache)])
    # top-1 among random logits with near-ties: gemma3 int8 agrees on 43 of 48 with torch's AVX2 kernels
    assert _agreement(out, ref) >= 0.85
    assert _close(out, ref.double()) < 0.08  # gemma3 int8: 0.043 (6 layers, peaked attention)


@pytest.fixture(scope="module")
def q4_path(pair, tmp_path_factory):
    return hf_tiny.write_variant(pair, "Q4_0", tmp_path_factory.mktemp("q4"))


@pytest.mark.parametrize("fmt", ["int4", "auto-int4", "auto", "qdot"])
def test_int4_from_q4_file(pair, q4_path, fmt):
    """A Q4_0 file maps onto the int4 kernel exactly: only bf16 activations separate it from f32
    (qdot: the same codes, activations rounded to int8 per 32 values)."""
    if fmt == "qdot" and not qdot_status().available:
        pytest.skip(f"qdot kernel not available: {qdot_status().detail}")
    ids = _ids(pair, SEQ[pair.arch])
    m32 = load_model(q4_path, fmt="f32")
    ref = m32(ids, m32.new_cache(64))
    m = load_model(q4_path, fmt=fmt)
    if fmt == "auto":
        assert m.fmt == ("qdot" if qdot_fast() else "auto-int4")
    out = m(ids, m.new_cache(64))
    assert _agreement(out, ref) >= 0.9
    assert _close(out, ref.double()) < 0.05


def test_int4_requantized_sanity(pair, model):
    """int4 requantized from f32 weights is lossy (random tiny models have small top-1 margins)."""
    ids = _ids(pair, SEQ[pair.arch])
    ref = model(ids, model.new_cache(64))
    m = load_model(pair.path, fmt="int4")
    out = m(ids, m.new_cache(64))
    assert _agreement(out, ref) >= 0.5
    assert _close(out, ref.double()) < 0.6  # measured 0.17-0.43


# -- loader errors ------------------------------------------------------------------------------
def test_supported_architectures():
    from engine.models import ARCHITECTURES, ENCODERS

    assert set(ARCHITECTURES) == {"llama", "qwen2", "gemma3", "gemma4", "qwen3", "qwen3moe", "qwen35", "qwen35moe"}
    assert set(ENCODERS) == {"bert"}
    assert SUPPORTED_ARCHITECTURES == set(ARCHITECTURES) | set(ENCODERS)


def test_unsupported_architecture(tmp_path):
    path = write_tiny_gguf(tmp_path / "x.gguf", TinySpec(arch="mamba"))
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        load_model(path, fmt="f32")


def test_rope_scaling(tmp_path):
    spec = TinySpec(arch="llama", extra_metadata={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    with GGUFFile(write_tiny_gguf(tmp_path / "yarn.gguf", spec)) as f:
        with pytest.raises(UnsupportedModelError, match="yarn"):
            read_config(f)
    spec = TinySpec(arch="llama", extra_metadata={"llama.rope.scaling.type": "linear",
                                                  "llama.rope.scaling.factor": 2.0})
    with GGUFFile(write_tiny_gguf(tmp_path / "lin.gguf", spec)) as f:
        cfg = read_config(f)
    assert cfg.rope_scaling == "linear" and cfg.rope_scale_factor == 2.0


def test_linear_rope_scaling_matches_hf(tmp_path):
    """Linear RoPE scaling = positions / factor (HF rope_type 'linear')."""
    import transformers as tf

    spec = hf_tiny.tiny_spec("qwen2")
    spec.extra_metadata = {"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 4.0}
    vocab = len(hf_tiny.vocab_for(spec)[0])
    hf = hf_tiny.build_hf(spec, vocab)
    cfg = hf_tiny.hf_config(spec, vocab)
    cfg.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": spec.rope_base}
    hf2 = tf.Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64)
    hf2.load_state_dict(hf.state_dict())
    with torch.no_grad():
        for p in hf2.parameters():
            p.copy_(p.float().double())
    path = tmp_path / "lin.gguf"
    write_tiny_gguf(path, spec, tensors=hf_tiny.to_gguf_tensors(hf2.eval(), spec))
    ids = list(range(3, 35))
    m = load_model(path, fmt="f32")
    assert _close(m(ids, m.new_cache(64)), hf_tiny.hf_logits(hf2.eval(), ids)) < TOL


def test_gemma3_softcapping(tmp_path):
    """Final logit soft-capping against transformers; gemma3 ignores attention soft-capping (as HF does)."""
    p = hf_tiny.make_pair("gemma3", tmp_path, final_softcap=3.0, attn_softcap=5.0)
    m = load_model(p.path, fmt="f32")
    assert m.config.final_softcap == 3.0 and m.config.attn_softcap is None
    ids = _ids(p, 40)
    ref = hf_tiny.hf_logits(p.hf, ids)
    assert float(ref.abs().max()) <= 3.0
    assert _close(m(ids, m.new_cache(64)), ref) < TOL
    cache = m.new_cache(64)
    steps = torch.cat([m(ids[i:i + 3], cache) for i in range(0, 40, 3)])
    assert _close(steps, ref) < TOL


def test_attention_softcap_path(pair, model):
    """The manual soft-capped attention path equals SDPA when the cap is far above every score."""
    ids = _ids(pair, 20)
    ref = model(ids, model.new_cache(32))
    try:
        for layer in model.layers:
            layer.attn.softcap = 1e6
        cache = model.new_cache(32)
        out = torch.cat([model(ids[:13], cache), model(ids[13:], cache)])
    finally:
        for layer in model.layers:
            layer.attn.softcap = None
    assert _close(out, ref.double()) < 1e-5


def test_gemma3_sliding_pattern_metadata(tmp_path):
    """A GGUF-provided period overrides the default of 6."""
    spec = hf_tiny.tiny_spec("gemma3", n_layer=4)
    spec.extra_metadata = {"gemma3.attention.sliding_window_pattern": 2}
    with GGUFFile(write_tiny_gguf(tmp_path / "g.gguf", spec)) as f:
        cfg = read_config(f)
    assert cfg.local_layers == (True, False, True, False)


def test_llama3_rope_freqs_match_hf(tmp_path):
    """Llama 3.x RoPE scaling: llama.cpp's converter stores per-frequency divisors as rope_freqs.weight."""
    import transformers as tf

    spec = hf_tiny.tiny_spec("llama")
    vocab = len(hf_tiny.vocab_for(spec)[0])
    base_hf = hf_tiny.build_hf(spec, vocab)
    cfg = hf_tiny.hf_config(spec, vocab)
    cfg.rope_parameters = {"rope_type": "llama3", "rope_theta": spec.rope_base, "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float64)
    hf.load_state_dict(base_hf.state_dict())
    hf = hf.double().eval()
    plain = 1.0 / (spec.rope_base ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    factors = plain / hf.model.rotary_emb.inv_freq.double()
    assert factors.max() > 1.5  # the low frequencies really are scaled
    tensors = hf_tiny.to_gguf_tensors(hf, spec)
    tensors["rope_freqs.weight"] = factors.float().numpy()
    path = write_tiny_gguf(tmp_path / "llama3.gguf", spec, tensors=tensors)
    ids = list(range(5, 45))
    m = load_model(path, fmt="f32")
    assert _close(m(ids, m.new_cache(64)), hf_tiny.hf_logits(hf, ids)) < TOL
