"""The native decoder stack (engine/ops/kernels/decoder.cpp via engine.models.fused_stack).

It must be invisible in results: a forward through it gives the very bits the Python blocks give
(logits and the KV cache it writes), for prompts, single tokens and verification widths, on the
shapes it takes (qwen2 with qkv biases and a Q4_K_M mix of Q4_K and Q6_K linears, so some fused
linears are split; qwen3 with q/k norms; llama); and models it does not take keep the Python blocks.
"""

from __future__ import annotations

import pytest
import torch

from engine.cache.kv import KVCache
from engine.models.loader import load_model
from engine.ops.kernels import qdot_status
from engine.ops.linear import SplitLinear
from importer.quantize import parse_quant_type, quantize_gguf
from tests.tiny_gguf import TinySpec, write_tiny_gguf

pytestmark = pytest.mark.skipif(not qdot_status().available,
                                reason=f"native kernels not available: {qdot_status().detail}")


def _q4_k_m(tmp_path, spec: TinySpec):
    src = write_tiny_gguf(tmp_path / f"{spec.arch}-f32.gguf", spec)
    dst = tmp_path / f"{spec.arch}-q4_k_m.gguf"
    quantize_gguf(src, dst, parse_quant_type("q4_K_M"))
    return dst


SPECS = {  # K-quants need rows of 256 values: n_embd and n_ff multiples of 256
    "qwen2": TinySpec(arch="qwen2", n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, seed=1),
    "qwen3": TinySpec(arch="qwen3", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, seed=2),
    "llama": TinySpec(arch="llama", n_layer=2, n_embd=256, n_ff=768, n_head=8, n_head_kv=8, seed=3),
}


@pytest.fixture(scope="module", params=list(SPECS))
def model(request, tmp_path_factory):
    path = _q4_k_m(tmp_path_factory.mktemp("fused"), SPECS[request.param])
    m = load_model(path, fmt="qdot")
    yield m
    m.close()


def _run(model, python_blocks: bool):
    """Logits of a prompt, then single tokens and verification widths with a rollback between, and the
    cache they leave."""
    model.use_fused_stack(not python_blocks)
    try:
        cache = model.new_cache(128)
        outs = [model.forward(list(range(5, 40)), cache, logits_for="all")]
        for feed in ([7], [9, 11, 13, 15], [17]):
            outs.append(model.forward(feed, cache, logits_for="all"))
        cache.truncate(cache.length - 3)  # a rejected draft
        outs.append(model.forward([19, 21], cache, logits_for="all"))
        return outs, cache
    finally:
        model.use_fused_stack(True)


def test_the_stack_gives_the_python_blocks_bits(model):
    fused, fused_cache = _run(model, python_blocks=False)
    assert model.fused_stack() is not None  # the model is a shape the stack runs
    plain, plain_cache = _run(model, python_blocks=True)
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)
    n = fused_cache.length
    assert n == plain_cache.length
    assert torch.equal(fused_cache.k[:, :, :n], plain_cache.k[:, :, :n])
    assert torch.equal(fused_cache.v[:, :, :n], plain_cache.v[:, :, :n])


def test_the_q4_k_m_mix_splits_some_linears(tmp_path):
    """The stack takes split linears (Q4_K q/k with a Q6_K v): the fixture's qwen2 has them, as the real
    Qwen2.5 Q4_K_M files do."""
    m = load_model(_q4_k_m(tmp_path, SPECS["qwen2"]), fmt="qdot")
    try:
        assert any(isinstance(b.attn.wqkv, SplitLinear) for b in m.layers)
        assert m.fused_stack() is not None
    finally:
        m.close()


def test_a_stack_it_does_not_take_keeps_the_python_blocks(tmp_path):
    gemma = load_model(write_tiny_gguf(tmp_path / "g.gguf", TinySpec(arch="gemma3", tokenizer="llama", seed=4)),
                       fmt="qdot")
    f32 = load_model(write_tiny_gguf(tmp_path / "q.gguf", TinySpec(arch="qwen2", seed=5)), fmt="f32")
    try:
        assert gemma.fused_stack() is None  # sliding windows and post norms
        assert f32.fused_stack() is None  # dense f32 linears
        # and they still run
        assert gemma.forward([1, 2, 3], gemma.new_cache(16)).shape[0] == 3
        assert f32.forward([1, 2, 3], f32.new_cache(16)).shape[0] == 3
    finally:
        gemma.close()
        f32.close()


