"""Drafters (engine/speculative/: drafter.py, draft_model.py, ngram.py, mtp.py) and depth controllers (engine.speculative.depth) as units, plus their state invariants
after real generations: rollback, prefix reuse, p_min, exact draft distributions, MTP pairing."""

from __future__ import annotations

import pytest
import torch

from engine.models.loader import find_nextn_block, load_nextn_head
from engine.sampling.sampler import SamplingOptions, make_generator, process
from engine.speculative.depth import AdaptiveDepth, FixedDepth, WidthCosts
from engine.speculative.draft_model import DraftModelDrafter
from engine.speculative.drafter import DraftContext, TargetOutput
from engine.speculative.mtp import MtpDrafter
from engine.speculative.ngram import NgramDrafter
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts, write_model

GREEDY_OPTS = SamplingOptions(temperature=0)


def ctx(opts: SamplingOptions = GREEDY_OPTS, p_min: float = 0.0, seed: int = 0) -> DraftContext:
    return DraftContext(opts, make_generator(seed, stream=1), p_min)


# ------------------------------------------------------------------------------------------------
# n-gram
# ------------------------------------------------------------------------------------------------
def test_ngram_prefers_the_longest_then_the_most_recent_match():
    d = NgramDrafter(n_max=3, probe_below=0)  # lookup mechanics on short logs: no probe limit
    #          0  1  2  3  4  5  6  7  8  9 10
    d.begin([1, 2, 3, 9, 2, 3, 8, 7, 5, 2, 3])
    # suffix (2, 3): earlier occurrences end at 2 (-> 9) and 5 (-> 8); the most recent wins.
    assert d.propose(2, ctx()).tokens == [8, 7]
    # A longer match beats a more recent shorter one: suffix (1, 2, 3) occurred at the start.
    d.begin([1, 2, 3, 9, 2, 3, 8, 1, 2, 3])
    assert d.propose(1, ctx()).tokens == [9]


def test_ngram_continuation_runs_into_the_suffix_for_periodic_text():
    d = NgramDrafter(probe_below=0)
    d.begin([5, 6, 7, 5, 6, 7, 5])
    assert d.propose(7, ctx()).tokens == [6, 7, 5, 6, 7, 5, 6]
    d.begin([4, 4])
    assert d.propose(5, ctx()).tokens == [4, 4, 4, 4, 4]


def test_ngram_no_match_and_incremental_index():
    d = NgramDrafter(probe_below=0)
    d.begin([1, 2, 3])
    p = d.propose(4, ctx())
    assert p.tokens == [] and p.q is None
    d.commit([1], 4)
    assert d.propose(2, ctx()).tokens == [2, 3]
    d.commit([2, 3], 6)
    assert d.propose(3, ctx()).tokens == [1, 2, 3]
    # A rollback (not an extension) rebuilds the index from scratch.
    d.begin([7, 8, 7])
    assert d.propose(1, ctx()).tokens == [8]
    with pytest.raises(RuntimeError):
        d.commit([1], 99)


def test_ngram_thin_evidence_gets_a_one_token_probe():
    # The suffix (2, 3) recurs, but nothing before it agrees: a coincidence, probed with one token.
    log = [9, 8, 7, 6, 2, 3, 50, 51, 52, 40, 41, 42, 43, 2, 3]
    d = NgramDrafter()
    d.begin(log)
    assert d.propose(4, ctx()).tokens == [50]
    # Three agreeing tokens (the bar) earn the full depth.
    d.begin([9, 8, 1, 2, 3, 50, 51, 52, 40, 41, 42, 1, 2, 3])
    assert d.propose(4, ctx()).tokens == [50, 51, 52, 40]


def copy_with_a_rename():
    """A 20-token 'function' (token 7 at 10, 16 and 18 plays the variable), a separator, and the first
    ten tokens of its copy: the output is rewriting the function."""
    src = list(range(100, 120))
    src[10] = src[16] = src[18] = 7
    return src, src + [1] + src[:10]


def test_ngram_cursor_keeps_copying_through_an_edit_and_learns_the_rename():
    src, log = copy_with_a_rename()
    d = NgramDrafter()
    d.begin(log)
    assert d.propose(4, ctx()).tokens == src[10:14]  # the suffix match: the copy as written
    d.commit([99], len(log) + 1)  # the target wrote 99 where the source had 7
    # No earlier text continues "..., 109, 99"; the cursor does (7 of the last 8 tokens agree).
    assert d.propose(4, ctx()).tokens == src[11:15]
    d.commit(src[11:16], len(log) + 6)  # the copy went on after the edit: 7 -> 99 is a rename
    assert d.propose(3, ctx()).tokens == [99, 117, 99]
    # The target keeps the source token this time: the rename is forgotten.
    d.commit([7], len(log) + 7)
    assert d.propose(2, ctx()).tokens == [117, 7]


