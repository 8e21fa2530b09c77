"""engine.sampling.sampler: option parsing, pipeline order, penalties, determinism. Tiny vocabularies only."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.contract.options import Options
from engine.sampling.sampler import (
    SamplingOptions,
    apply_penalties,
    derive_seed,
    draw_uniforms,
    make_generator,
    process,
    sample_from_probs,
)


def opts(**kw) -> SamplingOptions:
    """Options with every filter off unless asked for, so each test isolates one stage."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0)
    base.update(kw)
    return SamplingOptions(**base)


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) if p > 0 else -math.inf for p in probs], dtype=torch.float32)


def support(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row > 0).reshape(-1).tolist())


# ----------------------------------------------------------------------------------------------
# A slow, obviously-correct float64 reference of the documented pipeline.
# ----------------------------------------------------------------------------------------------


def reference_row(logits: list[float], window: list[int], o: SamplingOptions) -> list[float]:
    x = [float(v) for v in logits]
    V = len(x)
    if o.repeat_last_n != 0:
        for t, c in Counter(window).items():
            if o.repeat_penalty != 1.0:
                x[t] = x[t] / o.repeat_penalty if x[t] > 0 else x[t] * o.repeat_penalty
            x[t] -= c * o.frequency_penalty + o.presence_penalty
    if o.temperature <= 0 or o.top_k == 1:
        best = max(range(V), key=lambda t: (x[t], -t))
        return [1.0 if t == best else 0.0 for t in range(V)]
    order = sorted(range(V), key=lambda t: (-x[t], t))
    if 0 < o.top_k < V:
        order = order[: o.top_k]
    m = max(x[t] for t in order)
    w = {t: math.exp((x[t] - m) / o.temperature) for t in order}
    z = sum(w.values())
    p = {t: w[t] / z for t in order}
    if o.typical_p < 1.0:
        ent = -sum(v * math.log(v) for v in p.values() if v > 0)
        typ = sorted(order, key=lambda t: abs(-math.log(p[t]) - ent) if p[t] > 0 else math.inf)
        kept, cum = [], 0.0
        for t in typ:
            if cum >= o.typical_p and kept:
                break
            kept.append(t)
            cum += p[t]
        p = {t: (p[t] if t in kept else 0.0) for t in order}
        z = sum(p.values())
        p = {t: v / z for t, v in p.items()}
    if o.top_p < 1.0:
        kept, cum = [], 0.0
        for t in sorted(order, key=lambda t: (-p[t], t)):
            if p[t] == 0:
                continue
            if cum >= o.top_p and kept:
                break
            kept.append(t)
            cum += p[t]
        p = {t: (p[t] if t in kept else 0.0) for t in order}
    if o.min_p > 0.0:
        pmax = max(p.values())
        p = {t: (v if v >= o.min_p * pmax else 0.0) for t, v in p.items()}
    z = sum(p.values())
    return [p.get(t, 0.0) / z for t in range(V)]


# ----------------------------------------------------------------------------------------------
# Options and generators
# ----------------------------------------------------------------------------------------------


