"""How many tokens to draft per round: a fixed cap, or the depth that maximises tokens per second.

A controller answers ``choose(cap) -> k`` before every decode step (``k = 0`` is a plain step) and
learns from ``observe(k, n_drafted, n_accepted, seconds)`` after it. The decode loop clamps ``k`` for
reasons a controller cannot know (tokens left in ``num_predict``, room in the context) and reports
the depth it actually used.

``AdaptiveDepth`` (docs/speculation.md, "Choosing the depth"; the seed's engine-level controller). The
measurements behind each rule below are in docs/measurements.md, "Adaptive depth".

* ``a_j``, the conditional acceptance at draft position ``j`` (given positions ``< j`` were accepted),
  is a discounted Beta estimate: ``a_j = (m_j * w + S_j) / (w + N_j)`` where ``S_j`` and ``N_j`` are
  exponentially decayed counts of acceptances and trials at ``j``. The prior mean ``m_j`` is the
  estimate one position shallower (``m_0 = prior``): deep positions are observed only when the
  controller dares to draft that deep, and until then they are best guessed from their neighbour,
  not from a fixed 0.5 whose product over 8 positions would keep a perfect drafter shallow.
  A position the drafter did not fill (n-gram miss, ``draft_p_min`` stop) counts as a rejection:
  it yields nothing either way.
* Acceptance belongs to the text, so each request starts from what earlier requests learned but
  is not held to it: ``begin_request`` turns the learned ``a_j`` into the new request's prior means,
  worth ``carry_weight`` trials each, and clears the counts. Decayed counts alone would make a prose
  request after a code request keep drafting on code's acceptance for dozens of rounds. The carried
  means past position 0 are scaled by how the request's own position 0 compares with the carried
  one: a text that rejects the first draft more often than the last text did rejects the later ones
  more often too, and those positions are observed only in rounds that reach them, so unscaled they
  kept a harder text's rounds deep. Costs belong to the machine and carry over whole; the verification
  costs are one table for every controller of a target (``verify_times``), whichever source drafted.
  If that prior says plain decoding, the request's first steps still draft one token each, back to back, until
  position 0 has ``min_trials`` of the request's own trials: the drafter has just read the prompt and
  stays in step while every step drafts, so these probes cost no catch-up, while any probe after a
  plain step first forwards every token committed since the drafter last ran. (One probe and then
  one every few steps, as before, paid a catch-up each and told a code request after a prose one
  too little to leave plain decoding for dozens of steps.)
* ``cost(k)`` is built from parts that every round measures, so one round informs every depth:
  ``cost(k) = verify(k + 1) + drafting(k)``. ``verify(w)`` is the wall time of a step minus its
  drafting (the verification forward over ``w`` tokens, acceptance, bookkeeping), kept per width;
  plain steps measure ``verify(1)``. ``drafting(n)`` is the drafter's time for a proposal of ``n``
  tokens, kept per length: it is not ``n`` times a per-token price, because a draft model's first
  forward of a round also catches up on the tokens the last round committed, and a per-token price
  taken from one-draft rounds overprices the deeper rounds. Each is a low quantile of its recent
  samples: on a shared machine noise only ever adds time, and a single slow round (a cold kernel
  shape, another process) must not condemn a depth for good, which a moving average did. A length
  never measured is interpolated between measured ones, or extrapolated with the slope across the
  measured range (proportionally from a single one): optimistic, so a promising depth is tried once
  and then known. The verification table (``WidthCosts``) also forgets a sample after ``max_age``
  observations and keeps its estimates non-decreasing in width: a width the controller rarely
  verifies was otherwise priced by whatever minute it was last measured in.
* ``choose`` returns ``argmax_k E[committed(k)] / cost(k)``, ``E[committed(k)] = 1 + sum_{i<=k}
  prod_{j<=i} a_j``. Every ``explore_every``-th step it probes instead, among the best depth's
  neighbours and plain decoding (depth 0), the one measured least recently: that keeps the costs
  fresh (plain steps included, which a controller settled on drafting would otherwise never
  re-measure, so one slow early plain step made drafting look good for ever) and lets acceptance at
  the next position be observed. Exploration is a deterministic function of the step count, so runs
  with a fixed cost model are reproducible. A useless drafter therefore costs one probe of depth 1
  every ``explore_every`` steps. Until position 0 has ``min_trials`` (decayed) trials in a model's
  first request, probes come four times as often: plain steps teach nothing about acceptance, and a
  cold start that settled on plain decoding after one unlucky round would otherwise wait
  ``explore_every`` steps per lesson. Settled on plain decoding, the opposite: each probe that leaves
  plain best doubles the interval (up to 8x, reset by a new request or by drafting), because a probe
  after plain steps first forwards every token the drafter missed. Where that catch-up costs more per
  token than ``catchup_budget`` of a plain step (a draft model, measured from the catch-ups the loop
  reports through ``observe_catchup``), a controller settled on plain decoding stops probing within
  the request once the request has its own evidence (``min_trials`` at position 0): the catch-up
  would cost that share of every token whatever the interval. Until then a request settled on plain
  by what earlier texts taught probes four times as often (each probe catching up a few tokens), so a
  code request after prose still finds out early that drafting pays. For the same reason a controller
  that has taken plain steps goes back to drafting only when what drafting saves over
  ``switch_horizon`` tokens pays for catching up on them: on a shared host a few slow plain steps
  made drafting look better by a few per cent, and the round that followed caught up 60-80 tokens.
  Beside other sequences the catch-up counts once for every sequence that waits through it, and what the
  drafter lacks is what it reports (``backlog``): a draft model serving several slots reads its request's
  prompt only at its first proposal, so a first round there catches up on the whole prompt.

The state lives on the ModelRuntime, one controller per loaded model and drafter kind, across requests.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol


class DepthController(Protocol):
    def begin_request(self) -> None: ...

    def choose(self, cap: int) -> int: ...

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float,
                drafting: float = 0.0) -> None: ...

    def observe_catchup(self, tokens: int, seconds: float) -> None: ...

    def token_seconds(self) -> float | None:
        """What a plain target step costs now, as far as the controller knows (None: it does not price)."""
        ...


@dataclass
class FixedDepth:
    """Always the cap. ``draft_p_min`` early stop happens in the drafter; a proposal shorter than
    ``n_min`` is not verified (the decode loop takes a plain step instead)."""

    n_min: int = 0

    def begin_request(self) -> None:
        pass

    def choose(self, cap: int) -> int:
        return max(0, cap)

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float,
                drafting: float = 0.0) -> None:
        pass

    def observe_catchup(self, tokens: int, seconds: float) -> None:
        pass

    def token_seconds(self) -> float | None:
        return None  # a fixed depth prices nothing: a drafter does all its optional work


#: The deepest draft ``AdaptiveDepth`` considers. ``choose`` runs before every token and scores each
#: depth up to the cap, so without a bound a huge cap made every token slow; no drafter is ever
#: accepted this deep (and ``engine.contract.options`` refuses a larger ``draft_num_predict``).
MAX_CONSIDERED_DEPTH = 64

CostModel = Callable[[int, int], float]  # (depth, n_drafted) -> seconds; replaces measurements in tests


@dataclass
class RecentTimes:
    """The last ``window`` measurements of one quantity; its estimate is their ``quantile``. Each
    measurement may carry a stamp (an observation count) so that old ones can be left out."""

    window: int = 8
    quantile: float = 0.25
    values: deque = field(default_factory=deque)
    stamps: deque = field(default_factory=deque)

    def add(self, seconds: float, stamp: int = 0) -> None:
        self.values.append(seconds)
        self.stamps.append(stamp)
        while len(self.values) > self.window:
            self.values.popleft()
            self.stamps.popleft()

    def estimate(self, since: int | None = None) -> float | None:
        """The quantile of the measurements stamped ``since`` or later (all of them without ``since``);
        None when there are none."""
        kept = self.values if since is None else [v for v, t in zip(self.values, self.stamps) if t >= since]
        if not kept:
            return None
        ordered = sorted(kept)
        return ordered[int(self.quantile * (len(ordered) - 1))]


@dataclass
class WidthCosts:
    """What a verification over each number of tokens (its width) costs on one target, shared by all of
    the target's controllers: a verification's cost belongs to the target and the machine, not to the
    source that drafted the round, and a source with few rounds (a rewrite's copy) priced its widths
    from one or two samples of its own, as old as its last round.

    Widths that a controller rarely verifies are the ones an old or unlucky sample can misprice for a
    long time, so two rules keep such a sample from steering the depth:

    * a sample counts for ``max_age`` observations (of any width) and is then forgotten: a width with
      no recent sample is priced from its measured neighbours, optimistically, and the controller soon
      tries it again. Costs drift with a shared host's memory bandwidth, by half within minutes, and
      one slow minute otherwise priced a depth for good;
    * more tokens never verify faster, so where a width's estimate exceeds a wider one's the two are
      pooled (their mean weighted by their samples: isotonic regression), not left to price the depths
      between them (a stale slow width-5 sample beside a cheaper width 7 priced 4 drafts above 6).
      Capping each width by the cheapest wider one instead pulled the narrow widths, plain decoding
      among them, down to whichever wider sample was luckiest.

    The traces behind both are in docs/measurements.md, "Adaptive depth". The estimates are worked out
    once per observation (``choose`` prices every depth up to the cap).
    """

    max_age: int = 256
    times: dict[int, RecentTimes] = field(default_factory=dict)
    count: int = 0  # observations so far; each sample is stamped with it
    _points: dict[int, float] | None = None
    # width -> estimate, until the next sample: every controller of a batch prices the same widths each step
    _estimates: dict[int, float] = field(default_factory=dict, repr=False, compare=False)
    # The step loop adds samples and prices depths on the compute thread; a reader elsewhere (a benchmark's
    # ``snapshot``) may read the table meanwhile.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __bool__(self) -> bool:
        return bool(self.times)

    def add(self, width: int, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.times.setdefault(width, RecentTimes()).add(seconds, self.count)
            self._points = None
            self._estimates = {}

    def points(self) -> dict[int, float]:
        """Width -> estimated seconds, for each width with a recent sample, non-decreasing in width."""
        with self._lock:
            return self._fresh_points()

    def _fresh_points(self) -> dict[int, float]:
        if self._points is None:
            since = self.count - self.max_age + 1
            fresh = []  # (width, estimate, fresh samples), by width
            for w in sorted(self.times):
                r = self.times[w]
                n = sum(1 for t in r.stamps if t >= since)
                if n:
                    fresh.append((w, r.estimate(since), n))
            self._points = _non_decreasing(fresh)
        return self._points

    def estimate(self, width: int) -> float | None:
        """Seconds for a verification of ``width`` tokens: measured, else interpolated between the
        measured widths around it or extrapolated (see ``_interpolate``); None before any sample."""
        with self._lock:
            known = self._estimates.get(width)
            if known is not None:
                return known
            points = self._fresh_points()
            if not points:
                return None
            value = self._estimates[width] = _interpolate(points, width, proportional=False)
            return value


class DraftingPeers:
    """The sequences of a batch that draft from one draft model, each marked by whether its latest round drafted
    from it: the draft forwards of those that do share the step loop's draft steps (``AdaptiveDepth.cost``). A
    sequence counts as drafting from when it joins until its controller first chooses plain decoding, so that
    sequences which all would draft are priced together from their first round. Touched on the compute thread
    only (the step loop runs every sequence there)."""

    def __init__(self) -> None:
        self._drafting: dict[int, bool] = {}

    def join(self, member: object) -> None:
        self._drafting[id(member)] = True

    def leave(self, member: object) -> None:
        self._drafting.pop(id(member), None)

    def mark(self, member: object, drafting: bool) -> None:
        if id(member) in self._drafting:
            self._drafting[id(member)] = drafting

    def besides(self, member: object) -> int:
        """How many other members draft now."""
        return sum(d for m, d in self._drafting.items() if m != id(member))


@dataclass
class AdaptiveDepth:
    prior: float = 0.5  # prior acceptance at every position
    prior_weight: float = 2.0  # pseudo-trials behind the prior
    carry_weight: float = 2.0  # pseudo-trials behind what earlier requests learned (begin_request)
    # Drafting must promise this much more than plain decoding. Going from plain steps to drafting
    # first forwards every token the drafter missed, a cost the per-round estimates leave out, and
    # a drafter that merely breaks even is better left idle: without a margin the controller flips
    # between plain and drafting on a break-even text and pays those catch-ups each time.
    plain_margin: float = 0.05
    decay: float = 0.95  # per observation: an effective memory of ~20 rounds per position
    explore_every: int = 16
    min_trials: float = 4.0  # position-0 trials below which probes come 4x as often
    # Settled on plain decoding, a probe mid-request first forwards the drafter over every token it
    # missed: with a draft model that costs the same share of a plain step for each of them however
    # rarely it probes (about 3.3 ms against 26 for the 0.5B drafter and the 1.5B target on a quiet
    # AVX2 host: 13 % of a request that never drafts). Once the request has its own evidence, such
    # probes are skipped while catching up costs more per token than this share of a plain step.
    catchup_budget: float = 0.05
    # Settled on plain decoding, the drafter falls behind by a token a step, and the next drafted round
    # first forwards it over all of them. Drafting resumes only when what it saves over this many tokens
    # pays for that catch-up: otherwise a plain step that merely ran slow (a shared host) flipped the
    # choice and one round paid for catching up dozens of tokens.
    switch_horizon: int = 32
    # In step with the drafter, a request keeps probing past min_trials, up to this many (decayed) trials at
    # position 0, while its acceptance one standard deviation up would make drafting best
    # (_worth_more_trials).
    sync_trials: float = 12.0
    # A request drafts at most this deep until a round is accepted whole, and each round accepted whole
    # doubles the limit (a slow start). What earlier texts taught is a prior worth ``carry_weight`` trials,
    # too little to stop a prose request after a rewrite from drafting its first rounds 4-8 deep on the
    # rewrite's acceptance: each such round costs 2-4 plain steps and commits 1-2 tokens (docs/bench/
    # speculation-defaults.md). A text that keeps accepting is at its depth within two or three rounds.
    start_depth: int = 2
    # Beside sequences that do not draft from its draft model, a round of this one may add at most this share of
    # a plain step to the batch's step (``_spares``). Pricing by the batch's tokens a second alone let a code
    # request draft beside a prose one for a 2 % gain of the pair of them: its draft steps and wider
    # verifications made each of the prose request's tokens 1.8x as slow, and a burst of the two, timed to its
    # last answer, served 0.76-0.97x what plain decoding did in six runs (docs/bench/step-loop-zen5.md).
    batch_slowdown: float = 0.10
    # How many sequences share each forward now (engine.batching; None: this one alone). What a sequence
    # adds to a batch's step, its drafting and its verification rows beyond the first, every sequence of
    # the batch waits for (``cost``). With many busy sequences drafting then rarely pays, and the
    # controller decodes plainly. Sharing forwards, a step's wall time is the batch's (its width is every
    # sequence's rows, and it includes waiting for the others): ``verify_times`` is then fed by whoever
    # runs the batched forwards, by their total width (engine.batching.step_loop's ``on_step``), not here.
    load: Callable[[], int] | None = None
    # The sequences of the batch that draft from the same draft model (None: this one alone). The draft forwards of
    # those drafting share steps (the step loop batches them, before the verifications), so a round they all
    # draft costs the batch one drafting and one verification over every row (``cost``).
    peers: DraftingPeers | None = None
    cost_model: CostModel | None = None
    # What the drafter forwards before its next proposal, as it reports it (a draft model: every token its cache
    # lacks, a prompt it has not read yet included: engine.runtime wires the request's drafter). None: the plain
    # steps counted since it last drafted (``_behind``), which miss a prompt read lazily (``lazy_prompt``).
    backlog: Callable[[], int] | None = None
    # Seconds per token of the drafter's catch-ups (``observe_catchup``); the runtime hands the controllers of every
    # sequence slot drafting from one draft model the same record, as it does ``verify_times``: kept per slot, a
    # slot that had never caught up priced every catch-up at nothing.
    catchup_times: RecentTimes = field(default_factory=RecentTimes)

    _succ: list[float] = field(default_factory=list)
    _carried: list[float] = field(default_factory=list)  # per position: the previous requests' a_j
    _trials: list[float] = field(default_factory=list)
    # width -> step time minus drafting; the runtime hands every controller of one target the same table
    verify_times: WidthCosts = field(default_factory=WidthCosts)
    _drafting: dict[int, RecentTimes] = field(default_factory=dict)  # tokens drafted -> drafter time
    _drafting_costs: dict[int, float] = field(default_factory=dict)  # n -> drafting_cost(n), until the next sample
    _measured_at: dict[int, int] = field(default_factory=dict)
    step: int = 0
    _plain_probes: int = 0  # probes in a row that found plain decoding still best
    # plain steps since the last drafted round (or the request's start, when the drafter read the prompt):
    # the tokens a draft model will catch up on before its next proposal
    _behind: int = 0
    _ramp: int = MAX_CONSIDERED_DEPTH  # the deepest this request may draft now (begin_request: start_depth)

    # -- learning ------------------------------------------------------------------------------
    def begin_request(self) -> None:
        """A new request: what was learned becomes its prior (see the module doc), and while plain
        decoding is the choice its first steps probe, back to back, the drafter being in step."""
        self._plain_probes = 0
        self._behind = 0
        self._ramp = max(1, self.start_depth)
        if self._succ:
            self._carried = self.acceptances(len(self._succ))
            self._succ = [0.0] * len(self._succ)
            self._trials = [0.0] * len(self._trials)

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float,
                drafting: float = 0.0) -> None:
        """One step: ``depth`` asked, ``n_drafted`` proposed, ``n_accepted`` kept; ``seconds`` the
        step's wall time, of which ``drafting`` was spent by the drafter."""
        if self.cost_model is not None:
            seconds, drafting = self.cost_model(depth, n_drafted), 0.0
        drafting = min(max(drafting, 0.0), seconds)
        # The verification width is what was drafted, not what was asked: an n-gram miss or a
        # draft_p_min stop verifies fewer tokens and costs less. A step shared with other sequences was
        # as wide as all their rows together and waited for them: the batch records it (``load``).
        if self.load is None:
            self.verify_times.add(n_drafted + 1, seconds - drafting)
        if n_drafted > 0:
            self._drafting.setdefault(n_drafted, RecentTimes()).add(drafting)
            self._drafting_costs.clear()
        self._measured_at[n_drafted] = self.step
        self._behind = self._behind + 1 if n_drafted == 0 else 0
        if n_drafted >= self._ramp and n_accepted == n_drafted:
            self._ramp = min(2 * self._ramp, MAX_CONSIDERED_DEPTH)
        # Positions 0..a are observed (a accepted, then the first failure); deeper ones are not.
        for j in range(min(n_accepted + 1, depth)):
            self._grow(j + 1)
            self._succ[j] = self.decay * self._succ[j] + (1.0 if j < n_accepted else 0.0)
            self._trials[j] = self.decay * self._trials[j] + 1.0

    def observe_catchup(self, tokens: int, seconds: float) -> None:
        """A proposal first forwarded the drafter over ``tokens`` it missed, in ``seconds``."""
        if tokens > 0:
            self.catchup_times.add(seconds / tokens)

    def observe_elsewhere(self, tokens: int) -> None:
        """A step another controller chose (``PerSourceDepth``: another source drafted it, or it was
        plain) committed ``tokens`` this controller's drafter has not seen: its next proposal catches up
        on them as on plain steps."""
        self._behind += tokens

    def catchup_too_dear(self) -> bool:
        """Whether catching the drafter up costs more per token than ``catchup_budget`` of a plain step
        (False until a catch-up was measured)."""
        plain = self.verify_cost(1)
        return bool(self.catchup_times.values) and plain is not None and \
            self.catchup_times.estimate() > self.catchup_budget * plain

    def _worth_more_trials(self, cap: int) -> bool:
        """Whether the request's evidence at position 0 is still short of ``sync_trials`` and its
        acceptance one standard deviation higher would make drafting best: the evidence does not yet rule
        drafting out, and settling on plain now would leave the rest of the request to probes that each
        pay a catch-up (a code request's first 7 drafts, 5 accepted, kept it plain for 500 tokens of a
        text it drafts at 0.92)."""
        return self._trials_at(0) < self.sync_trials and self.best(cap, optimism=1.0) > 0

    def _lag(self) -> int:
        """The tokens the drafter forwards before its next proposal. Alone, the plain steps since it last ran (a
        prompt it has not read yet does not count: it reads that once a request whatever is chosen, as a lone
        model's drafter reads it with the prompt, and a long request repays it). Beside other sequences, all it
        lacks: every sequence waits through that forward (a 0.5B drafter catching up on a 75-token context took
        180-340 ms of a batch of eight, for a one-token round)."""
        if self.backlog is None or self._sharing() == 1:
            return self._behind
        return self.backlog()

    def _in_step(self) -> bool:
        """Whether drafting now needs no catch-up worth pricing: the drafter has seen all but the last token,
        or it never had to catch up (an n-gram, an MTP head, a copy)."""
        return self._lag() <= 1 or not self.catchup_times.values

    def _repays_catchup(self, k: int) -> bool:
        """Whether drafting at depth ``k`` saves, over ``switch_horizon`` tokens, more than catching the
        drafter up costs: on the tokens since it last ran (``_lag``), times the sequences that wait through it
        (True when it is not behind, or no catch-up was measured yet)."""
        if self._in_step():
            return True
        plain, drafting = self.throughput(0), self.throughput(k)
        if plain <= 0 or drafting <= 0:
            return True
        saved = (1.0 / plain - 1.0 / drafting) * self.switch_horizon
        return saved > self._lag() * self.catchup_times.estimate() * self._sharing()

    def _grow(self, n: int) -> None:
        while len(self._succ) < n:
            self._succ.append(0.0)
            self._trials.append(0.0)

    # -- model ---------------------------------------------------------------------------------
    def acceptances(self, k: int, optimism: float = 0.0) -> list[float]:
        """Estimated P(position j accepted | positions < j accepted) for j < k (0-based); ``optimism``
        standard deviations of its Beta estimate are added at position 0 (capped at 1)."""
        out, mean, scale = [], self.prior, 1.0
        for j in range(k):
            s = self._succ[j] if j < len(self._succ) else 0.0
            n = self._trials[j] if j < len(self._trials) else 0.0
            if j < len(self._carried):
                carried = min(1.0, self._carried[j] * scale)
                mean = (carried * self.carry_weight + s) / (self.carry_weight + n)
            else:
                mean = (mean * self.prior_weight + s) / (self.prior_weight + n)
            if j == 0:
                if optimism:
                    weight = self.carry_weight if self._carried else self.prior_weight
                    mean = min(1.0, mean + optimism * (mean * (1.0 - mean) / (weight + n + 1.0)) ** 0.5)
                if self._carried and self._carried[0] > 0:
                    scale = mean / self._carried[0]
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

    def verify_cost(self, width: int) -> float | None:
        """Measured step time (drafting excluded) at ``width``, or an optimistic estimate."""
        return self.verify_times.estimate(width)

    def token_seconds(self) -> float | None:
        return self.verify_cost(1)

    def drafting_cost(self, n: int) -> float:
        """The drafter's time for a proposal of ``n`` tokens (0 until measured: optimistic)."""
        if n <= 0 or not self._drafting:
            return 0.0
        known = self._drafting_costs.get(n)
        if known is None:
            known = self._drafting_costs[n] = _estimate(self._drafting, n, proportional=True)
        return known

    def _sharing(self) -> int:
        return max(1, self.load()) if self.load is not None else 1

    def cost(self, k: int) -> float | None:
        """Expected wall time of a step at depth k: verification over k + 1 tokens plus k drafts.

        Sharing each forward with ``B - 1`` other sequences (``load``), taken to decode one row each, a
        plain step is a forward over B rows, ``T = v(B)``, and depth k adds ``D = v(B + k) - v(B) + d(k)``
        (its extra rows and its drafting) to a step that all B sequences wait for, so it counts B times:
        ``cost(k) = T + B D``. Then ``E[committed(k)] / cost(k) > 1 / T`` exactly when drafting raises the
        batch's tokens per step time: ``T (E - 1) > B D``, the tokens gained against B times the time
        added. (Pricing the widths by this sequence's rows alone, as one sequence does, mixed steps in
        which others drafted into ``v(1)`` and made drafting look cheap; two sequences drafting a
        perfectly accepted code prompt then served 0.81x what plain decoding did.)

        When g of the B sequences draft from the same draft model (this one and ``peers`` drafting now), taken to
        draft alike, their drafts run in the same steps: a round costs the batch ``d(k)`` once and a verification
        over ``B + g k`` rows, and commits ``B - g + g E`` tokens. Drafting then pays exactly when
        ``T (E - 1) > (B / g) D_g``, with ``D_g = v(B + g k) - v(B) + d(k)``: ``cost(k) = T + (B / g) D_g``, the
        one-drafter formula at g = 1. (Priced as if the others waited idle, eight sequences of one pair never
        drafted, and four drafting 13-55 accepted tokens of their 256 served 0.91-0.95x plain.)"""
        return self._cost(k, *self._batch())

    def _batch(self) -> tuple[int, int]:
        """(B, g): the sequences sharing each forward, and how many of them draft from this one's draft model
        (see ``cost``). Read once per choice: ``best`` prices every depth against the same batch."""
        sharing = self._sharing()
        if sharing == 1:
            return 1, 1
        return sharing, min(sharing, 1 + self.peers.besides(self)) if self.peers is not None else 1

    def _cost(self, k: int, sharing: int, group: int) -> float | None:
        if sharing == 1:
            v = self.verify_cost(k + 1)
            return None if v is None else v + self.drafting_cost(k)
        added = self._added(k, sharing, group)
        return None if added is None else added[0] + sharing / group * added[1]

    def _added(self, k: int, sharing: int, group: int) -> tuple[float, float] | None:
        """(T, D_g) of ``cost``: a plain step of the batch, and what a round of the drafting group at depth k adds
        to it."""
        plain, wide = self.verify_cost(sharing), self.verify_cost(sharing + group * k)
        if plain is None or wide is None:
            return None
        return plain, max(0.0, wide - plain) + self.drafting_cost(k)

    def _spares(self, k: int, sharing: int, group: int) -> bool:
        """Whether a round at depth ``k`` slows the sequences of the batch that do not draft from this one's draft
        model by at most ``batch_slowdown`` of a step. They wait through its draft steps and its wider
        verification, and in a batch that is timed to its last answer (a burst of requests, each user waiting for
        their own) the drafter's gain does not repay them: it leaves early, and they finish as late as their
        slowed steps make them. Sequences that all draft gain together. Without peers (a drafter with no draft
        model) or alone, every depth spares the others."""
        if k == 0 or self.peers is None or group >= sharing:
            return True
        added = self._added(k, sharing, group)
        return added is None or added[1] <= self.batch_slowdown * added[0]

    def value(self, cap: int) -> float:
        """Expected tokens a second at the best depth up to ``cap`` (0 until costs are measured)."""
        return self.throughput(self.best(cap))

    def throughput(self, k: int) -> float:
        c = self.cost(k)
        return self.expected_committed(k) / c if c and c > 0 else 0.0

    def best(self, cap: int, optimism: float = 0.0) -> int:
        """The depth in [0, cap] with the highest expected tokens per second (ties: shallower);
        drafting must beat plain decoding by ``plain_margin``. Depths beyond
        :data:`MAX_CONSIDERED_DEPTH` are not scored. ``optimism``: see ``acceptances``."""
        cap = min(max(0, cap), MAX_CONSIDERED_DEPTH)
        acc = self.acceptances(cap, optimism)
        best_k, best_v = 0, -1.0
        expected, run = 1.0, 1.0
        batch = self._batch()
        for k in range(cap + 1):
            if k > 0:
                run *= acc[k - 1]
                expected += run
            if not self._spares(k, *batch):
                continue
            c = self._cost(k, *batch)
            v = expected / c if c and c > 0 else 0.0
            if k == 0:
                v *= 1.0 + self.plain_margin
            if v > best_v * (1 + 1e-9):
                best_k, best_v = k, v
        return best_k

    # -- decision ------------------------------------------------------------------------------
    def choose(self, cap: int) -> int:
        k = self._choose(cap)
        if self.peers is not None:
            self.peers.mark(self, k > 0)
        return k

    def _choose(self, cap: int) -> int:
        self.step += 1
        cap = min(max(0, cap), MAX_CONSIDERED_DEPTH, self._ramp)  # per-token work independent of the cap
        if cap == 0:
            return 0
        if not self.verify_times:
            return 0  # measure a plain step first: every later estimate is relative to it
        best = self.best(cap)
        own_evidence = self._trials_at(0) >= self.min_trials  # this request's (begin_request clears them)
        if best == 0 and self._in_step() and (not own_evidence or self._worth_more_trials(cap)) and \
                self._sharing() == 1:  # in a batch a probe's drafting holds up every other sequence
            return 1  # a probe that needs no catch-up
        if best > 0 and not self._repays_catchup(best):
            best = 0
        every = self.explore_every
        if not own_evidence and (not self._carried or best == 0):  # nothing learned yet, or not on this text
            every = max(1, every // 4) if every > 0 else 0  # 0: no exploration at all
        elif best == 0:  # settled on plain: each probe that leaves it so doubles the wait (to 8x)
            every *= 2 ** min(self._plain_probes, 3)
        if best > 0:
            self._plain_probes = 0
        if best == 0 and self._sharing() > 1:
            return 0  # settled on plain in a batch: a probe's drafting and catch-up would hold up every sequence
        if every > 0 and self.step % every == 0:
            if best == 0:
                # the text's own first probes catch up a few tokens each; later ones would pay for every
                # token since
                if own_evidence and self.catchup_too_dear():
                    return 0
                self._plain_probes += 1
            return self._probe(best, cap)
        return best

    def tried_this_request(self) -> bool:
        """Whether a round drafted by this controller has been observed since ``begin_request``."""
        return self._trials_at(0) >= 1.0

    def _trials_at(self, j: int) -> float:
        return self._trials[j] if j < len(self._trials) else 0.0

    def _probe(self, best: int, cap: int) -> int:
        candidates = sorted({k for k in (best + 1, best - 1, 0) if 0 <= k <= cap and k != best})
        if not candidates:
            return best
        # Least recently measured first (never measured = oldest); ties: the deeper one.
        return min(candidates, key=lambda k: (self._measured_at.get(k, -1), -k))

    def snapshot(self) -> dict:
        """The learned state, for logs and the benchmark's breakdown."""
        return {
            "step": self.step,
            "acceptance": [round(a, 4) for a in self.acceptances(len(self._succ))],
            "verify_ms": {w: round(v * 1e3, 3) for w, v in self.verify_times.points().items()},
            "drafting_ms": {n: round(self.drafting_cost(n) * 1e3, 3) for n in sorted(self._drafting)},
            # nothing before the first observation (a source of PerSourceDepth that never drafted)
            "cost_ms": {k: round(self.cost(k) * 1e3, 3) for k in range(max(self.verify_times.points(), default=0))},
        }


@dataclass
class PerSourceDepth:
    """One controller per drafting source, for a drafter whose rounds come from different sources
    (``CopyFirstDrafter``: the context copy or the draft model). Each source has its own acceptance
    and its own drafting cost (a copy costs nothing and is mostly accepted, a model round costs a
    forward per token), so one estimate over both would draft copy rounds too shallow and model
    rounds too deep. ``source()`` names the coming round's source; it is asked before each choice
    and the step's observation goes to the controller that chose; the others hear how many tokens it
    committed (``observe_elsewhere``), which a draft model catches up on at its next round."""

    controllers: dict[str, DepthController]
    source: Callable[[], str]
    # A source named here competes with the one it maps to: the round goes to that one instead (told
    # through ``use_source``) when its controller expects more tokens a second, once this request has
    # tried the competing source (it costs no drafting and the try drafts one token, so one try per text
    # is cheap; what earlier texts taught is its prior).
    fallbacks: dict[str, str] = field(default_factory=dict)
    use_source: Callable[[str], None] | None = None
    # A source's own depth cap below the request's: ``model+suffix`` lets a round drafted from the earlier
    # outputs run to the suffix drafter's cap (a repeat is accepted whole) and keeps the model's and the
    # copy's rounds at the request's cap (``engine.runtime``).
    caps: dict[str, int] = field(default_factory=dict)
    _current: str = ""

    def begin_request(self) -> None:
        for c in self.controllers.values():
            c.begin_request()

    def choose(self, cap: int) -> int:
        source = self.source()
        other = self.fallbacks.get(source)
        if other is not None and self._prefers(other, source, cap):
            source = other
            if self.use_source is not None:
                self.use_source(other)
        self._current = source
        cap = self._cap(source, cap)
        ctl = self.controllers[source]
        if source in self.fallbacks and isinstance(ctl, AdaptiveDepth) and not ctl.tried_this_request():
            # the request's one try of a competing source is a probe: one draft. At the depth earlier texts
            # taught (a rewrite's weak copy runs 3-4 deep) a code request's try verified 4 tokens for nothing
            cap = min(cap, 1)
        return ctl.choose(cap)

    def _cap(self, source: str, cap: int) -> int:
        return min(cap, self.caps.get(source, cap))

    def _prefers(self, other: str, source: str, cap: int) -> bool:
        mine, theirs = self.controllers[source], self.controllers[other]
        if not isinstance(mine, AdaptiveDepth) or not isinstance(theirs, AdaptiveDepth):
            return False
        if not mine.tried_this_request():
            return False
        return theirs.value(self._cap(other, cap)) > mine.value(self._cap(source, cap))

    def observe(self, depth: int, n_drafted: int, n_accepted: int, seconds: float,
                drafting: float = 0.0) -> None:
        self.controllers[self._current].observe(depth, n_drafted, n_accepted, seconds, drafting)
        # A copy round leaves the draft model behind by every token it committed, as plain steps do.
        for name, other in self.controllers.items():
            if name != self._current and isinstance(other, AdaptiveDepth):
                other.observe_elsewhere(n_accepted + 1)

    def observe_catchup(self, tokens: int, seconds: float) -> None:
        self.controllers[self._current].observe_catchup(tokens, seconds)

    def token_seconds(self) -> float | None:
        return self.controllers[self._current].token_seconds() if self._current else None


def _non_decreasing(points: list[tuple[int, float, int]]) -> dict[int, float]:
    """Weighted isotonic regression (pool adjacent violators) of ``(x, value, weight)`` sorted by x:
    the closest non-decreasing values, x -> value."""
    blocks: list[list[float]] = []  # [mean, weight, count of points]
    for _, value, weight in points:
        blocks.append([value, float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out, i = {}, 0
    for mean, _, count in blocks:
        for x, _, _ in points[i:i + count]:
            out[x] = mean
        i += count
    return out


def _estimate(measured: dict[int, RecentTimes], x: int, proportional: bool) -> float:
    """The time at ``x`` from per-``x`` measurements (see ``_interpolate``)."""
    if x in measured:
        return measured[x].estimate()
    return _interpolate({w: r.estimate() for w, r in measured.items()}, x, proportional)


def _interpolate(points: dict[int, float], x: int, proportional: bool) -> float:
    """The time at ``x`` from times at some ``x``: measured, else interpolated between neighbours, else
    extrapolated with the slope across the measured range (never negative). A single point is taken as
    the cost at every ``x`` (``proportional=False``: a verification width) or as ``x`` times its
    per-unit cost (``proportional=True``: drafted tokens)."""
    if x in points:
        return points[x]
    xs = sorted(points)
    lo = [w for w in xs if w < x]
    hi = [w for w in xs if w > x]
    if lo and hi:
        a, b = lo[-1], hi[0]
        return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    if len(xs) == 1:
        only = xs[0]
        return points[only] * x / only if proportional else points[only]
    a, b = xs[0], xs[-1]
    slope = max(0.0, (points[b] - points[a]) / (b - a))
    edge = b if lo else a
    return max(0.0, points[edge] + slope * (x - edge))