def test_ngram_cursor_gives_way_outside_a_copy():
    src, log = copy_with_a_rename()
    d = NgramDrafter()
    d.begin(log)
    d.propose(4, ctx())
    d.commit([99, 55, 56], len(log) + 3)  # the output left the copy: nothing confirms a rename
    # The cursor now agrees on 5 of the last 8 tokens, under the bar of 6: no draft from it, and
    # with no suffix match anywhere there is no proposal at all.
    assert d.propose(4, ctx()).tokens == []
    d.commit([103], len(log) + 4)
    assert d.propose(2, ctx()).tokens == [104]  # a plain suffix match again (one token: thin evidence)


def test_ngram_names_a_certain_copy_apart_from_a_lookup():
    """The adaptive schedule prices the rounds of a copy that agrees on all of the last 8 tokens apart from
    other lookups (runtime: one controller per source); the round then drafts from the source it named."""
    src, log = copy_with_a_rename()
    d = NgramDrafter()
    d.begin(log)
    assert d.sources == ("copy", "lookup")
    assert d.round_source() == "copy"  # the ten copied tokens agree with the source: all of the last 8
    assert d.propose(4, ctx()).tokens == src[10:14]
    d.commit([99], len(log) + 1)  # an edit: 7 of the last 8 agree now
    assert d.round_source() == "lookup"
    assert d.propose(4, ctx()).tokens == src[11:15]  # still the cursor: a lookup source, not a different one
    d.commit(src[11:16], len(log) + 6)
    assert d.round_source() == "copy"  # the rename confirmed: renamed tokens count as agreement


# ------------------------------------------------------------------------------------------------
# draft model
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafters")
    return {"target": write_model(d, "t", 0), "draft": write_model(d, "d", 0, noise=0.3),
            "mtp": write_model(d, "m", 0, mtp="random")}


@pytest.fixture(scope="module")
def engine(models):
    return load_engine(models["target"], models["draft"])


def test_draft_model_rolls_back_to_the_committed_prefix(engine):
    d: DraftModelDrafter = engine.drafters["model"]
    prompt = engine.tokenize("def fib(n):")
    d.begin(prompt)
    assert d.cache.tokens == prompt[:-1]  # the prompt is evaluated at begin, all but the last token
    prop = d.propose(4, ctx())
    assert len(prop.tokens) == 4 and prop.q is None  # greedy: point masses
    assert d.cache.tokens == prompt + prop.tokens[:3]
    # Two drafts accepted, then a different token: the cache keeps exactly the agreed prefix.
    run = prop.tokens[:2] + [(prop.tokens[2] + 1) % 200]
    d.commit(run, len(prompt) + 3)
    assert d.tokens == prompt + run
    assert d.cache.tokens == prompt + prop.tokens[:2]
    # Greedy drafts equal the draft model's own greedy continuation.
    ref = engine.drafters["model"].model
    c = ref.new_cache(64)
    logits = ref.forward(prompt, c, logits_for="last")
    assert int(logits.argmax()) == prop.tokens[0]


@pytest.mark.parametrize("plain_steps, fused", [(1, True), (8, False)])
def test_draft_model_catch_up(engine, monkeypatch, plain_steps, fused):
    """Tokens committed by a few plain steps are forwarded with the round's tail in one call (no
    separate whole-step forward); a long run is forwarded first and timed apart for the controller."""
    d: DraftModelDrafter = engine.drafters["model"]
    prompt = engine.tokenize("def fib(n):")
    d.begin(prompt)
    first = d.propose(3, ctx())
    assert first.catchup_seconds == 0.0
    d.commit(first.tokens + [7], len(prompt) + 4)  # a full acceptance: last draft + bonus to forward
    assert d.propose(3, ctx()).catchup_seconds == 0.0
    d.commit([5], len(d.tokens) + 1)
    for t in range(9, 9 + plain_steps):  # plain steps: the drafter only hears about them
        d.commit([t], len(d.tokens) + 1)
    widths = []
    forward = d.model.forward
    monkeypatch.setattr(d.model, "forward", lambda toks, *a, **kw: widths.append(len(toks)) or forward(toks, *a, **kw))
    late = d.propose(3, ctx())
    assert len(late.tokens) == 3
    if fused:
        assert late.catchup_seconds == 0.0 and widths == [plain_steps + 1, 1, 1]  # 5, the plain tokens
        assert late.catchup_tokens == 0
    else:
        assert late.catchup_seconds > 0.0 and widths == [plain_steps - 1, 2, 1, 1]
        assert late.catchup_tokens == plain_steps - 1  # what the controller prices per token
    assert d.cache.tokens == d.tokens + late.tokens[:2]
    # Drafts after the catch-up equal the draft model's greedy continuation of the whole log.
    ref = d.model.new_cache(64)
    assert int(forward(d.tokens, ref, logits_for="last").argmax()) == late.tokens[0]


