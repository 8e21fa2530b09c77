"""gemma4's 26B-A4B mixture of experts (engine.models.gemma4_moe over engine.models.moe) against transformers'
Gemma4ForCausalLM in float64, on a tiny random 26B-like model (four layers, three sliding and one global with
K = V; 8 experts, top 2, beside every layer's dense FFN) written as GGUF in llama.cpp's layout (fused
``ffn_gate_up_exps``, ``ffn_down_exps``, router ``ffn_gate_inp`` with ``ffn_gate_inp.scale``, per-expert scale
``ffn_down_exps.scale``, the branches' ``pre_ffw_norm_2``/``post_ffw_norm_1``/``post_ffw_norm_2``), in f32 and
with Q8_0 experts."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.config import UnsupportedModelError  # noqa: E402
from engine.models.gemma4_moe import Gemma4MoE  # noqa: E402
from engine.models.loader import load_model, read_config  # noqa: E402
from engine.models.moe import Routing  # noqa: E402
from engine.ops.kernels import qdot_status  # noqa: E402
from engine.ops.linear import QDotLinear  # noqa: E402
from tests import hf_tiny_gemma4  # noqa: E402
from tests.model_checks import TOL, cached_greedy, random_ids, verify_with_rollback  # noqa: E402
from tests.model_checks import relative_error as _close  # noqa: E402

SEQ = 40  # the window (8) wraps five times
E, K, N_LAYER = 8, 2, 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    return hf_tiny_gemma4.make_gemma4("26b", tmp_path_factory.mktemp("g4moe"))


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


def test_config(model):
    cfg = model.config
    assert cfg.arch == "gemma4" and cfg.n_layer == N_LAYER
    assert cfg.local_layers == (True, True, True, False) and cfg.layer_head_dim == (16, 16, 16, 32)
    assert (cfg.moe.n_expert, cfg.moe.n_expert_used, cfg.moe.n_ff_expert) == (E, K, 32)
    assert cfg.moe.dense_branch and cfg.moe.normalize_weights and cfg.moe.weights_scale == 1.0
    assert [layer.attn.v_from_k for layer in model.layers] == [False, False, False, True]
    for layer in model.layers:
        assert isinstance(layer.ffn, Gemma4MoE) and layer.ffn_norm is None
        assert layer.ffn.dense.w2.in_features == hf_tiny_gemma4.N_FF and len(layer.ffn.moe.experts) == E
        assert layer.ffn.router.weight.out_features == E and layer.ffn.expert_scale.shape == (E,)
        assert layer.ffn.moe.experts[0].w13.out_features == 2 * 32  # gate and up rows of the fused tensor


def test_prefill(model, reference):
    ids, ref = reference
    cache = model.new_cache(64)
    logits = model(ids, cache)
    assert logits.shape == ref.shape and cache.length == len(ids)
    assert _close(logits, ref) < TOL


def test_token_by_token(model, reference):
    ids, ref = reference
    cache = model.new_cache(64)
    out = torch.cat([model(ids[:20], cache), *[model([t], cache) for t in ids[20:]]])
    assert _close(out, ref) < TOL


def test_verification_with_rejection(pair, model, reference):
    """(k+1)-wide forwards whose tail is wrong, truncated away and redone: the rollback is a length."""
    ids, ref = reference
    assert _close(verify_with_rollback(model, ids, pair.vocab_size), ref) < TOL


def test_greedy_generation(pair, model):
    prompt = _ids(pair, 10, seed=3)
    want: list[int] = []
    with torch.no_grad():
        for _ in range(16):  # full forwards: no cache on the reference side
            want.append(int(pair.hf(torch.tensor([prompt + want])).logits[0, -1].argmax()))
    assert cached_greedy(model, prompt, 16) == want


def test_routing_matches_transformers(pair, model):
    """Every token of every layer goes to the same experts as in transformers, with the same weights (per-expert
    scale included): the router reads the un-normed residual stream, RMS-normed and scaled."""
    ids = _ids(pair, SEQ, seed=5)
    ours: list[Routing] = []
    theirs: list[tuple[torch.Tensor, torch.Tensor]] = []
    originals = [layer.ffn.route for layer in model.layers]
    for layer, route in zip(model.layers, originals):
        layer.ffn.route = lambda x, route=route: ours.append(route(x)) or ours[-1]
    hooks = [layer.router.register_forward_hook(lambda m, i, o: theirs.append((o[1], o[2])))
             for layer in pair.hf.model.layers]
    try:
        model(ids, model.new_cache(64))
        with torch.no_grad():
            pair.hf(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
        for layer in model.layers:
            del layer.ffn.route
    assert len(ours) == len(theirs) == N_LAYER
    used = set()
    for r, (w_ref, e_ref) in zip(ours, theirs):
        assert torch.equal(r.experts, e_ref)  # same experts in the same (best-first) order
        # f32 on both sides, summed in different orders (2e-5 apart on an AVX2 host)
        torch.testing.assert_close(r.weights.double(), w_ref.double(), rtol=1e-4, atol=1e-5)
        used |= set(r.experts.flatten().tolist())
    assert len(used) == E  # the test prompt exercises every expert


def test_only_routed_experts_run_and_batches_group_by_expert(pair, model):
    """A decoded token runs its k experts and no other; a 5-wide batch runs each chosen expert once and gives
    what the tokens give one at a time."""
    calls: list[tuple[int, int, int]] = []  # (layer, expert, rows)
    hooks = [ex.register_forward_hook(lambda m, i, o, li=li, e=e: calls.append((li, e, i[0].shape[0])))
             for li, layer in enumerate(model.layers) for e, ex in enumerate(layer.ffn.moe.experts)]
    ids = _ids(pair, 12, seed=2)
    try:
        cache = model.new_cache(32)
        model(ids[:7], cache)
        calls.clear()
        model([ids[7]], cache)
        assert len(calls) == N_LAYER * K and all(rows == 1 for *_, rows in calls)
        cache.truncate(7)
        single = torch.cat([model([t], cache) for t in ids[7:]])
        cache.truncate(7)
        calls.clear()
        batch = model(ids[7:], cache)
    finally:
        for h in hooks:
            h.remove()
    for li in range(N_LAYER):
        mine = [e for l_, e, _ in calls if l_ == li]
        assert len(set(mine)) == len(mine)  # each expert ran once
        assert sum(rows for l_, _, rows in calls if l_ == li) == 5 * K
    torch.testing.assert_close(batch, single, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["qdot", "f32"])
def test_q8_0_experts(pair, model, tmp_path, fmt):
    """Experts stored as Q8_0 (router, scales and the dense branch f32, as a quantized file keeps the router)
    keep their stored codes through qdot: under the same routing they give the f32 experts' output within
    Q8_0's rounding, and the model stays close to the float64 reference."""
    if fmt == "qdot" and not qdot_status().available:
        pytest.skip(f"qdot kernel not available: {qdot_status().detail}")
    q8 = hf_tiny_gemma4.make_gemma4("26b", tmp_path, expert_type="Q8_0")  # the same seed: the same weights
    with GGUFFile(q8.path) as f:
        assert f.tensors["blk.0.ffn_gate_up_exps.weight"].type_name == "Q8_0"
        assert f.tensors["blk.0.ffn_down_exps.weight"].type_name == "Q8_0"
        assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
    m = load_model(q8.path, fmt=fmt)
    if fmt == "qdot":
        for ex in m.layers[0].ffn.moe.experts:
            assert isinstance(ex.w13, QDotLinear) and ex.w13.bits == 8 and isinstance(ex.w2, QDotLinear)
    x = torch.randn(SEQ, hf_tiny_gemma4.N_EMBD, generator=torch.Generator().manual_seed(0))
    for theirs, ours in zip(model.layers, m.layers):
        routing = theirs.ffn.route(x)
        assert torch.equal(ours.ffn.route(x).experts, routing.experts)  # the router stays f32
        want = theirs.ffn.moe.mix(x, routing).double()
        assert _close(ours.ffn.moe.mix(x, routing), want) < 0.02
        one = Routing(routing.experts[:1], routing.weights[:1])  # the decode path, on the batch's scale
        assert float((ours.ffn.moe.mix(x[:1], one).double() - want[:1]).abs().max() / want.abs().max()) < 0.02
    ids = _ids(pair, SEQ)
    with torch.no_grad():
        ref = pair.hf(torch.tensor([ids])).logits[0].double()
    cache = m.new_cache(64)
    out = torch.cat([m(ids[:25], cache), *[m([t], cache) for t in ids[25:]]]).double()
    # End to end, most positions stay close, not all: rounding can flip a near-tied routing choice (another
    # expert runs), and the tiny model's one-hot attention carries that on to later positions. qdot also runs
    # the f32 attention and dense weights, and the activations, in 8 bits.
    err = (out - ref).abs().max(-1).values / ref.abs().max()
    assert float(err.median()) < (0.02 if fmt == "f32" else 0.1)
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.8


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
        model_run = generate(engine, **GREEDY, **spec_opts("model", 4))
        assert model_run.spec.draft_n_accepted == model_run.spec.draft_n > 0  # the same model accepts all
    finally:
        engine.close()


def test_missing_moe_tensors_are_refused(pair, tmp_path):
    """A 26B file without its per-expert scale, or with a router but no expert metadata, is refused rather
    than run without part of its FFN (wrong output, not an error)."""
    tensors = hf_tiny_gemma4.gguf_tensors(pair.hf.state_dict())
    short = dict(tensors)
    del short["blk.1.ffn_down_exps.scale"]
    path = hf_tiny_gemma4.write_gemma4_gguf(tmp_path / "no-scale.gguf", pair.config, short)
    with pytest.raises(UnsupportedModelError, match=r"blk\.1\.ffn_down_exps\.scale is missing"):
        load_model(path, fmt="f32")
    cfg = copy.deepcopy(pair.config)
    cfg.enable_moe_block = False  # the writer then leaves out the expert metadata
    path = hf_tiny_gemma4.write_gemma4_gguf(tmp_path / "no-meta.gguf", cfg, tensors)
    with GGUFFile(path) as f:
        with pytest.raises(UnsupportedModelError, match="expert_count"):
            read_config(f)