def test_defaults_and_from_options() -> None:
    d = SamplingOptions()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.typical_p) == (0.8, 40, 0.9, 0.0, 1.0)
    assert (d.repeat_penalty, d.presence_penalty, d.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (d.repeat_last_n, d.seed) == (64, -1)

    o = SamplingOptions.from_options(
        Options.from_map({"temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "typical_p": 0.7,
                          "repeat_penalty": 1.3, "presence_penalty": 0.2, "frequency_penalty": 0.1,
                          "repeat_last_n": -1, "seed": 42, "num_ctx": 999, "stop": ["x"], "top_n": None}),
        num_ctx=8192,
    )
    assert o == SamplingOptions(0.0, 5, 0.5, 0.1, 0.7, 1.3, 0.2, 0.1, 8192, 42)
    assert o.greedy
    # -1 falls back to the options' own num_ctx (whose default is 4096); defaults are the sampler's.
    assert SamplingOptions.from_options(Options.from_map({"repeat_last_n": -1, "num_ctx": 300})).repeat_last_n == 300
    assert SamplingOptions.from_options(Options.from_map({"repeat_last_n": -1})).repeat_last_n == 4096
    assert SamplingOptions.from_options(Options.from_map({"temperature": None})) == SamplingOptions()
    assert SamplingOptions.from_options(Options()) == SamplingOptions()
    with pytest.raises(ValueError):  # ParamError, where the options are parsed
        SamplingOptions.from_options(Options.from_map({"temperature": "hot"}))


def test_generators_are_reproducible_and_independent() -> None:
    a = draw_uniforms(make_generator(123), 5)
    b = draw_uniforms(make_generator(123), 5)
    assert a == b and all(0.0 <= u < 1.0 for u in a)
    assert draw_uniforms(make_generator(124), 5) != a
    assert draw_uniforms(make_generator(-1), 5) != draw_uniforms(make_generator(-1), 5)
    assert draw_uniforms(make_generator(123, stream=1), 5) != a
    assert derive_seed(123, 0) == 123 and derive_seed(123, 1) != derive_seed(124, 1)
    # The contract the acceptance rules rely on: only the *count* of uniforms matters.
    g1, g2 = make_generator(9), make_generator(9)
    batched = draw_uniforms(g1, 7)
    one_by_one = [draw_uniforms(g2, 1)[0] for _ in range(3)] + draw_uniforms(g2, 4)
    assert batched == one_by_one


# ----------------------------------------------------------------------------------------------
# Pipeline order
# ----------------------------------------------------------------------------------------------


def test_top_p_applies_after_temperature() -> None:
    logits = logits_of([0.6, 0.3, 0.1])
    # Sharpening: at T=1 top-p 0.7 would keep {0, 1}; after T=0.5, p = (.78, .20, .02) keeps {0}.
    d = process(logits, [], [], opts(temperature=0.5, top_p=0.7))
    assert d.probs[0].tolist() == [1.0, 0.0, 0.0]
    # Flattening: at T=1 top-p 0.55 would keep {0}; after T=2, p = (.47, .33, .19) keeps {0, 1}.
    d = process(logits, [], [], opts(temperature=2.0, top_p=0.55))
    w = torch.tensor([0.6, 0.3]).sqrt()
    assert torch.allclose(d.probs[0], torch.cat([w / w.sum(), torch.zeros(1)]), atol=1e-6)


def test_min_p_is_relative_to_the_post_temperature_max() -> None:
    logits = logits_of([0.5, 0.3, 0.2])
    kept = {t: support(process(logits, [], [], opts(temperature=t, min_p=0.5)).probs[0]) for t in (0.5, 1.0, 2.0)}
    assert kept == {0.5: {0}, 1.0: {0, 1}, 2.0: {0, 1, 2}}


def test_top_k_keeps_lowest_ids_among_boundary_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 2.0, 2.0, 0.0])
    assert support(process(logits, [], [], opts(top_k=2)).probs[0]) == {1, 2}
    assert support(process(logits, [], [], opts(top_k=3)).probs[0]) == {1, 2, 3}
    # Same in a bigger vocabulary, with the ties far apart (kernel tie order must not matter).
    big = torch.zeros(1000)
    big[[900, 17, 512]] = 5.0
    big[3] = 9.0
    assert support(process(big, [], [], opts(top_k=3)).probs[0]) == {3, 17, 512}


def test_top_p_cut_through_ties_is_deterministic() -> None:
    logits = logits_of([0.2, 0.4, 0.2, 0.2])
    d = process(logits, [], [], opts(top_p=0.7))  # 0.4 + 0.2 (token 0, lowest id) + ...
    assert support(d.probs[0]) == {0, 1, 2}
    d = process(logits, [], [], opts(top_p=0.5))
    assert support(d.probs[0]) == {0, 1}


@pytest.mark.parametrize(
    "o",
    [
        SamplingOptions(),
        opts(temperature=0.7, top_k=8, top_p=0.8, min_p=0.05),
        opts(temperature=1.3, top_k=0, top_p=0.6),
        opts(temperature=0.9, top_k=12, typical_p=0.6, top_p=0.95),
        opts(temperature=1.0, top_k=0, min_p=0.2),
        opts(temperature=0.8, top_k=20, repeat_penalty=1.5, presence_penalty=0.3,
             frequency_penalty=0.2, repeat_last_n=5),
    ],
)
def test_pipeline_matches_reference(o: SamplingOptions) -> None:
    gen = torch.Generator().manual_seed(1234)
    V, n = 60, 4
    logits = torch.randn(n, V, generator=gen) * 2.5
    history = torch.randint(0, V, (9,), generator=gen).tolist()
    inflight = torch.randint(0, V, (n - 1,), generator=gen).tolist()
    d = process(logits, history, inflight, o)
    probs = d.probs
    for i in range(n):
        window = (history + inflight[:i])[-o.repeat_last_n:]
        ref = torch.tensor(reference_row(logits[i].tolist(), window, o), dtype=torch.float32)
        assert torch.allclose(probs[i], ref, atol=2e-6), (i, probs[i], ref)
        assert support(probs[i]) == support(ref)  # filtered tokens are exactly zero
        assert abs(float(probs[i].double().sum()) - 1.0) < 1e-5
        assert d.pool_size(i) == len(support(ref))