def test_draft_model_prefix_survives_across_sessions(engine):
    d: DraftModelDrafter = engine.drafters["model"]
    a = engine.tokenize("def fib(n): return the")
    d.begin(a)
    d.propose(2, ctx())
    b = a[:5] + engine.tokenize(" other")
    d.begin(b)
    assert d.cache.tokens == b[:-1] and d.cache.tokens[:5] == a[:5]


def test_draft_model_samples_from_the_q_it_reports(engine):
    """At temperature > 0 each draft is drawn from q, and q is the drafter's filtered distribution."""
    d: DraftModelDrafter = engine.drafters["model"]
    opts = SamplingOptions(temperature=0.9, top_k=5, top_p=0.95)
    prompt = engine.tokenize("def fib")
    d.begin(prompt)
    prop = d.propose(3, ctx(opts, seed=1))
    assert prop.q is not None and prop.q.shape == (3, engine.facts.vocab_size)
    assert torch.allclose(prop.q.sum(-1), torch.ones(3), atol=1e-5)
    for i, t in enumerate(prop.tokens):
        assert prop.q[i, t] > 0
        assert int((prop.q[i] > 0).sum()) <= 5
    # q_0 is exactly the pipeline applied to the draft model's logits after the prompt.
    ref = d.model
    logits = ref.forward(prompt, ref.new_cache(64), logits_for="last")
    assert torch.allclose(process(logits, prompt, (), opts).probs[0], prop.q[0], atol=1e-6)
    # Seeded: the same drafter stream gives the same drafts.
    d.begin(prompt)
    assert d.propose(3, ctx(opts, seed=1)).tokens == prop.tokens


def test_draft_p_min_stops_early(engine):
    d: DraftModelDrafter = engine.drafters["model"]
    prompt = engine.tokenize("def fib(n): return")
    d.begin(prompt)
    full = d.propose(8, ctx())
    d.begin(prompt)
    cut = d.propose(8, ctx(p_min=0.999999))
    assert len(full.tokens) == 8 and cut.tokens == []
    # Drafting stops at the first position whose top probability is below p_min.
    thr = full.confidences[0]
    stop = next(i for i, c in enumerate(full.confidences) if c < thr)
    d.begin(prompt)
    mid = d.propose(8, ctx(p_min=thr))
    assert 0 < len(mid.tokens) == stop < 8
    assert mid.tokens == full.tokens[:stop] and mid.confidences == full.confidences[:stop]


# ------------------------------------------------------------------------------------------------
# MTP
# ------------------------------------------------------------------------------------------------
def test_find_nextn_block():
    assert find_nextn_block(["blk.0.attn_q.weight", "blk.2.nextn.eh_proj.weight"]) == 2
    assert find_nextn_block(["blk.0.attn_q.weight", "output.weight"]) is None


def test_mtp_cache_equals_pairs_built_from_true_hidden_states(models):
    """After speculative rounds (speculative pairs written, rolled back, rewritten), the head's KV
    cache must equal the pairs computed from scratch from the target's real hidden states."""
    engine = load_engine(models["mtp"])
    run = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    ctx_tokens = run.result.context
    mtp: MtpDrafter = engine.drafters["mtp"]
    L = len(ctx_tokens)
    mtp._include_pending()  # the last commits' pairs wait for the next proposal; run them as it would
    assert mtp.cache.length == L - 1 == engine.cache.length
    assert mtp.cache.tokens == ctx_tokens[1:]
    out = engine.target.forward(ctx_tokens[:-1], engine.target.new_cache(128), logits_for="none", return_hidden=True)
    head = load_nextn_head(engine.target, engine.gguf, find_nextn_block(engine.gguf.tensors),
                           engine.facts.weight_format)
    fresh = MtpDrafter(head, 128)
    fresh.begin(ctx_tokens[:1])
    fresh.commit(ctx_tokens[1:], L, TargetOutput(0, out.prenorm_hidden))
    fresh._include_pending()
    n = L - 1
    assert torch.allclose(mtp.cache.k[:, :, :n], fresh.cache.k[:, :, :n], atol=1e-5)
    assert torch.allclose(mtp.cache.v[:, :, :n], fresh.cache.v[:, :, :n], atol=1e-5)
    # And so the next proposal is the same.
    assert mtp.propose(3, ctx()).tokens == fresh.propose(3, ctx()).tokens


