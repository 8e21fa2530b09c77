"""The native read-bandwidth probe (engine/ops/kernels/probe.cpp) reads every byte it is given: its XOR fold equals
numpy's, whatever the thread count, and it refuses buffers it cannot stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.ops.kernels import load_block_ops, qdot_status

pytestmark = pytest.mark.skipif(not qdot_status().available, reason="the native kernels are not built here")


@pytest.mark.parametrize("threads", [1, 2])
def test_read_stream_reads_every_byte(threads):
    ops = load_block_ops()
    raw = np.random.default_rng(0).integers(0, 256, 64 * 20011, dtype=np.uint8)
    want = int(np.bitwise_xor.reduce(raw.view(np.uint64)).astype(np.int64))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert ops.read_stream(torch.from_numpy(raw)) == want
    finally:
        torch.set_num_threads(before)


def test_read_stream_refuses_what_it_cannot_stream():
    ops = load_block_ops()
    with pytest.raises(RuntimeError, match="multiple of 64"):
        ops.read_stream(torch.zeros(100, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="uint8"):
        ops.read_stream(torch.zeros(64, dtype=torch.float32))
