"""Fixtures shared by the native kernel tests."""

from __future__ import annotations

import pytest

from engine.ops.kernels import load_block_ops, qdot_status


@pytest.fixture(params=["native", "portable"])
def block_ops(request):
    """The kernel library's op namespace, once per build: -march=native and the portable x86-64-v2 one."""
    found = load_block_ops(request.param)
    if found is None:
        pytest.skip(f"build failed: {qdot_status(request.param).detail}")
    return found