@pytest.mark.parametrize("plain_steps, caught_up", [(0, 0), (2, 0), (9, 11)])
def test_mtp_catch_up_is_only_what_plain_steps_left(models, monkeypatch, plain_steps, caught_up):
    """The pairs of the last commit are what every round pays, so they are drafting, not catch-up: a round right
    after a round reports none; a few older pairs ride in the round's forward; a long run of them is forwarded first
    and reported (pairs, seconds) for the controller to price."""
    engine = load_engine(models["mtp"])
    toks = engine.tokenize("def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2) and then some more words")
    toks = (toks * 4)[:40]
    hidden = engine.target.forward(toks, engine.target.new_cache(64), logits_for="none",
                                   return_hidden=True).prenorm_hidden
    head = load_nextn_head(engine.target, engine.gguf, find_nextn_block(engine.gguf.tensors),
                           engine.facts.weight_format)
    d = MtpDrafter(head, 64)
    d.begin(toks[:1])
    d.commit(toks[1:10], 10, TargetOutput(0, hidden[0:9]))  # the prompt: pairs 0..8
    d.propose(3, ctx())
    d.commit(toks[10:13], 13, TargetOutput(9, hidden[9:12]))  # a round kept 2 drafts + the bonus
    for n in range(13, 13 + plain_steps):
        d.commit([toks[n]], n + 1, TargetOutput(n - 1, hidden[n - 1:n]))
    widths = []
    forward = head.forward
    monkeypatch.setattr(head, "forward", lambda h, t, c: widths.append(len(t)) or forward(h, t, c))
    late = d.propose(3, ctx())
    pending = 3 + plain_steps
    assert late.catchup_tokens == caught_up and (late.catchup_seconds > 0) == (caught_up > 0)
    assert widths == ([caught_up, pending - caught_up] if caught_up else [pending]) + [1, 1]
    fresh = MtpDrafter(head, 64)
    fresh.begin(toks[:1])
    n = 13 + plain_steps
    fresh.commit(toks[1:n], n, TargetOutput(0, hidden[:n - 1]))
    assert fresh.propose(3, ctx()).tokens == late.tokens


def test_mtp_prefix_limit_forces_the_target_to_re_evaluate(models):
    engine = load_engine(models["mtp"])
    a = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    # Plain decoding does not feed the head: a later MTP request must re-evaluate what it lacks.
    generate(engine, "different prompt", temperature=0, num_predict=5, drafter="none")
    b = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    assert b.tokens == a.tokens
    assert b.result.prompt_cached == 0  # the head held nothing for this prompt
    c = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    assert c.result.prompt_cached == c.result.prompt_eval_count - 1 and c.tokens == a.tokens


# ------------------------------------------------------------------------------------------------
# depth controllers
# ------------------------------------------------------------------------------------------------
def test_fixed_depth_is_the_cap():
    f = FixedDepth(n_min=2)
    assert f.choose(5) == 5 and f.choose(0) == 0


def drive(ctl: AdaptiveDepth, accept_prob: float, steps: int, cap: int = 8) -> list[int]:
    """Simulated rounds: each drafted position is accepted with ``accept_prob`` (deterministic)."""
    chosen = []
    for step in range(steps):
        k = ctl.choose(cap)
        chosen.append(k)
        a = 0
        while a < k and ((step * 7 + a * 13) % 100) < accept_prob * 100:
            a += 1
        ctl.observe(k, k, a, 0.0)
    return chosen


def test_adaptive_math_and_convergence():
    cost = lambda k, n: 1.0 + 0.1 * n  # noqa: E731
    good = AdaptiveDepth(cost_model=cost)
    chosen = drive(good, 1.0, 60)
    assert chosen[0] == 0 and good.best(8) == 8 and chosen[-1] == 8
    assert good.expected_committed(8) > 8.5
    bad = AdaptiveDepth(cost_model=cost)
    chosen = drive(bad, 0.0, 200)
    assert bad.best(8) == 0
    # Only exploration probes draft once settled: 1 step in explore_every.
    assert sum(1 for k in chosen[100:] if k > 0) <= 100 // bad.explore_every + 1
    # A middling drafter with an expensive verification settles in between.
    mid = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.4 * n)
    drive(mid, 0.7, 300)
    assert 1 <= mid.best(8) <= 4


def test_adaptive_is_deterministic_and_uses_measured_costs():
    runs = [drive(AdaptiveDepth(cost_model=lambda k, n: 1 + 0.2 * n), 0.6, 80) for _ in range(2)]
    assert runs[0] == runs[1]
    ctl = AdaptiveDepth()
    ctl.observe(0, 0, 0, 0.010)
    ctl.observe(4, 4, 4, 0.014)
    assert ctl.cost(0) == 0.010 and ctl.cost(4) == 0.014
    assert ctl.cost(2) == pytest.approx(0.012)  # interpolated between measured widths
    assert ctl.cost(6) == pytest.approx(0.016)  # extrapolated with the measured slope
    # Noise only adds time: one slow round does not move the estimate, a lasting change does.
    ctl.observe(4, 4, 4, 0.024)
    assert ctl.cost(4) == 0.014
    for _ in range(8):
        ctl.observe(4, 4, 4, 0.024)
    assert ctl.cost(4) == pytest.approx(0.024)
    assert AdaptiveDepth().choose(0) == 0


