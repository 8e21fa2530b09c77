"""engine.models.moe on its own (any expert modules, any router settings) against a dense reference that runs
every expert on every token and weights them by the softmax's renormalised top-k: the block that qwen3moe uses
and gemma4's MoE is meant to reuse."""

from __future__ import annotations

import pytest
import torch

from engine.models.moe import Router, SparseMoE
from engine.ops.linear import DenseLinear

D, E = 16, 6


def _block(k: int, normalize: bool, scale: float, seed: int = 0) -> SparseMoE:
    g = torch.Generator().manual_seed(seed)
    router = Router(DenseLinear(torch.randn(E, D, generator=g), None), k, normalize=normalize, scale=scale)
    experts = [torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.SiLU(), torch.nn.Linear(8, D)) for _ in range(E)]
    return SparseMoE(router, experts)


def _reference(moe: SparseMoE, x: torch.Tensor, k: int, normalize: bool, scale: float) -> torch.Tensor:
    probs = torch.softmax(x @ moe.router.weight.weight.T, dim=-1)
    top, idx = probs.topk(k, dim=-1)
    if normalize:
        top = top / top.sum(-1, keepdim=True)
    gate = torch.zeros_like(probs).scatter(-1, idx, top * scale)  # [n, E], zero off the top k
    outs = torch.stack([ex(x) for ex in moe.experts], dim=1)  # [n, E, D]
    return (gate[..., None] * outs).sum(1)


@pytest.mark.parametrize("k,normalize,scale", [(1, True, 1.0), (2, True, 1.0), (3, False, 1.0), (2, True, 2.5),
                                               (E, False, 1.0)])
@pytest.mark.parametrize("n", [1, 5])
def test_sparse_moe_equals_dense_reference(k, normalize, scale, n):
    torch.manual_seed(1)
    moe = _block(k, normalize, scale)
    x = torch.randn(n, D)
    with torch.no_grad():
        got = moe(x)
        want = _reference(moe, x, k, normalize, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    routing = moe.router(x)
    assert routing.experts.shape == routing.weights.shape == (n, k)
    if normalize:
        torch.testing.assert_close(routing.weights.sum(-1), torch.full((n,), scale))


def test_mix_takes_any_routing():
    """A caller with its own router (e.g. a scaled or normed input) hands mix() the routing directly."""
    from engine.models.moe import Routing

    moe = _block(2, True, 1.0)
    x = torch.randn(3, D)
    routing = Routing(torch.tensor([[0, 5], [5, 0], [2, 2]]), torch.tensor([[0.5, 0.25], [1.0, 0.0], [0.5, 0.5]]))
    with torch.no_grad():
        got = moe.mix(x, routing)
        want = torch.stack([0.5 * moe.experts[0](x[0]) + 0.25 * moe.experts[5](x[0]), moe.experts[5](x[1]),
                            moe.experts[2](x[2])])
    torch.testing.assert_close(got, want)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="top_k"):
        Router(DenseLinear(torch.zeros(E, D), None), E + 1)
    with pytest.raises(ValueError, match="experts"):
        SparseMoE(Router(DenseLinear(torch.zeros(E, D), None), 2), [torch.nn.Identity()] * (E - 1))