def test_switching_block_ops_off_switches_the_stack_off(model):
    model.use_block_ops(False)
    try:
        assert model.fused_stack() is None
        model.use_fused_stack(True)  # the stack calls the fused ops: without them it stays off
        assert model.fused_stack() is None
    finally:
        model.use_block_ops(True)
    assert model.fused_stack() is not None
    model.use_fused_stack(False)
    try:
        assert model.fused_stack() is None and model.block_ops is not None
    finally:
        model.use_fused_stack(True)


def test_a_cache_it_does_not_know_runs_the_python_blocks(model):
    """Only the plain KVCache's layout is the stack's: a subclass (a hybrid or layered cache, or any
    other) goes through the Python blocks, with the same results."""

    class OtherCache(KVCache):
        pass

    c = model.config
    other = OtherCache(c.n_layer, c.n_head_kv, c.head_dim, 64)
    plain = model.new_cache(64)
    assert torch.equal(model.forward([3, 4, 5], other), model.forward([3, 4, 5], plain))


def test_captured_layers_are_the_residual_stream_the_python_blocks_see(model):
    """An EAGLE-3 head reads the residual stream at the input of chosen layers: the stack then runs one native call
    per stretch between them, and what it records (and everything else) is the Python blocks' bits, alone and batched."""
    L = model.config.n_layer
    layers = (1, L - 1, L)  # L: the last layer's output
    seen = {}

    def hook(i):
        return lambda module, args: seen.__setitem__(i, args[0].clone())

    handles = [block.register_forward_pre_hook(hook(i)) for i, block in enumerate(model.layers)]
    model.use_fused_stack(False)
    try:
        ref = model.forward(list(range(5, 30)), model.new_cache(64), logits_for="all", return_hidden=True)
    finally:
        for h in handles:
            h.remove()
    expected = torch.cat([seen[i] if i < L else ref.prenorm_hidden for i in layers], dim=-1)
    try:
        for python_blocks in (True, False):
            model.use_fused_stack(not python_blocks)
            model.capture_at(layers)
            out = model.forward(list(range(5, 30)), model.new_cache(64), logits_for="all", return_hidden=True)
            assert out.captured.shape == (25, 3 * model.config.n_embd)
            assert torch.equal(out.captured, expected) and torch.equal(out.logits, ref.logits)
            if not python_blocks:
                assert [first for first, _ in model._stretches()] == sorted({0, *(i for i in layers if i < L)})
            # batched: each sequence's rows get what they get alone
            calls = [_Call(list(range(5, 30)), model.new_cache(64)), _Call([3, 4, 5], model.new_cache(64))]
            batched = model.forward_batch(calls)
            assert torch.allclose(batched[0].captured, expected, atol=1e-5)
            alone = model.forward([3, 4, 5], model.new_cache(64), logits_for="all", return_hidden=True)
            assert torch.allclose(batched[1].captured, alone.captured, atol=1e-5)
    finally:
        model.capture_at(())
        model.use_fused_stack(True)
    plain = model.forward(list(range(5, 30)), model.new_cache(64), logits_for="all", return_hidden=True)
    assert plain.captured is None


class _Call:
    def __init__(self, tokens, cache):
        self.tokens, self.cache, self.logits_for, self.return_hidden = tokens, cache, "all", True


def test_a_batch_of_decoding_sequences_gets_the_bits_each_gets_alone(model):
    """Eight sequences at different lengths decoding one token each, and one verifying three drafts, in one
    batched forward (their attention in one parallel region over every sequence's cache): each one's logits and
    cache rows are the very bits of its own forward alone."""
    prompts = [list(range(5, 5 + 3 * i + 2)) for i in range(8)] + [list(range(9, 40))]
    feeds = [[7 + i] for i in range(8)] + [[11, 13, 15, 17]]
    alone_caches, batch_caches = [], []
    for prompt in prompts:
        for caches in (alone_caches, batch_caches):
            cache = model.new_cache(64)
            model.forward(prompt, cache, logits_for="last")
            caches.append(cache)
    alone = [model.forward(feed, cache, logits_for="all") for feed, cache in zip(feeds, alone_caches)]
    calls = [_Call(feed, cache) for feed, cache in zip(feeds, batch_caches)]
    for c in calls:
        c.return_hidden = False
    batched = model.forward_batch(calls)
    for a, b, ca, cb in zip(alone, batched, alone_caches, batch_caches):
        assert torch.equal(a, b)
        assert ca.length == cb.length and torch.equal(ca.k[:, :, :ca.length], cb.k[:, :, :cb.length])
