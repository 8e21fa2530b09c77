"""The native row reductions sampling uses (engine/ops/kernels/logits.cpp) give what the PyTorch
formulas give, in the native and portable builds: the lowest index of a row's maximum, and the top
softmax probability, for rows with ties, -inf (a pruned head's), NaN and strided views."""

from __future__ import annotations

import math

import pytest
import torch

from engine.ops.kernels import qdot_status
from engine.sampling.sampler import _wide_argmax, argmax_lowest_id
from engine.speculative.drafter import confidence

pytestmark = pytest.mark.skipif(not qdot_status().available,
                                reason=f"native kernels not available here: {qdot_status().detail}")


def _lowest_argmax(x: torch.Tensor) -> list[int]:
    return [int(torch.nonzero(row == row.max())[0]) for row in x]


@pytest.mark.parametrize("V", [1, 7, 33, 4099, 151936])
def test_argmax_is_the_lowest_index_of_the_maximum(block_ops, V):
    g = torch.Generator().manual_seed(V)
    x = torch.randn(4, V, generator=g)
    x[1] = torch.randint(0, 3, (V,), generator=g).float()  # many ties at the maximum
    x[2] = float("-inf")  # nothing but -inf: index 0, as the lowest of all ties
    x[3, V - 1] = 1e9  # the maximum in the tail (past the last whole vector)
    assert block_ops.logits_argmax(x).tolist() == _lowest_argmax(x)


def test_argmax_flags_rows_holding_nan_and_reads_strided_rows(block_ops):
    wide = torch.randn(3, 2 * 5000)
    x = wide[:, ::2].contiguous()[:, :4999]
    view = wide[:, :4999]  # rows 10000 floats apart
    x[1, 17] = float("nan")
    view[2, 4000] = float("nan")
    assert block_ops.logits_argmax(x).tolist()[1] == -1
    assert block_ops.logits_argmax(view).tolist() == [_lowest_argmax(view[:1])[0], _lowest_argmax(view[1:2])[0], -1]


def test_top_probability_is_softmax_max(block_ops):
    g = torch.Generator().manual_seed(3)
    V = 151936
    x = torch.randn(3, V, generator=g) * 4
    x[1] = float("-inf")
    x[1, torch.randperm(V, generator=g)[:32768]] = torch.randn(32768, generator=g) * 3  # a pruned head's row
    x[2, 5] = 40.0  # one token near certain
    # against float64: torch's own float32 softmax is ~1e-5 off over a 152k vocabulary
    torch.testing.assert_close(block_ops.logits_top_probability(x).double(), torch.softmax(x.double(), -1).amax(-1),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("poison", ["nan", "+inf", "all -inf"])
def test_top_probability_is_nan_where_softmax_is(block_ops, poison):
    x = torch.randn(2, 1000)
    if poison == "all -inf":
        x[1] = float("-inf")
    else:
        x[1, 300] = float(poison)
    got = block_ops.logits_top_probability(x)
    assert not math.isnan(got[0]) and math.isnan(got[1])
    assert math.isnan(torch.softmax(x, -1).amax(-1)[1])


def test_the_sampler_and_the_drafter_use_them_with_the_torch_paths_results():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(5, 151936, generator=g)
    x[:, 100] = x[:, 90000] = 50.0  # a tie: the lowest id wins
    assert argmax_lowest_id(x).tolist() == [100] * 5 == _wide_argmax(x).tolist()
    x[3, 7] = float("nan")  # a row with NaN goes the general path (given ids, it is taken for every row)
    general = argmax_lowest_id(x, torch.arange(x.shape[1]).expand_as(x))
    assert argmax_lowest_id(x).tolist() == general.tolist() and general.tolist()[0] == 100
    row = torch.randn(1, 151936, generator=g) * 3
    assert confidence(row) == pytest.approx(float(torch.softmax(row.double(), -1).amax()), rel=1e-6)