def test_adaptive_cost_is_verification_plus_drafting_by_length():
    """Every round teaches the drafter's cost, so depths never tried are priced from the ones tried."""
    ctl = AdaptiveDepth()
    ctl.observe(0, 0, 0, 0.150)  # a plain step: verification at width 1
    ctl.observe(2, 2, 2, 0.300, drafting=0.130)  # 65 ms per draft, 170 ms to verify 3 tokens
    # One length measured: drafting is priced per token from it.
    assert ctl.drafting_cost(2) == pytest.approx(0.130) and ctl.drafting_cost(1) == pytest.approx(0.065)
    assert ctl.cost(2) == pytest.approx(0.300)
    assert ctl.cost(1) == pytest.approx(0.160 + 0.065)  # verify(2) interpolated between widths 1 and 3
    assert ctl.cost(4) == pytest.approx(0.190 + 4 * 0.065)  # verify(5) extrapolated from widths 1 and 3
    # A round's first draft also catches up on the last round's tokens: with a second length measured
    # the fixed part is learned, and deeper drafts are priced at the marginal cost (40 ms), not at
    # the 65 ms average of the shallow rounds.
    ctl.observe(5, 5, 5, 0.450, drafting=0.250)
    assert ctl.drafting_cost(4) == pytest.approx(0.130 + 2 * 0.040)  # interpolated
    assert ctl.drafting_cost(8) == pytest.approx(0.250 + 3 * 0.040)  # extrapolated across 2..5
    assert ctl.drafting_cost(1) == pytest.approx(0.090)  # and below the measured range
    # A proposal shorter than asked (an n-gram miss) is priced at the width it verified.
    ctl.observe(4, 1, 1, 0.165, drafting=0.0)
    assert ctl.verify_cost(2) == pytest.approx(0.165)  # not the 160 ms interpolated before


def test_a_width_never_costs_more_than_a_wider_one():
    """A stale slow sample at one width (measured in a slow minute of a shared host) is pooled with the
    wider verification it exceeds: more tokens never verify faster (the rewrite's trace that showed it
    had 52 ms at 5 tokens beside 49 ms at 7). Pooled by their samples, so a width measured often is
    not pulled far by one odd sample of another."""
    ctl = AdaptiveDepth(explore_every=0)
    for width, ms in ((1, 28.0), (2, 31.0), (3, 33.0), (4, 37.0), (5, 52.0), (7, 49.0), (9, 67.0)):
        ctl.observe(width - 1, width - 1, width - 1, ms / 1e3)
    assert ctl.verify_cost(5) == pytest.approx(0.0505)  # pooled with width 7
    assert ctl.verify_cost(7) == pytest.approx(0.0505)
    assert ctl.verify_cost(6) == pytest.approx(0.0505)
    assert ctl.verify_cost(4) == pytest.approx(0.037)  # below them: as measured
    assert ctl.snapshot()["verify_ms"][5] == pytest.approx(50.5)
    for _ in range(3):  # width 1 measured four times, then one lucky sample at width 2
        ctl.observe(0, 0, 0, 0.028)
    ctl.observe(1, 1, 1, 0.020)
    assert ctl.verify_cost(1) == pytest.approx((4 * 0.028 + 2 * 0.020) / 6)  # min of width 2's two samples
    assert ctl.verify_cost(1) > 0.025  # not capped at the lucky 20 ms


def test_isotonic_pooling_of_violators():
    from engine.speculative.depth import _non_decreasing
    assert _non_decreasing([(1, 1.0, 1), (2, 3.0, 1), (3, 2.0, 1), (4, 5.0, 2)]) == {1: 1.0, 2: 2.5, 3: 2.5, 4: 5.0}
    assert _non_decreasing([(1, 4.0, 3), (2, 1.0, 1), (5, 0.0, 4)]) == {1: 1.625, 2: 1.625, 5: 1.625}  # (12 + 1 + 0) / 8
    assert _non_decreasing([]) == {}


def test_old_verification_samples_are_forgotten():
    """A width's samples count for ``max_age`` observations of the table; after that the width is
    priced from the widths measured since (interpolated), so a slow minute does not price it for good."""
    costs = WidthCosts(max_age=10)
    costs.add(1, 0.030)
    costs.add(3, 0.060)  # measured in a slow minute
    costs.add(5, 0.050)
    assert costs.estimate(3) == pytest.approx(0.055)  # pooled with width 5 meanwhile
    for _ in range(9):
        costs.add(1, 0.028)
        costs.add(5, 0.048)
    assert 3 not in costs.points()
    assert costs.estimate(3) == pytest.approx(0.028 + (0.048 - 0.028) / 2)  # from its neighbours now
    assert costs.count == 21
    # the controllers of one target share it (the runtime hands each the same table)
    a, b = AdaptiveDepth(verify_times=costs), AdaptiveDepth(verify_times=costs)
    a.observe(2, 2, 2, 0.040)
    assert b.verify_cost(3) == pytest.approx(0.040)


