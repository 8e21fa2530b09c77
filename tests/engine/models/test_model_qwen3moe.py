"""qwen3moe and the sparse MoE block (engine.models.moe) against transformers' Qwen3MoeForCausalLM (float64) on
a tiny random model (8 experts, top-2 renormalised, 2 layers) written as GGUF in llama.cpp's layout (router
``ffn_gate_inp``, experts stacked in 3-D ``ffn_{gate,up,down}_exps``), in f32 and with quantized experts."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.config import UnsupportedModelError  # noqa: E402
from engine.models.loader import load_model, read_config  # noqa: E402
from engine.models.moe import Routing, SparseMoE  # noqa: E402
from engine.ops.kernels import qdot_status  # noqa: E402
from engine.ops.linear import QDotLinear  # noqa: E402
from tests import hf_tiny  # noqa: E402
from tests.cpu_formats import fmt_param
from tests.model_checks import TOL, cached_greedy, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402
from tests.tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

SEQ = 32
E, K = hf_tiny.N_EXPERT, hf_tiny.N_EXPERT_USED


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    return hf_tiny.make_pair("qwen3moe", tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


def _ids(pair, n, seed=1):
    return random_ids(pair.vocab_size, n, seed)


def test_config(model):
    cfg = model.config
    assert cfg.arch == "qwen3moe" and cfg.qk_norm and cfg.head_dim == 32 and cfg.rope_style == "neox"
    assert (cfg.moe.n_expert, cfg.moe.n_expert_used, cfg.moe.n_ff_expert) == (E, K, hf_tiny.N_FF_EXPERT)
    assert cfg.moe.normalize_weights and cfg.moe.weights_scale == 1.0
    for layer in model.layers:
        assert isinstance(layer.ffn, SparseMoE) and len(layer.ffn.experts) == E
        assert layer.ffn.router.weight.out_features == E


def test_prefill_decode_and_greedy(pair, model):
    ids = _ids(pair, SEQ)
    ref = hf_tiny.hf_logits(pair.hf, ids)
    assert _close(model(ids, model.new_cache()), ref) < TOL
    cache = model.new_cache(64)
    out = torch.cat([model(ids[:20], cache), *[model([t], cache) for t in ids[20:]]])
    assert _close(out, ref) < TOL
    prompt = _ids(pair, 8, seed=3)
    want = hf_tiny.hf_greedy(pair.hf, prompt, 16)
    assert cached_greedy(model, prompt, 16) == want


def test_verification_width_with_truncate_and_redo(pair, model):
    ids = _ids(pair, SEQ)
    ref = hf_tiny.hf_logits(pair.hf, ids)
    assert _close(verify_with_rollback(model, ids, pair.vocab_size), ref) < TOL


def test_routing_matches_transformers(pair, model):
    """Every token of every layer goes to the same experts as in transformers, with the same weights."""
    ids = _ids(pair, SEQ, seed=5)
    ours: list[Routing] = []
    theirs: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [layer.ffn.router.register_forward_hook(lambda m, i, o: ours.append(o)) for layer in model.layers]
    hooks += [layer.mlp.gate.register_forward_hook(lambda m, i, o: theirs.append((o[1], o[2])))
              for layer in pair.hf.model.layers]
    try:
        model(ids, model.new_cache())
        hf_tiny.hf_logits(pair.hf, ids)
    finally:
        for h in hooks:
            h.remove()
    assert len(ours) == len(theirs) == 2
    used = set()
    for r, (w_ref, e_ref) in zip(ours, theirs):
        assert torch.equal(r.experts, e_ref)  # same experts in the same (best-first) order
        torch.testing.assert_close(r.weights.double(), w_ref.double(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.weights.sum(-1).double(), torch.ones(SEQ, dtype=torch.float64))
        used |= set(r.experts.flatten().tolist())
    assert len(used) == E  # the test prompt exercises every expert


def test_only_routed_experts_run_and_batches_group_by_expert(pair, model):
    """A token runs its k experts and no other; a 5-wide batch runs each chosen expert once, on all the
    tokens that chose it, and gives what the tokens give one at a time."""
    calls: list[tuple[int, int, int]] = []  # (layer, expert, rows)
    hooks = [ex.register_forward_hook(lambda m, i, o, li=li, e=e: calls.append((li, e, i[0].shape[0])))
             for li, layer in enumerate(model.layers) for e, ex in enumerate(layer.ffn.experts)]
    routes: list[Routing] = []
    hooks += [layer.ffn.router.register_forward_hook(lambda m, i, o: routes.append(o)) for layer in model.layers]
    ids = _ids(pair, 12, seed=2)
    try:
        cache = model.new_cache(32)
        model(ids[:7], cache)
        calls.clear(), routes.clear()
        model([ids[7]], cache)
        assert len(calls) == 2 * K
        for li in range(2):
            assert sorted(e for l_, e, _ in calls if l_ == li) == sorted(routes[li].experts[0].tolist())
        cache.truncate(7)
        single = torch.cat([model([t], cache) for t in ids[7:]])
        cache.truncate(7)
        calls.clear(), routes.clear()
        batch = model(ids[7:], cache)
    finally:
        for h in hooks:
            h.remove()
    for li in range(2):
        mine = [(e, rows) for l_, e, rows in calls if l_ == li]
        chosen = routes[li].experts
        assert len({e for e, _ in mine}) == len(mine)  # each expert ran once
        assert sorted(mine) == sorted((e, int((chosen == e).any(-1).sum())) for e in set(chosen.flatten().tolist()))
    torch.testing.assert_close(batch, single, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,fmt", [("Q8_0", "qdot"), ("Q4_0", "qdot"), ("Q4_0", "auto-int4"), ("Q8_0", "f32")])
def test_quantized_experts(pair, tmp_path, dtype, fmt):
    """Experts stored as Q8_0 / Q4_0 keep their stored codes through qdot (4 or 8 bits) and give the logits
    the same file gives dequantized to f32; the router stays f32 (llama.cpp never quantizes it)."""
    if fmt == "qdot" and not qdot_status().available:
        pytest.skip(f"qdot kernel not available: {qdot_status().detail}")
    path = hf_tiny.write_variant(pair, dtype, tmp_path)
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.ffn_gate_exps.weight"].type_name == dtype
        assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
    ids = _ids(pair, SEQ)
    m32 = load_model(path, fmt="f32")
    ref = m32(ids, m32.new_cache(64))
    m = load_model(path, fmt=fmt)
    if fmt == "qdot":
        bits = 8 if dtype == "Q8_0" else 4
        for ex in m.layers[0].ffn.experts:
            assert isinstance(ex.w13, QDotLinear) and ex.w13.bits == bits and isinstance(ex.w2, QDotLinear)
    out = m(ids, m.new_cache(64))
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
    assert _close(out, ref.double()) < (1e-6 if fmt == "f32" else 0.05)
    if dtype == "Q8_0":  # 8-bit experts stay close to the float64 reference itself
        assert _close(out, hf_tiny.hf_logits(pair.hf, ids)) < 0.02


def test_missing_expert_metadata(tmp_path):
    spec = TinySpec(arch="qwen3moe", head_dim=16, n_expert=4, n_expert_used=2, n_ff_expert=32)
    path = write_tiny_gguf(tmp_path / "ok.gguf", spec)
    assert load_model(path, fmt="f32").config.moe.n_expert == 4
    spec.n_expert_used = 5
    with GGUFFile(write_tiny_gguf(tmp_path / "bad.gguf", spec)) as f:
        with pytest.raises(UnsupportedModelError, match="expert_used_count"):
            read_config(f)


def test_speculative_decoding_is_lossless(pair):
    """The MoE target verifying drafts (k+1-wide forwards, grouped by expert) gives plain greedy decoding's
    tokens, with the same tiny model as its draft model and with n-gram drafting."""
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime
    from tests.engine.speculative.test_speculation import GREEDY, generate, spec_opts

    engine = ModelRuntime.load(LoadSpec(model_path=str(pair.path), draft_path=str(pair.path), num_ctx=128,
                                        weight_format="f32", draft_weight_format="f32", device="cpu"))
    try:
        base = generate(engine, **GREEDY, drafter="none")
        for drafter in ("model", "ngram"):
            run = generate(engine, **GREEDY, **spec_opts(drafter, 4))
            assert run.tokens == base.tokens and run.spec.drafter == drafter
        assert run.spec.draft_rounds > 0
        model_run = generate(engine, **GREEDY, **spec_opts("model", 4))
        assert model_run.spec.draft_n_accepted == model_run.spec.draft_n > 0  # the same model accepts all
    finally:
        engine.close()


def test_expert_tensors_that_do_not_match_the_metadata_are_refused(tmp_path):
    spec = TinySpec(arch="qwen3moe", head_dim=16, n_expert=4, n_expert_used=2, n_ff_expert=32)
    from tests.tiny_gguf import tiny_tensors, vocab_for

    tensors = tiny_tensors(spec, len(vocab_for(spec)[0]))
    tensors["blk.1.ffn_up_exps.weight"] = tensors["blk.1.ffn_up_exps.weight"][:3]  # an expert short
    path = write_tiny_gguf(tmp_path / "short.gguf", spec, tensors=tensors)
    with pytest.raises(UnsupportedModelError, match=r"blk\.1\.ffn_up_exps\.weight is shape \(3, 32, 64\), expected"):
        load_model(path, fmt="f32")


@pytest.mark.parametrize("fmt,dtype", [fmt_param("bf16-packed", None), fmt_param("bf16-packed", torch.bfloat16), ("int8", None)])
def test_other_formats(pair, model, fmt, dtype):
    """The experts in the bf16 and int8 formats (and bf16 activations): the router still computes in f32."""
    ids = _ids(pair, SEQ)
    ref = model(ids, model.new_cache(64))
    m = load_model(pair.path, fmt=fmt, dtype=dtype)
    cache = m.new_cache(64)
    out = torch.cat([m(ids[:7], cache), *[m([t], cache) for t in ids[7:]]])
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
    assert _close(out, ref.double()) < 0.05
