"""Perturbs every ``time.perf_counter`` reading of a Python process (loaded through PYTHONPATH by
scripts/test_timing_jitter.sh, in the test runner and every engine process it starts): each reading adds a
random exponential offset with a mean of ``TANDEM_JITTER`` seconds, so every measured duration (a step, a
drafting, a catch-up) is noise and whatever a controller chooses from them is random. A test that fails under it
asserts a timing-chosen quantity without fixing or injecting its inputs (issue 51). Not for production: nothing
in the package imports it."""

import os
import random
import time

if os.environ.get("TANDEM_JITTER"):
    _rng = random.Random()
    _mean = float(os.environ["TANDEM_JITTER"])
    _real = time.perf_counter
    _offset = [0.0]  # grows with every reading, so the clock stays monotonic

    def perf_counter() -> float:
        _offset[0] += _rng.expovariate(1.0 / _mean)
        return _real() + _offset[0]

    def perf_counter_ns() -> int:
        return int(perf_counter() * 1e9)

    time.perf_counter, time.perf_counter_ns = perf_counter, perf_counter_ns