def test_adaptive_probes_often_until_acceptance_is_known():
    """A cold controller that settled on plain decoding after one unlucky round keeps probing at a
    quarter of the usual interval until position 0 has min_trials observations."""
    ctl = AdaptiveDepth()
    ctl.observe(0, 0, 0, 0.100)
    ctl.observe(8, 8, 0, 0.700, drafting=0.400)  # one deep round, nothing accepted
    chosen = []
    for _ in range(32):
        k = ctl.choose(8)
        chosen.append(k)
        ctl.observe(k, k, min(k, 1), 0.100 + 0.060 * k, drafting=0.050 * k)  # one draft in k accepted
    probes = [i for i, k in enumerate(chosen) if k > 0]
    assert len(probes) >= 4 and probes[0] < ctl.explore_every // 4 + 1
    assert ctl._trials_at(0) >= ctl.min_trials


def test_a_request_starts_shallow_and_doubles_its_depth_while_rounds_are_accepted_whole():
    """What earlier texts taught is only a prior: a request drafts 2 deep until a round is accepted whole, and
    each such round doubles the limit. A prose request after a rewrite otherwise drafted its first rounds at
    the rewrite's depth and lost most of each."""
    cost = lambda k, n: 1.0 + 0.3 * n  # noqa: E731
    ctl = AdaptiveDepth(cost_model=cost)
    drive(ctl, 1.0, 80)
    ctl.begin_request()
    depths = []
    for accepted_whole in (True, False, True, True, True):
        k = ctl.choose(8)
        depths.append(k)
        ctl.observe(k, k, k if accepted_whole else k - 1, 0.0)
    assert depths == [2, 4, 4, 8, 8]


def test_adaptive_carries_acceptance_into_a_request_as_a_prior():
    """A request starts from what earlier ones learned (a perfect drafter: deep from the first round)
    but its own rounds outweigh that within a few observations, not the ~20 of the decayed counts."""
    cost = lambda k, n: 1.0 + 0.3 * n  # noqa: E731
    ctl = AdaptiveDepth(cost_model=cost, start_depth=8)  # no slow start (its own test below)
    drive(ctl, 1.0, 80)
    assert ctl.best(8) == 8
    ctl.begin_request()
    assert ctl.choose(8) == 8  # carried over
    ctl.observe(8, 8, 0, 0.0)  # ... but this text rejects everything
    chosen = []
    for _ in range(6):
        k = ctl.choose(8)
        chosen.append(k)
        ctl.observe(k, k, 0, 0.0)
    assert ctl.best(8) == 0, chosen  # (it may still probe: in step, one deviation up is worth a trial)
    # Without the request boundary the same rounds leave the old text's evidence in charge.
    stale = AdaptiveDepth(cost_model=cost)
    drive(stale, 1.0, 80)
    stale.observe(8, 8, 0, 0.0)
    for _ in range(6):
        k = stale.choose(8)
        stale.observe(k, k, 0, 0.0)
    assert stale.best(8) > 0
    # Settled on plain decoding, a new request still drafts one token a step until position 0 has
    # min_trials of its own trials, back to back (the drafter has just read the prompt and stays in
    # step, so these probes cost no catch-up); then plain again.
    ctl.begin_request()
    assert ctl.best(8) == 0
    chosen = []
    for _ in range(12):
        k = ctl.choose(8)
        chosen.append(k)
        ctl.observe(k, k, 0, 0.0)
    assert chosen[:5] == [1] * 5 and ctl._trials_at(0) >= ctl.min_trials
    assert chosen[5:].count(0) >= 6, chosen  # plain, but for at most one probe of the usual interval


def settled_on_plain(catchup_per_token: float | None) -> AdaptiveDepth:
    """A controller that learned a useless drafter (settled on plain decoding), with a catch-up cost per
    token measured (None: never), at the start of a new request."""
    ctl = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.4 * n)
    drive(ctl, 0.0, 200)
    if catchup_per_token is not None:
        ctl.observe_catchup(20, 20 * catchup_per_token)
    ctl.begin_request()
    return ctl


def test_adaptive_probes_back_to_back_only_while_the_drafter_is_in_step():
    """The back-to-back probes of a request's start stop at its first plain steps when the drafter has
    to catch up on them (a draft model): a probe then pays for that, and those keep their interval. A
    drafter that never caught up (an n-gram, an MTP head) goes on probing back to back."""
    def after_plain_steps(catchup_per_token: float | None) -> list[int]:
        ctl = settled_on_plain(catchup_per_token)
        assert ctl.choose(8) == 1
        ctl.observe(1, 1, 0, 0.0)
        ctl.observe(0, 0, 0, 0.0)  # the loop took plain steps (the last tokens of num_predict, say)
        ctl.observe(0, 0, 0, 0.0)
        assert ctl._trials_at(0) < ctl.min_trials
        return [ctl.choose(8) for _ in range(3)]

    assert after_plain_steps(0.15).count(0) >= 2
    assert after_plain_steps(None) == [1, 1, 1]