def test_probs_rows_sum_to_one_and_are_sparse_at_real_vocab_size() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 152_064, generator=gen) * 3
    d = process(logits, [1, 2, 3], [7, 8], SamplingOptions())
    assert d.cand_ids.shape == (3, 40)
    assert torch.allclose(d.probs.double().sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-5)
    assert int((d.probs > 0).sum()) == sum(d.pool_size(i) for i in range(3)) <= 120


# ----------------------------------------------------------------------------------------------
# Penalties
# ----------------------------------------------------------------------------------------------


def test_penalties_follow_history_and_inflight_rows() -> None:
    base = torch.tensor([2.0, -1.0, 0.5, 0.0, 3.0, -2.0])
    logits = base.repeat(3, 1)
    o = opts(repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=64)
    raw = apply_penalties(logits, [0, 1, 0], [4, 2], o)
    expect0 = [2 / 2 - 0.5 - 0.5, -1 * 2 - 0.25 - 0.5, 0.5, 0.0, 3.0, -2.0]
    expect1 = expect0[:4] + [3 / 2 - 0.25 - 0.5, -2.0]  # row 1 also sees draft 4
    expect2 = expect0[:2] + [0.5 / 2 - 0.25 - 0.5] + expect1[3:]  # row 2 sees drafts 4 and 2
    assert torch.allclose(raw, torch.tensor([expect0, expect1, expect2]))
    assert torch.equal(logits, base.repeat(3, 1))  # the caller's tensor is untouched
    assert torch.allclose(process(logits, [0, 1, 0], [4, 2], o).raw_logits, raw)


def test_penalty_window_slides_over_inflight_tokens() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0, 3.0, -2.0]).repeat(3, 1)
    o = opts(repeat_penalty=2.0, repeat_last_n=2)
    raw = apply_penalties(logits, [5, 1, 0], [4, 2], o)
    # windows: row0 [1, 0]; row1 [0, 4]; row2 [4, 2]
    assert raw[0].tolist() == [1.0, -2.0, 0.5, 0.0, 3.0, -2.0]
    assert raw[1].tolist() == [1.0, -1.0, 0.5, 0.0, 1.5, -2.0]
    assert raw[2].tolist() == [2.0, -1.0, 0.25, 0.0, 1.5, -2.0]
    assert torch.equal(apply_penalties(logits, [0, 1], [4, 2], opts(repeat_penalty=2.0, repeat_last_n=0)), logits)


def test_penalty_can_change_the_greedy_choice() -> None:
    logits = torch.tensor([5.0, 4.0, 1.0])
    assert process(logits, [], [], opts(temperature=0)).argmax().tolist() == [0]
    o = opts(temperature=0, repeat_penalty=1.5)
    assert process(logits, [0], [], o).argmax().tolist() == [1]


def test_process_checks_inflight_length() -> None:
    with pytest.raises(ValueError):
        process(torch.zeros(3, 5), [], [1], SamplingOptions())


# ----------------------------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------------------------


def test_temperature_zero_is_point_mass_on_lowest_id_argmax() -> None:
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [7.0, 7.0, 7.0, 7.0]])
    d = process(logits, [], [3], opts(temperature=0.0))
    assert d.probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert d.sample(make_generator(1)).tolist() == [1, 0]
    big = torch.zeros(1000)
    big[[700, 3]] = 1.0
    assert process(big, [], [], opts(temperature=0.0)).argmax().tolist() == [3]


def test_argmax_lowest_id_matches_its_definition_with_and_without_ties() -> None:
    """The fast path (unique maxima) and the exact one (ties, -inf rows, NaN-free) give the lowest id
    among a row's maxima, for plain rows and for candidate rows in an arbitrary id order."""
    from engine.sampling.sampler import argmax_lowest_id

    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        v = torch.randint(0, 6, (4, 40), generator=g).float()  # few distinct values: ties are common
        if trial % 2:
            v += torch.rand(4, 40, generator=g) * 1e-3  # unique maxima: the fast path
        v[3] = float("-inf") if trial % 5 == 0 else v[3]
        ids = torch.stack([torch.randperm(40, generator=g) for _ in range(4)])
        want = [min(i for i in range(40) if v[r, i] == v[r].max()) for r in range(4)]
        assert argmax_lowest_id(v).tolist() == want
        want_ids = [min(int(ids[r, i]) for i in range(40) if v[r, i] == v[r].max()) for r in range(4)]
        assert argmax_lowest_id(v, ids).tolist() == want_ids


