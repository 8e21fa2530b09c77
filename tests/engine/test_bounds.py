"""Issue 15's engine-side bounds: speculation options out of range are a distinct (400) error,
``draft_num_predict`` is capped, open-ended generation stops at 10 x num_ctx as Ollama's runner does,
and the adaptive depth controller's per-token work does not grow with the cap."""

from __future__ import annotations


import pytest

from engine.contract.options import (
    MAX_DRAFT_NUM_PREDICT,
    OptionRangeError,
    Options,
    ParamError,
    coerce_options,
)
from engine.speculative.depth import MAX_CONSIDERED_DEPTH, AdaptiveDepth


@pytest.mark.parametrize("options,message", [
    ({"relaxed_top_n": -1}, "invalid relaxed_top_n value [-1]: must be >= 0"),
    ({"draft_p_min": 1.5}, "invalid draft_p_min value [1.5]: must be between 0 and 1"),
    ({"drafter": "magic"}, 'invalid drafter value [magic]: must be one of "auto", "model", "mtp", "ngram", "suffix", or "none"'),
    ({"draft_num_predict": 65}, "invalid draft_num_predict value [65]: must be <= 64"),
    ({"n_max": 1000000}, "invalid draft_num_predict value [1000000]: must be <= 64"),
])
def test_range_errors_are_their_own_kind(options, message):
    with pytest.raises(OptionRangeError) as e:
        coerce_options(options)
    assert str(e.value) == message


def test_type_errors_are_not_range_errors():
    with pytest.raises(ParamError) as e:
        coerce_options({"top_k": "many"})
    assert not isinstance(e.value, OptionRangeError)


def test_draft_num_predict_cap_and_the_values_below_it():
    assert MAX_DRAFT_NUM_PREDICT == 64
    assert Options.from_map({"draft_num_predict": 64}).draft_num_predict == 64
    assert Options.from_map({"draft_num_predict": -3}).draft_num_predict == -3  # <= 0: no speculation
    with pytest.raises(OptionRangeError):
        Options(draft_num_predict=65)


def test_generation_limit_is_ollamas_rule():
    from engine.runtime import generation_limit

    assert generation_limit(-1, 4096) == 40960
    assert generation_limit(-7, 100) == 1000
    assert generation_limit(10**12, 100) == 1000
    assert generation_limit(1000, 100) == 1000
    assert generation_limit(8, 100) == 8
    assert generation_limit(0, 100) == 0
    assert generation_limit(-2, 100) == -2  # "fill the context": bounded by the context already


def _trained(ctl: AdaptiveDepth) -> AdaptiveDepth:
    for step in range(200):
        depth = ctl.choose(8)
        ctl.observe(depth, depth, depth, 1.0 + 0.1 * depth)
    return ctl


def test_adaptive_choice_for_caps_up_to_64_is_unchanged_and_huge_caps_cost_the_same():
    def cost(depth: int, n_drafted: int) -> float:
        return 1.0 + 0.01 * n_drafted

    a, b = _trained(AdaptiveDepth(cost_model=cost)), _trained(AdaptiveDepth(cost_model=cost))
    assert MAX_CONSIDERED_DEPTH == 64
    assert a.best(64) == b.best(10**6)
    calls = 0
    original = AdaptiveDepth.cost

    def counting(self, k):
        nonlocal calls
        calls += 1
        return original(self, k)

    AdaptiveDepth.cost = counting
    try:
        for _ in range(20):
            b.choose(10**6)
    finally:
        AdaptiveDepth.cost = original
    # the work per choice, counted rather than timed (a wall-clock bound passes or fails with the host)
    assert calls <= 20 * (MAX_CONSIDERED_DEPTH + 1)  # was 20 x 1,000,001