def test_adaptive_keeps_probing_in_step_while_its_evidence_cannot_rule_drafting_out():
    """A request whose first drafts were accepted 4 times in 6 on a text the drafter then always gets
    right: settling on plain as soon as min_trials is reached left it plain for good (the catch-up made
    later probes too dear); in step with the drafter it probes on while its acceptance one standard
    deviation up would make drafting pay, and so finds that it does."""
    def drafted_steps(sync_trials: float) -> int:
        ctl = AdaptiveDepth(cost_model=lambda k, n: 0.100 + 0.060 * n, explore_every=0, sync_trials=sync_trials)
        ctl.observe_catchup(20, 20 * 0.015)  # catching up costs 15 % of a plain step a token
        ctl.begin_request()
        early = iter([1, 0, 1, 1, 0, 1])
        drafted = 0
        for step in range(60):
            k = ctl.choose(1)
            accepted = min(k, next(early, 1)) if k else 0
            ctl.observe(k, k, accepted, 0.0)
            drafted += step >= 20 and k > 0
        return drafted

    assert drafted_steps(0.0) == 0  # settled on plain after its own min_trials
    assert drafted_steps(12.0) == 40


def test_adaptive_scales_the_carried_prior_by_the_requests_first_position():
    """After a text that accepted every draft, a request whose text rejects its first drafts expects
    the later positions to fail more often too, not at the old text's rate."""
    ctl = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.3 * n)
    drive(ctl, 1.0, 80)
    ctl.begin_request()
    carried = ctl.acceptances(4)
    assert min(carried) > 0.95
    ctl.observe(4, 4, 0, 0.0)
    ctl.observe(4, 4, 0, 0.0)
    a = ctl.acceptances(4)
    assert a[0] == pytest.approx(carried[0] * 2 / 3.95, rel=0.02)  # its own two rejections beside two carried trials
    for j in (1, 2, 3):  # not observed this request: the carried mean, scaled as position 0 was
        assert a[j] == pytest.approx(min(1.0, carried[j] * a[0] / carried[0]))
    # A text better than the last one raises them, to at most 1.
    low = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.3 * n)
    drive(low, 0.5, 200)
    low.begin_request()
    before = low.acceptances(3)
    for _ in range(3):
        low.observe(1, 1, 1, 0.0)
    after = low.acceptances(3)
    assert after[0] > before[0] and all(after[j] > before[j] for j in (1, 2)) and max(after) <= 1.0


def test_adaptive_goes_back_to_drafting_only_when_it_pays_for_the_catch_up():
    """Settled on plain decoding with drafting a little better on paper (slow plain steps on a shared
    host), the controller drafts again only if what drafting saves over switch_horizon tokens pays for
    catching the drafter up on every plain step since it last ran."""
    def controller(behind: int, catchup_per_token: float | None) -> AdaptiveDepth:
        ctl = AdaptiveDepth(explore_every=0)
        for i in range(40):  # depth 1: verify 0.110 s + drafting 0.050 s, 4 drafts in 5 accepted
            ctl.observe(1, 1, 0 if i % 5 == 0 else 1, 0.160, drafting=0.050)
        if catchup_per_token is not None:
            ctl.observe_catchup(20, 20 * catchup_per_token)
        for _ in range(behind):
            ctl.observe(0, 0, 0, 0.100)  # plain: 10 tokens/s against 11.2 drafting
        assert ctl.best(1) == 1
        return ctl

    # saves (1/10 - 1/11.2) s a token, 0.34 s over 32 tokens; catching up costs 15 ms a token
    assert controller(30, 0.015).choose(1) == 0  # 0.45 s to catch up: stay plain
    assert controller(10, 0.015).choose(1) == 1  # 0.15 s: draft
    assert controller(30, None).choose(1) == 1  # never measured: optimistic


def test_adaptive_drafts_only_when_it_beats_plain_by_the_margin():
    def settled(accept: float, margin: float = 0.05) -> int:
        ctl = AdaptiveDepth(explore_every=0, plain_margin=margin)
        ctl.observe(0, 0, 0, 0.100)  # plain: 10 tokens/s
        for _ in range(200):  # depth 1 at 0.150 s: (1 + accept) / 0.150 tokens/s
            ctl.observe(1, 1, 1 if ctl.acceptance(0) < accept else 0, 0.150, drafting=0.050)
        return ctl.best(1)

    assert settled(0.55) == 0  # 10.3 tokens/s promised: 3% more than plain, under the margin
    assert settled(0.55, margin=0.0) == 1  # (what the margin decides)
    assert settled(0.70) == 1  # 11.3 tokens/s: worth drafting


