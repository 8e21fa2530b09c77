"""Weight formats this CPU may not run: test parameters for them skip with the reason the engine gives.

oneDNN's packed bf16 linear (``bf16-packed``) needs AVX512BW/VL/DQ or AVX-NE-CONVERT; on an AVX2-only
host (AMD Zen 2/3) the engine refuses the format at load (``engine.ops.linear.format_problem``), and
the tests that compare it with f32 have nothing to compare.
"""

from __future__ import annotations

import pytest

from engine.ops.linear import format_problem


def fmt_param(fmt: str, *rest):
    """``pytest.param(fmt, *rest)``, skipped where this CPU cannot run ``fmt``."""
    problem = format_problem(fmt) if fmt == "bf16-packed" else None
    return pytest.param(fmt, *rest, marks=pytest.mark.skipif(problem is not None, reason=problem or ""))
