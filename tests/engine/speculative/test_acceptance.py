"""engine.speculative.acceptance: exact losslessness by enumeration, crafted ranks/ties, seeded Monte Carlo.

The exact checks integrate the *real* rule functions over their uniforms: each rule is piecewise
constant in every uniform, with breakpoints at the acceptance ratio and at the CDF steps of the
distributions it may sample from, so evaluating it at the midpoint of every piece and weighting by
the piece's length is an exact integral.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable, Optional

import pytest
import torch

from engine.speculative import acceptance
from engine.speculative.acceptance import (
    AcceptResult,
    match_accept,
    match_accept_from_uniforms,
    relaxed_accept,
    relaxed_accept_from_uniforms,
    residual_distribution,
    strict_accept,
    strict_accept_from_uniforms,
)
from engine.sampling.sampler import SamplingOptions, draw_uniforms, make_generator, process

Rule = Callable[[torch.Tensor, Optional[torch.Tensor], list, list], AcceptResult]


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def random_dist(gen: torch.Generator, V: int, zeros: int = 0) -> torch.Tensor:
    """A random distribution with ``zeros`` filtered (exactly zero) entries."""
    w = torch.rand(V, generator=gen) + 0.05
    if zeros:
        w[torch.randperm(V, generator=gen)[:zeros]] = 0.0
    return (w / w.sum()).float()


def one_hot(V: int, i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(V)]


# ----------------------------------------------------------------------------------------------
# Exact integration over drafts and uniforms
# ----------------------------------------------------------------------------------------------


def _pieces(points: set[float]) -> list[tuple[float, float]]:
    """(midpoint, length) of the intervals of [0, 1) cut at ``points``."""
    cuts = sorted({0.0, 1.0} | {x for x in points if 0.0 < x < 1.0})
    return [((a + b) / 2, b - a) for a, b in zip(cuts, cuts[1:]) if b - a > 1e-15]


def _cdf_points(dist: torch.Tensor) -> set[float]:
    c = torch.cumsum(dist.double(), 0)
    return set((c / c[-1]).tolist())


class _Unassigned(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


class _LazyUniforms:
    """The uniforms handed to a rule; reading one not chosen yet asks the integrator to branch.

    Coordinates a rule never reads (those after a rejection) integrate to 1 and are not enumerated.
    """

    def __init__(self, n: int, chosen: dict[int, float]) -> None:
        self.n, self.chosen = n, chosen

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        i = i + self.n if i < 0 else i
        if i not in self.chosen:
            raise _Unassigned(i)
        return self.chosen[i]


def _integrate(rule: Rule, p, q, ds, axes: list[list[tuple[float, float]]], weight: float, out) -> None:
    stack: list[tuple[dict[int, float], float]] = [({}, weight)]
    while stack:
        chosen, w = stack.pop()
        try:
            result = rule(p, q, ds, _LazyUniforms(len(axes), chosen))
        except _Unassigned as need:
            for mid, length in axes[need.index]:
                stack.append(({**chosen, need.index: mid}, w * length))
            continue
        out[tuple(result.tokens)] += w


def exact_outcomes(rule: Rule, p: torch.Tensor, q: Optional[torch.Tensor], drafts=None) -> dict[tuple, float]:
    """Exact probability of every committed-token tuple of one round.

    Drafts are enumerated with their q probabilities (or fixed, for a point-mass drafter). The
    per-position uniforms are cut at the strict ratio p/q (strict, relaxed) or at p_i's CDF steps
    (match draws x_i ~ p_i with them); the last uniform at the CDF steps of every distribution a
    rule may emit from (p_i, residual_i, p_{k+1}).
    """
    k, V = p.shape[0] - 1, p.shape[1]
    cdf_per_position = rule is match_accept_from_uniforms
    out: dict[tuple, float] = defaultdict(float)
    if drafts is not None:
        draft_sets = [(list(drafts), 1.0)]
    else:
        qn = q.double() / q.double().sum(-1, keepdim=True)  # float32 rows sum to 1 only to ~1e-7
        draft_sets = [
            (list(ds), float(torch.prod(torch.stack([qn[i, d] for i, d in enumerate(ds)]))) if k else 1.0)
            for ds in itertools.product(range(V), repeat=k)
        ]
    for ds, w in draft_sets:
        if w == 0.0:
            continue
        axes = []
        last: set[float] = set(_cdf_points(p[k]))
        for i, d in enumerate(ds):
            qd = float(q[i, d]) if q is not None else 1.0
            if cdf_per_position:
                pts = _cdf_points(p[i])
            else:
                pts = {float(p[i, d]) / qd} if qd > 0 else set()
                last |= _cdf_points(residual_distribution(p[i], q[i] if q is not None else None, d))
                if qd == 0:
                    last |= _cdf_points(p[i])
            axes.append(_pieces(pts))
        axes.append(_pieces(last))
        _integrate(rule, p, q, ds, axes, w, out)
    return dict(out)


def prefix_distribution(outcomes: dict[tuple, float], p: torch.Tensor, length: int) -> torch.Tensor:
    """Joint distribution of the first ``length`` emitted tokens. A round that committed fewer is
    continued by later rounds whose target dists are fixed per position (p_j for token j), whose
    tokens are then distributed as p_j (the first-token property, checked separately)."""
    V = p.shape[1]
    joint = torch.zeros((V,) * length, dtype=torch.float64)
    for toks, w in outcomes.items():
        toks = toks[:length]
        tail = torch.tensor(w, dtype=torch.float64)
        for j in range(len(toks), length):
            tail = tail.unsqueeze(-1) * p[j].double() if tail.dim() else tail * p[j].double()
        joint[toks] += tail
    return joint


def exact_first_token_distribution(rule: Rule, p, q, drafts=None) -> torch.Tensor:
    return prefix_distribution(exact_outcomes(rule, p, q, drafts), p, 1)


def chain(p: torch.Tensor, length: int) -> torch.Tensor:
    out = p[0].double()
    for j in range(1, length):
        out = out.unsqueeze(-1) * p[j].double()
    return out


def relaxed2(p, q, ds, us):
    return relaxed_accept_from_uniforms(p, q, ds, us, top_n=2)


LOSSLESS: dict[str, Rule] = {"strict": strict_accept_from_uniforms, "match": match_accept_from_uniforms}


@pytest.mark.parametrize(
    "rule_name,seed,V,p_zeros,q_zeros",
    [("strict", 0, 4, 0, 0), ("strict", 1, 5, 1, 0), ("strict", 2, 5, 2, 2),
     ("match", 0, 4, 0, 0), ("match", 3, 5, 1, 2)],
)
def test_lossless_by_exact_enumeration(rule_name: str, seed: int, V: int, p_zeros: int, q_zeros: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = 2
    p = torch.stack([random_dist(gen, V, p_zeros) for _ in range(k + 1)])
    q = torch.stack([random_dist(gen, V, q_zeros) for _ in range(k)])
    outcomes = exact_outcomes(LOSSLESS[rule_name], p, q)
    assert abs(sum(outcomes.values()) - 1.0) < 1e-9
    for length in (1, 2, 3):
        joint = prefix_distribution(outcomes, p, length)
        assert torch.allclose(joint, chain(p, length), atol=1e-6), (length, joint, chain(p, length))


@pytest.mark.parametrize("drafts", [[0, 0], [2, 1], [3, 3]])
def test_point_mass_drafter_is_lossless(drafts: list[int]) -> None:
    gen = torch.Generator().manual_seed(11)
    p = torch.stack([random_dist(gen, 5, 1) for _ in range(3)])
    outcomes = exact_outcomes(strict_accept_from_uniforms, p, None, drafts)
    for length in (1, 2, 3):
        assert torch.allclose(prefix_distribution(outcomes, p, length), chain(p, length), atol=1e-6)


def test_relaxed_is_lossy_and_the_exact_check_notices() -> None:
    # Sanity of the harness itself: the lossy rule must fail the same exactness check.
    # The drafter over-proposes token 0, which the target ranks first: strict accepts it with
    # probability 0.4 / 0.7, relaxed always, so P(first = 0) = 0.7 + (mass of residual) > 0.4.
    p = t([[0.4, 0.3, 0.2, 0.1], [0.25] * 4, [0.25] * 4])
    q = t([[0.7, 0.1, 0.1, 0.1], [0.25] * 4])
    first = exact_first_token_distribution(relaxed2, p, q)
    assert torch.allclose(first, torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(exact_first_token_distribution(strict_accept_from_uniforms, p, q), p[0].double(), atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Residuals and crafted cases
# ----------------------------------------------------------------------------------------------


def test_residual_distribution() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    assert torch.allclose(residual_distribution(p, q, 1), torch.tensor([0.75, 0.0, 0.25, 0.0], dtype=torch.float64))
    assert torch.allclose(residual_distribution(p, None, 0), torch.tensor([0.0, 0.6, 0.4, 0.0], dtype=torch.float64))
    assert torch.allclose(residual_distribution(p, p.clone(), 0), p.double())  # p == q -> p


def test_rejection_emits_from_the_residual() -> None:
    p = t([[0.5, 0.3, 0.2, 0.0], [0.25] * 4])
    q = t([[0.2, 0.5, 0.1, 0.2]])
    counts = torch.zeros(4, dtype=torch.float64)
    n = 400
    for j in range(n):  # deterministic quadrature over the emission uniform
        r = strict_accept_from_uniforms(p, q, [1], [0.99, (j + 0.5) / n])
        assert r.n_accepted == 0 and r.decisions[0].decision == "reject"
        counts[r.next_token] += 1
    assert torch.allclose(counts / n, torch.tensor([0.75, 0.0, 0.25, 0.0], dtype=torch.float64), atol=3e-3)


def test_zero_target_probability_is_always_rejected() -> None:
    p = t([[0.0, 0.6, 0.4], [1 / 3] * 3])
    q = t([[0.9, 0.05, 0.05]])
    r = strict_accept_from_uniforms(p, q, [0], [0.0, 0.5])
    assert r.n_accepted == 0 and r.next_token in (1, 2)
    assert r.decisions[0].draft_rank == -1 and r.decisions[0].pool_size == 2
    # relaxed never accepts a filtered token, however large N
    assert relaxed_accept_from_uniforms(p, q, [0], [0.0, 0.5], top_n=10**6).n_accepted == 0


def test_zero_draft_probability_rejects_and_resamples_from_p() -> None:
    p = t([[0.5, 0.3, 0.2], [1 / 3] * 3])
    q = t([[0.0, 0.6, 0.4]])  # the drafter claims token 0 was impossible: a drafter bug
    emitted = []
    for j in range(100):
        r = strict_accept_from_uniforms(p, q, [0], [0.0, (j + 0.5) / 100])
        assert r.n_accepted == 0 and r.decisions[0].draft_q == 0.0
        emitted.append(r.next_token)
    # drawn from p itself, not from the residual max(0, p - q) = (1, 0, 0)
    assert [emitted.count(x) for x in range(3)] == [50, 30, 20]


def test_temperature_zero_strict_is_exact_argmax_match() -> None:
    V = 5
    p = t([one_hot(V, 2), one_hot(V, 4), one_hot(V, 1)])
    q = t([[0.2] * 5, [0.2] * 5])
    for u in ([0.0, 0.0, 0.3], [0.999, 0.999, 0.7]):
        assert strict_accept_from_uniforms(p, q, [2, 4], u).tokens == [2, 4, 1]
        assert strict_accept_from_uniforms(p, q, [2, 3], u).tokens == [2, 4]
        assert strict_accept_from_uniforms(p, q, [0, 4], u).tokens == [2]
        assert strict_accept_from_uniforms(p, None, [2, 3], u).tokens == [2, 4]


def test_ranks_ties_and_pool_size_in_decisions() -> None:
    p = t([[0.4, 0.3, 0.3, 0.0, 0.0], [0.2, 0.3, 0.3, 0.2, 0.0], [0.2] * 5])
    q = t([[0.05, 0.05, 0.8, 0.05, 0.05], [0.1, 0.1, 0.1, 0.6, 0.1]])
    u = [0.999, 0.999, 0.5]  # strict rejects both drafts: 0.999 * 0.8 > 0.3, 0.999 * 0.6 > 0.2
    strict = strict_accept_from_uniforms(p, q, [2, 3], u)
    assert strict.n_accepted == 0 and strict.decisions[0].draft_rank == 1

    r = relaxed_accept_from_uniforms(p, q, [2, 3], u, top_n=2)
    d0, d1 = r.decisions
    assert (d0.position, d0.draft_token, d0.target_token, d0.draft_rank, d0.pool_size) == (0, 2, 0, 1, 3)
    assert d0.decision == "accept-rank" and d0.emitted_token == 2
    assert abs(d0.draft_prob - 0.3) < 1e-6 and abs(d0.draft_q - 0.8) < 1e-6
    # position 1: token 3 has rank 2 (two tokens strictly above, ties share a rank) -> N = 2 rejects
    assert (d1.draft_rank, d1.pool_size, d1.target_token, d1.decision) == (2, 4, 1, "reject")
    assert r.n_accepted == 1 and r.tokens == [2, r.next_token] and d1.emitted_token == r.next_token
    # N = 3 accepts it; equal probabilities share rank 0, so N = 1 accepts any of a uniform row
    assert relaxed_accept_from_uniforms(p, q, [2, 3], u, top_n=3).n_accepted == 2
    uniform, qu = t([[0.25] * 4, [0.25] * 4]), t([[0.1, 0.1, 0.1, 0.7]])
    r1 = relaxed_accept_from_uniforms(uniform, qu, [3], [0.999, 0.5], top_n=1)
    assert (r1.decisions[0].draft_rank, r1.decisions[0].decision) == (0, "accept-rank")
    # a draft the strict test accepts is labelled so even when it also ranks high
    assert relaxed_accept_from_uniforms(p, q, [0, 1], [0.0, 0.0, 0.5], top_n=5).decisions[0].decision == "accept-strict"


def test_pool_is_shrunk_by_min_p_as_in_the_seed_guide() -> None:
    # The seed's gotcha: min_p prunes the pool before the rank check, capping the effective N.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]] * 2))
    tight = process(logits, [], [3], SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25))
    loose = process(logits, [], [3], SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    q = t([[0.0, 0.0, 0.0, 1.0, 0.0]])
    r_tight = relaxed_accept_from_uniforms(tight.probs, q, [3], [0.5, 0.5], top_n=20)
    r_loose = relaxed_accept_from_uniforms(loose.probs, q, [3], [0.5, 0.5], top_n=20)
    assert (r_tight.decisions[0].pool_size, r_tight.decisions[0].decision) == (2, "reject")
    assert (r_loose.decisions[0].pool_size, r_loose.decisions[0].decision) == (5, "accept-rank")


# ----------------------------------------------------------------------------------------------
# Relaxed degenerate settings and the generator contract
# ----------------------------------------------------------------------------------------------


def _random_round(gen: torch.Generator, V: int, k: int, greedy: bool = False):
    if greedy:
        p = torch.stack([torch.tensor(one_hot(V, int(torch.randint(V, (1,), generator=gen)))) for _ in range(k + 1)])
    else:
        p = torch.stack([random_dist(gen, V, 1) for _ in range(k + 1)])
    q = torch.stack([random_dist(gen, V) for _ in range(k)]) if k else torch.empty(0, V)
    drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
    return p.float(), q, drafts


def test_relaxed_top_n_zero_is_strict_bit_for_bit() -> None:
    data = torch.Generator().manual_seed(21)
    g_strict, g_relaxed = make_generator(5), make_generator(5)
    for _ in range(60):
        p, q, drafts = _random_round(data, 6, 3)
        assert strict_accept(p, q, drafts, g_strict) == relaxed_accept(p, q, drafts, g_relaxed, top_n=0)
    assert torch.equal(g_strict.get_state(), g_relaxed.get_state())


def test_relaxed_top_1_at_temperature_zero_is_strict() -> None:
    data = torch.Generator().manual_seed(22)
    g_strict, g_relaxed = make_generator(6), make_generator(6)
    n_acc = 0
    for _ in range(60):
        p, q, drafts = _random_round(data, 4, 3, greedy=True)
        a = strict_accept(p, q, drafts, g_strict)
        assert a == relaxed_accept(p, q, drafts, g_relaxed, top_n=1)
        n_acc += a.n_accepted
    assert n_acc > 0


@pytest.mark.parametrize("k", [0, 1, 3])
def test_generator_consumption_is_k_plus_one_uniforms(k: int) -> None:
    data = torch.Generator().manual_seed(23)
    rules = {
        "strict": lambda p, q, d, g: strict_accept(p, q, d, g),
        "match": lambda p, q, d, g: match_accept(p, q, d, g),
        "relaxed": lambda p, q, d, g: relaxed_accept(p, q, d, g, top_n=2),
    }
    for name, rule in rules.items():
        seen = set()
        for r in range(15):
            p, q, drafts = _random_round(data, 4, k)
            g, ref = make_generator(r), make_generator(r)
            res = rule(p, q, drafts, g)
            draw_uniforms(ref, k + 1)
            assert torch.equal(g.get_state(), ref.get_state()), (name, res)
            seen.add(res.n_accepted)
        assert k == 0 or len(seen) > 1  # the contract held across different outcomes


def test_depth_zero_round_equals_plain_decoding() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(4)) * 2
    d = process(logits, [], [], SamplingOptions(temperature=1.0, top_k=20, top_p=0.95))
    g_plain, g_spec = make_generator(99), make_generator(99)
    plain = [int(d.sample(g_plain)[0]) for _ in range(60)]
    spec = [strict_accept(d.probs, None, [], g_spec).next_token for _ in range(60)]
    assert plain == spec and len(set(plain)) > 3


# ----------------------------------------------------------------------------------------------
# Seeded Monte Carlo: the real generator path, and a check that has power
# ----------------------------------------------------------------------------------------------

CHI2_CRIT_DF3 = 21.11  # chi-square, 3 degrees of freedom, p = 1e-4


def _first_token_chi2(rounds: int, seed: int) -> float:
    p = t([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25] * 4])
    q = t([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    g_target, g_draft = make_generator(seed), make_generator(seed, stream=1)
    drafts = torch.stack([torch.multinomial(q[i], rounds, replacement=True, generator=g_draft) for i in range(2)], 1)
    counts = torch.zeros(4, dtype=torch.float64)
    for r in range(rounds):
        counts[strict_accept(p, q, drafts[r], g_target).tokens[0]] += 1
    expected = p[0].double() * rounds
    return float(((counts - expected) ** 2 / expected).sum())


def test_monte_carlo_first_token_matches_target() -> None:
    assert _first_token_chi2(1000, seed=2024) < CHI2_CRIT_DF3


def test_monte_carlo_check_rejects_a_wrong_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    # Emitting from p instead of max(0, p - q) after a rejection is the classic bug.
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q, d: p.double())
    # expected statistic ~ 1000 * sum((wrong - p)^2 / p) ~ 100
    assert _first_token_chi2(1000, seed=2024) > 3 * CHI2_CRIT_DF3


# ----------------------------------------------------------------------------------------------
# match vs strict acceptance rates
# ----------------------------------------------------------------------------------------------


def test_acceptance_rates_match_vs_strict() -> None:
    p = t([[0.5, 0.3, 0.2, 0.0], [0.25] * 4])
    q = t([[0.2, 0.2, 0.3, 0.3]])
    sum_pq = float((p[0] * q[0]).sum())  # 0.22
    sum_min = float(torch.minimum(p[0], q[0]).sum())  # 0.60

    def exact_rate(rule: Rule) -> float:
        return sum(w for toks, w in exact_outcomes(rule, p, q).items() if len(toks) == 2)

    assert abs(exact_rate(match_accept_from_uniforms) - sum_pq) < 1e-6
    assert abs(exact_rate(strict_accept_from_uniforms) - sum_min) < 1e-6

    n = 1000
    g_draft = make_generator(8, stream=1)
    drafts = torch.multinomial(q[0], n, replacement=True, generator=g_draft).tolist()
    g_s, g_m = make_generator(8), make_generator(8)
    strict_rate = sum(strict_accept(p, q, [d], g_s).n_accepted for d in drafts) / n
    match_rate = sum(match_accept(p, q, [d], g_m).n_accepted for d in drafts) / n
    assert abs(strict_rate - sum_min) < 0.06 and abs(match_rate - sum_pq) < 0.05  # ~4 sigma


def test_match_decision_reports_the_target_sample() -> None:
    p = t([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    r = match_accept_from_uniforms(p, None, [2], [0.3, 0.3])
    assert r.tokens == [1] and r.decisions[0].target_token == 1 and r.decisions[0].decision == "reject"
    r = match_accept_from_uniforms(p, None, [1], [0.3, 0.3])
    assert r.tokens == [1, 0] and r.decisions[0].decision == "accept-match"


def test_shape_checks() -> None:
    with pytest.raises(ValueError):
        strict_accept_from_uniforms(torch.ones(2, 3) / 3, None, [0, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        strict_accept_from_uniforms(torch.ones(2, 3) / 3, None, [0], [0.1])


@pytest.mark.parametrize("opts", [SamplingOptions(temperature=0), SamplingOptions(temperature=0.7),
                                  SamplingOptions(temperature=0.8, top_k=0, top_p=0.9, min_p=0.02)],
                         ids=["greedy", "top_k", "top_p_min_p"])
@pytest.mark.parametrize("with_q", [False, True])
def test_rules_read_a_distribution_as_they_read_its_dense_rows(opts: SamplingOptions, with_q: bool) -> None:
    """The decode loop hands the rules the sampler's Distribution (its candidates only); every rule then
    decides, emits and reports exactly what it does from the dense [k + 1, vocab] rows."""
    gen = torch.Generator().manual_seed(7)
    V, k = 300, 3
    for trial in range(20):
        logits = torch.randn(k + 1, V, generator=gen) * 2
        drafts = [int(torch.randint(0, V, (1,), generator=gen)) for _ in range(k)]
        if trial % 2:  # drafts the target likes, so that rounds reach deep positions and the bonus
            drafts = [int(i) for i in logits[:k].argmax(-1)]
        q = torch.stack([random_dist(gen, V, zeros=V // 3) for _ in range(k)]) if with_q else None
        if q is not None:
            q[torch.arange(k), torch.tensor(drafts)] += 0.05  # drawn from q: q(d) > 0
            q = q / q.sum(-1, keepdim=True)
        dist = process(logits, list(range(10)), drafts, opts)
        u = draw_uniforms(gen, k + 1)
        for rule in (strict_accept_from_uniforms, match_accept_from_uniforms,
                     lambda p, q, d, u: relaxed_accept_from_uniforms(p, q, d, u, top_n=5)):
            assert rule(dist, q, drafts, u) == rule(dist.probs, q, drafts, u)


@pytest.mark.parametrize("q_kind", ["none", "positive", "zero at a draft"])
def test_greedy_rounds_decide_as_the_dense_rows_do(q_kind: str) -> None:
    """At temperature 0 every target row is a point mass and the rules decide without reducing the
    rows to their supports; what they keep, emit and report is still what the dense rows give,
    including a drafter's q(d) = 0, which rejects even the target's own token under the strict rule."""
    gen = torch.Generator().manual_seed(31)
    V, k = 50, 4
    for trial in range(30):
        logits = torch.randn(k + 1, V, generator=gen)
        best = [int(i) for i in logits[:k].argmax(-1)]
        drafts = best[:trial % (k + 1)] + [int(torch.randint(0, V, (1,), generator=gen))
                                           for _ in range(k - trial % (k + 1))]
        q = None
        if q_kind != "none":
            q = torch.stack([random_dist(gen, V) for _ in range(k)])
            if q_kind == "zero at a draft":
                q[trial % k, drafts[trial % k]] = 0.0
        dist = process(logits, [], drafts, SamplingOptions(temperature=0))
        u = draw_uniforms(gen, k + 1)
        for rule in (strict_accept_from_uniforms, match_accept_from_uniforms,
                     lambda p, q, d, u: relaxed_accept_from_uniforms(p, q, d, u, top_n=3)):
            assert rule(dist, q, drafts, u) == rule(dist.probs, q, drafts, u)
