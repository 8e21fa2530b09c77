"""How many tokens to draft per round: a fixed cap, or the depth that maximises tokens per second.

A controller answers ``choose(cap) -> k`` before every decode step (``k = 0`` is a plain step) and
learns from ``observe(k, n_drafted, n_accepted, seconds)`` after it. The decode loop clamps ``k`` for
reasons a controller cannot know (tokens left in ``num_predict``, room in the context) and reports
the depth it actually used.

``AdaptiveDepth`` (docs/speculation.md, "Choosing the depth"; the seed's engine-level controller):

* ``a_j``, the conditional acceptance at draft position ``j`` (given positions ``< j`` were accepted),
  is a discounted Beta estimate: ``a_j = (m_j * w + S_j) / (w + N_j)`` where ``S_j`` and ``N_j`` are
  exponentially decayed counts of acceptances and trials at ``j``. The prior mean ``m_j`` is the
  estimate one position shallower (``m_0 = prior``): deep positions are observed only when the
  controller dares to draft that deep, and until then they are best guessed from their neighbour,
  not from a fixed 0.5 whose product over 8 positions would keep a perfect drafter shallow.
  A position the drafter did not fill (n-gram miss, ``draft_p_min`` stop) counts as a rejection:
  it yields nothing either way.
* ``cost(k)`` is a moving average of the measured wall time of a whole step at depth ``k``
  (drafting, the verification forward, acceptance, bookkeeping); ``cost(0)`` comes from plain steps.
  A depth never measured gets an optimistic estimate interpolated (or extrapolated with a
  non-negative slope) from the measured ones, so a promising depth is tried once and then known.
* ``choose`` returns ``argmax_k E[committed(k)] / cost(k)``, ``E[committed(k)] = 1 + sum_{i<=k}
  prod_{j<=i} a_j``. Every ``explore_every``-th step it probes a neighbour of the best depth instead
  (the one measured least recently), which keeps the costs fresh and lets acceptance at the next
  position be observed. Exploration is a deterministic function of the step count, so runs with a
  fixed cost model are reproducible. A useless drafter therefore costs one probe of depth 1 every
  ``explore_every`` steps.

The state lives on the Engine, one controller per loaded model and drafter kind, across requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class DepthController(Protocol):
    def choose(self, cap: int) -> int: ...

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float) -> None: ...


@dataclass
class FixedDepth:
    """Always the cap. ``draft_p_min`` early stop happens in the drafter; a proposal shorter than
    ``n_min`` is not verified (the decode loop takes a plain step instead)."""

    n_min: int = 0

    def choose(self, cap: int) -> int:
        return max(0, cap)

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float) -> None:
        pass


CostModel = Callable[[int, int], float]  # (depth, n_drafted) -> seconds; replaces measurements in tests


@dataclass
class AdaptiveDepth:
    prior: float = 0.5  # prior acceptance at every position
    prior_weight: float = 2.0  # pseudo-trials behind the prior
    decay: float = 0.95  # per observation: an effective memory of ~20 rounds per position
    cost_decay: float = 0.8  # per measurement of the same depth
    explore_every: int = 16
    cost_model: CostModel | None = None
    n_min: int = 0  # unused by this schedule; present so both controllers read the same

    _succ: list[float] = field(default_factory=list)
    _trials: list[float] = field(default_factory=list)
    _cost: dict[int, float] = field(default_factory=dict)
    _measured_at: dict[int, int] = field(default_factory=dict)
    step: int = 0

    # -- learning ------------------------------------------------------------------------------
    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float) -> None:
        if self.cost_model is not None:
            seconds = self.cost_model(depth, n_drafted)
        old = self._cost.get(depth)
        self._cost[depth] = seconds if old is None else self.cost_decay * old + (1 - self.cost_decay) * seconds
        self._measured_at[depth] = self.step
        # Positions 0..a are observed (a accepted, then the first failure); deeper ones are not.
        for j in range(min(n_accepted + 1, depth)):
            self._grow(j + 1)
            self._succ[j] = self.decay * self._succ[j] + (1.0 if j < n_accepted else 0.0)
            self._trials[j] = self.decay * self._trials[j] + 1.0

    def _grow(self, n: int) -> None:
        while len(self._succ) < n:
            self._succ.append(0.0)
            self._trials.append(0.0)

    # -- model ---------------------------------------------------------------------------------
    def acceptances(self, k: int) -> list[float]:
        """Estimated P(position j accepted | positions < j accepted) for j < k (0-based)."""
        out, mean = [], self.prior
        for j in range(k):
            s = self._succ[j] if j < len(self._succ) else 0.0
            n = self._trials[j] if j < len(self._trials) else 0.0
            mean = (mean * self.prior_weight + s) / (self.prior_weight + n)
            out.append(mean)
        return out

    def acceptance(self, j: int) -> float:
        return self.acceptances(j + 1)[j]

    def expected_committed(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.acceptances(k):
            run *= a
            total += run
        return total

    def cost(self, k: int) -> float | None:
        """Measured cost of depth k, or an optimistic estimate from the measured depths."""
        if k in self._cost:
            return self._cost[k]
        if not self._cost:
            return None
        ks = sorted(self._cost)
        lo = [d for d in ks if d < k]
        hi = [d for d in ks if d > k]
        if lo and hi:
            a, b = lo[-1], hi[0]
            return self._cost[a] + (self._cost[b] - self._cost[a]) * (k - a) / (b - a)
        if lo:
            if len(lo) >= 2:
                a, b = lo[-2], lo[-1]
                slope = max(0.0, (self._cost[b] - self._cost[a]) / (b - a))
                return self._cost[b] + slope * (k - b)
            return self._cost[lo[-1]]
        return self._cost[hi[0]]

    def throughput(self, k: int) -> float:
        c = self.cost(k)
        return self.expected_committed(k) / c if c and c > 0 else 0.0

    def best(self, cap: int) -> int:
        """The depth in [0, cap] with the highest expected tokens per second (ties: shallower)."""
        cap = max(0, cap)
        acc = self.acceptances(cap)
        best_k, best_v = 0, -1.0
        expected, run = 1.0, 1.0
        for k in range(cap + 1):
            if k > 0:
                run *= acc[k - 1]
                expected += run
            c = self.cost(k)
            v = expected / c if c and c > 0 else 0.0
            if v > best_v * (1 + 1e-9):
                best_k, best_v = k, v
        return best_k

    # -- decision ------------------------------------------------------------------------------
    def choose(self, cap: int) -> int:
        self.step += 1
        cap = max(0, cap)
        if cap == 0:
            return 0
        if not self._cost:
            return 0  # measure a plain step first: every later estimate is relative to it
        best = self.best(cap)
        if self.explore_every > 0 and self.step % self.explore_every == 0:
            return self._probe(best, cap)
        return best

    def _probe(self, best: int, cap: int) -> int:
        candidates = [k for k in (best + 1, best - 1) if 0 <= k <= cap]
        if not candidates:
            return best
        # Least recently measured first (never measured = oldest); ties: the deeper one.
        return min(candidates, key=lambda k: (self._measured_at.get(k, -1), -k))

    def snapshot(self) -> dict:
        """The learned state, for logs and the benchmark's breakdown."""
        return {
            "step": self.step,
            "acceptance": [round(a, 4) for a in self.acceptances(len(self._succ))],
            "cost_ms": {k: round(v * 1e3, 3) for k, v in sorted(self._cost.items())},
        }