def test_argmax_lowest_id_of_vocabulary_wide_rows_matches_its_definition() -> None:
    """Rows as wide as a vocabulary take the block-maxima path: the lowest index among a row's maxima,
    wherever they fall (within a block, across blocks, in the short tail block), for all -inf rows too;
    a row with NaN is left to the general path, as before."""
    from engine.sampling.sampler import _ARGMAX_BLOCK, argmax_lowest_id

    g = torch.Generator().manual_seed(1)
    B = _ARGMAX_BLOCK
    for trial, V in enumerate([2 * B, 2 * B + 1, 5 * B - 7, 151936] * 6):
        v = torch.randint(0, 40, (3, V), generator=g).float() if trial % 2 else torch.randn(3, V, generator=g)
        if trial % 3 == 0:
            v[0, [V - 1, B - 1, 3 * B // 2]] = 1e9  # maxima in the tail and across blocks
        if trial % 4 == 0:
            v[1] = float("-inf")
        if trial % 5 == 0:
            v[2, V - 1] = 1e9  # the only maximum, in the tail
        want = [min(i for i in torch.nonzero(v[r] == v[r].max()).reshape(-1).tolist()) for r in range(3)]
        assert argmax_lowest_id(v).tolist() == want, (trial, V)
    v = torch.randn(2, 151936, generator=g)
    v[0, 5] = float("nan")
    assert argmax_lowest_id(v)[1] == int(torch.argmax(v[1]))


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    logits = torch.tensor([0.1, 0.3, 0.2])
    d = process(logits, [], [], opts(temperature=1.5, top_k=1))
    assert d.probs[0].tolist() == [0.0, 1.0, 0.0]


# ----------------------------------------------------------------------------------------------
# Sampling and logprobs
# ----------------------------------------------------------------------------------------------


def test_sample_is_seeded_and_never_draws_filtered_tokens() -> None:
    gen = torch.Generator().manual_seed(3)
    n = 300
    logits = (torch.randn(32, generator=gen) * 2).repeat(n, 1)
    d = process(logits, [], [0] * (n - 1), opts(temperature=0.9, top_k=10, top_p=0.8))
    s1 = d.sample(make_generator(77))
    assert torch.equal(s1, d.sample(make_generator(77)))
    assert not torch.equal(s1, d.sample(make_generator(78)))
    allowed = support(d.probs[0])
    assert set(s1.tolist()) <= allowed and len(set(s1.tolist())) > 1
    # Frequencies roughly follow the distribution (seeded, 300 draws, loose bound).
    freq = torch.bincount(s1, minlength=32).double() / n
    assert float((freq - d.probs[0].double()).abs().max()) < 0.1


def test_sample_from_probs_dense_and_sparse_agree() -> None:
    p = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    ids = torch.tensor([1, 3, 4, 5])
    sparse = torch.tensor([0.25, 0.5, 0.25, 0.0])
    for j in range(200):
        u = (j + 0.5) / 200
        t = sample_from_probs(p, u)
        assert t == sample_from_probs(sparse, u, ids) and t in (1, 3, 4)
    assert [sample_from_probs(p, u) for u in (0.0, 0.2499, 0.2501, 0.7499, 0.7501, 0.999999)] == [1, 1, 3, 3, 4, 4]
    with pytest.raises(ValueError):
        sample_from_probs(torch.zeros(3), 0.5)


def test_top_logprobs_use_raw_penalised_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, -3.0, 0.0]])
    o = opts(temperature=0.5, top_k=2, repeat_penalty=2.0)
    d = process(logits, [0], [], o)
    raw = torch.tensor([1.0, 1.0, 1.0, -3.0, 0.0])  # token 0 penalised 2.0 -> 1.0
    lsm = torch.log_softmax(raw, -1)
    top = d.top_logprobs(0, 4)
    assert [t for t, _ in top] == [0, 1, 2, 4]  # ties by lowest id; filtered tokens still listed
    assert all(abs(v - float(lsm[t])) < 1e-6 for t, v in top)
    assert abs(d.logprob(0, 3) - float(lsm[3])) < 1e-6
    assert d.prob(0, 3) == 0.0