def test_adaptive_backs_off_probing_while_plain_stays_best():
    """A useless drafter: after each probe that leaves plain decoding best the next comes twice as late
    (16, 32, 64, then every 128 steps), and a new request starts over at the base interval."""
    ctl = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.4 * n)
    chosen = drive(ctl, 0.0, 600)
    probes = [i + 1 for i, k in enumerate(chosen) if k > 0][-4:]  # steps (1-based) that drafted
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == [128, 128, 128], probes
    ctl.begin_request()
    assert ctl.choose(8) == 1  # the request's first step probes
    first = next(i for i in range(1, 200) if ctl.choose(8) > 0)
    assert first <= ctl.explore_every


def test_adaptive_stops_probing_mid_request_when_catching_up_is_dear():
    """Settled on plain decoding, a probe mid-request first forwards the drafter over every token it
    missed. With a catch-up at 15 % of a plain step per token a request probes only until it has its
    own evidence (a few probes, early, each catching up a few tokens); at 1 % the back-off's probes go
    on; unmeasured, they go on too."""
    def probes(catchup_per_token: float | None) -> list[int]:
        ctl = settled_on_plain(catchup_per_token)
        return [i for i, k in enumerate(drive(ctl, 0.0, 400)) if k > 0]

    dear = probes(0.15)
    assert dear[0] == 0 and len(dear) <= 5 and dear[-1] < 24, dear
    for cheap in (probes(0.01), probes(None)):
        assert cheap[0] == 0 and len(cheap) >= len(dear) + 3 and cheap[-1] > 200, cheap


def test_adaptive_finds_a_good_text_after_a_useless_one_even_when_catching_up_is_dear():
    """After a text that rejected every draft, a request whose text accepts them all still drafts
    within its first steps: its early probes (few tokens to catch up each) are not skipped."""
    ctl = AdaptiveDepth(cost_model=lambda k, n: 1.0 + 0.45 * n)  # one success is not enough evidence
    drive(ctl, 0.0, 200)
    ctl.observe_catchup(20, 20 * 0.15)
    ctl.begin_request()
    chosen = drive(ctl, 1.0, 60)
    assert ctl.best(8) > 0 and sum(k > 0 for k in chosen[-30:]) >= 28, chosen


def test_adaptive_remeasures_plain_steps():
    """Settled on drafting, the controller still re-measures plain decoding now and then: a first plain
    step measured 6x too slow (a cold start) must not make a mediocre drafter look good for ever."""
    real = {0: 0.150, 1: 0.320, 2: 0.390}  # drafting 70 ms a token; verifying 2 or 3 tokens 250 ms
    ctl = AdaptiveDepth()
    ctl.observe(0, 0, 0, 6 * real[0])
    chosen = []
    for step in range(300):
        k = min(ctl.choose(2), 2)
        chosen.append(k)
        a = 0
        while a < k and ((step * 7 + a * 13) % 100) < 70:  # 70% accepted: plain is still best
            a += 1
        ctl.observe(k, k, a, real[k], drafting=0.070 * k)
    assert ctl.verify_cost(1) == pytest.approx(real[0])
    assert chosen[-50:].count(0) >= 45


def test_adaptive_recovers_from_a_slow_first_round():
    """A cold first round at a depth (measured here as 6x its real cost) must not keep the controller
    from that depth for good: the moving average of the old controller did exactly that."""
    real = {0: 0.150, 1: 0.230, 2: 0.300}
    ctl = AdaptiveDepth()
    ctl.observe(0, 0, 0, real[0])
    ctl.observe(2, 2, 2, 6 * real[2], drafting=0.130)
    chosen = []
    for step in range(200):
        k = min(ctl.choose(2), 2)
        chosen.append(k)
        ctl.observe(k, k, k, real[k], drafting=0.065 * k)  # a perfect drafter
    assert chosen[-20:].count(2) >= 18


def test_a_source_with_its_own_cap_is_chosen_within_it():
    """PerSourceDepth.caps: a source capped below the request's cap drafts within its own, the others to the
    request's (model+suffix: the model's rounds at 4, the earlier outputs' at 16)."""
    from engine.speculative.depth import PerSourceDepth

    def perfect(depth, n_drafted):  # every width costs the same: the deepest round pays most
        return 0.01

    source = ["model"]
    controllers = {name: AdaptiveDepth(cost_model=perfect) for name in ("model", "suffix")}
    for ctl in controllers.values():
        ctl.verify_times.add(1, 0.01)
    depth = PerSourceDepth(controllers, lambda: source[0], caps={"model": 4})
    for name in ("model", "suffix"):
        source[0] = name
        depth.begin_request()
        chosen = []
        for _ in range(12):
            k = depth.choose(16)
            depth.observe(k, k, k, 0.01)
            chosen.append(k)
        assert max(chosen) == (4 if name == "model" else 16), (name, chosen)
