"""The native row dequantizer (engine/ops/kernels/gguf_rows.cpp) gives the torch dequantizers' bits,
which are gguf-py's, for every type it takes, on random blocks (any scale, code and bit pattern)."""

from __future__ import annotations

import pytest
import torch

from engine.contract.gguf import GGML_TYPES
from engine.ops import dequant as dq
from engine.ops.kernels import qdot_status

pytestmark = pytest.mark.skipif(not qdot_status().available,
                                reason=f"native kernels not available here: {qdot_status().detail}")

TYPES = [dq.F32, dq.F16, dq.BF16, dq.Q4_0, dq.Q4_1, dq.Q5_0, dq.Q5_1, dq.Q8_0, dq.Q4_K, dq.Q5_K, dq.Q6_K]


def _random_rows(ggml_type: int, n_rows: int, k: int, seed: int) -> torch.Tensor:
    """Random bytes for n_rows rows of k values; f16 scale fields kept finite and moderate."""
    _, block, block_bytes = GGML_TYPES[ggml_type]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n_rows * (k // block), block_bytes), generator=g, dtype=torch.uint8)
    scale_fields = {dq.Q4_0: [0], dq.Q4_1: [0, 2], dq.Q5_0: [0], dq.Q5_1: [0, 2], dq.Q8_0: [0],
                    dq.Q4_K: [0, 2], dq.Q5_K: [0, 2], dq.Q6_K: [208]}
    for at in scale_fields.get(ggml_type, []):
        vals = (torch.rand(raw.shape[0], generator=g) * 0.02 - 0.01).to(torch.float16)
        raw[:, at:at + 2] = vals.view(torch.uint8).view(-1, 2)
    return raw.reshape(n_rows, -1)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: GGML_TYPES[t][0])
def test_rows_match_the_torch_dequantizer_bit_for_bit(block_ops, ggml_type):
    k = 512
    raw = _random_rows(ggml_type, 40, k, seed=ggml_type)
    ids = torch.tensor([3, 0, 39, 3, 17])
    got = block_ops.dequantize_gguf_rows(raw, ggml_type, k, ids)
    want = dq.dequantize(raw.index_select(0, ids), ggml_type, (len(ids), k))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_dequantize_rows_goes_native_and_keeps_its_checks():
    raw = _random_rows(dq.Q4_K, 8, 256, seed=1)
    assert dq.Q4_K in dq._native_row_types()
    rows = dq.dequantize_rows(raw, dq.Q4_K, (8, 256), torch.tensor([7, 1]), torch.bfloat16)
    assert rows.dtype == torch.bfloat16 and rows.shape == (2, 256)
    with pytest.raises(IndexError, match="out of range"):
        dq.dequantize_rows(raw, dq.Q4_K, (8, 256), torch.tensor([8]))


def test_a_bad_call_is_refused(block_ops):
    raw = _random_rows(dq.Q8_0, 4, 64, seed=2)
    with pytest.raises(RuntimeError, match="out of range"):
        block_ops.dequantize_gguf_rows(raw, dq.Q8_0, 64, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="unsupported"):
        block_ops.dequantize_gguf_rows(raw, dq.Q2_K, 64, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="whole blocks"):
        block_ops.dequantize_gguf_rows(raw, dq.Q8_0, 48, torch.tensor([0]))
