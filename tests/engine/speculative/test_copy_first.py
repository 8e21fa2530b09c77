"""``draft_copy``: rounds where the output copies its context draft the copy; the others ask the draft model.
Lossless (greedy output unchanged, sampled output keeps the target's distribution), the copy takes the rounds
of a rewrite, and free text still goes to the model."""

from __future__ import annotations

import pytest

import tests.engine.speculative.test_speculation as ts
from engine.speculative.depth import AdaptiveDepth, PerSourceDepth
from tests.engine.speculative.test_speculation import GREEDY, chi_square_pvalue, exact_first_tokens, fake_cost, \
    generate, load_engine, make_dist_engine, spec_opts, write_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("copy")
    return {"target": write_model(d, "target", 0), "self": write_model(d, "self", 0),
            "random": write_model(d, "random", 3), "bigram": write_model(d, "bigram", 1, bigram=True)}


def test_a_repeating_text_is_drafted_by_the_copy_and_output_is_unchanged(models):
    """The bigram target's greedy text cycles; an unrelated draft model guesses it badly, the copy well."""
    engine = load_engine(models["bigram"], models["random"])
    plain = generate(engine, **GREEDY, drafter="none")
    model = generate(engine, **GREEDY, **spec_opts("model", 4))
    copy = generate(engine, **GREEDY, **spec_opts("model", 4, draft_copy=True))
    assert copy.tokens == model.tokens == plain.tokens
    assert copy.spec.drafter == "model+copy"
    assert copy.spec.draft_n_accepted > 2 * max(model.spec.draft_n_accepted, 5)
    assert copy.spec.target_forwards < model.spec.target_forwards


def test_free_text_still_goes_to_the_model(models):
    """Where nothing is being copied the model drafts: with a perfect drafter, as many accepted as without."""
    self_engine = load_engine(models["target"], models["self"])
    model = generate(self_engine, **GREEDY, **spec_opts("model", 4))
    copy = generate(self_engine, **GREEDY, **spec_opts("model", 4, draft_copy=True))
    assert copy.tokens == model.tokens
    assert copy.spec.acceptance_rate >= 0.9 * model.spec.acceptance_rate


def test_sampling_keeps_the_target_distribution(tmp_path):
    """With test_speculation's perturbed drafter, sampled output keeps the target's distribution whether a
    round was drafted by the copy or by the model."""
    dist_engine = make_dist_engine(tmp_path)
    opts = {**ts.DIST_OPTS, "draft_copy": True}
    exact = exact_first_tokens(dist_engine, ts.DIST_PROMPT, opts, 3)
    pvalue, acceptance = chi_square_pvalue(dist_engine, exact, ts.DIST_RUNS, opts)
    assert 0.05 < acceptance < 0.95 and pvalue > 1e-3


def free_drafting(depth: int, n_drafted: int) -> float:
    """A copy: drafting costs nothing, and (as in fake_cost) verification width is free."""
    return 1.0


def test_each_source_is_priced_on_its_own():
    """Copy rounds that are always accepted and model rounds that never are, interleaved: each source's
    controller learns its own depth, where a single estimate over both would settle in between."""
    copy, model = AdaptiveDepth(cost_model=free_drafting), AdaptiveDepth(cost_model=fake_cost)
    turns = iter(["copy", "model"] * 60)
    ctl = PerSourceDepth({"copy": copy, "model": model}, lambda: next(turns))
    ctl.begin_request()
    for _ in range(60):
        k = ctl.choose(8)
        ctl.observe(k, k, k, 0.0)
        k = ctl.choose(8)
        ctl.observe(k, k, 0, 0.0)
    assert copy.best(8) == 8 and model.best(8) == 0
    assert copy.step == model.step == 60  # every observation went to the controller that chose


def test_copy_rounds_leave_the_model_behind_by_what_they_committed():
    """The draft model does not read the tokens a copy round commits until its next proposal: its
    controller counts them as it counts plain steps, so that a slightly better model round on paper does
    not buy a long catch-up after a copied stretch."""
    copy, model = AdaptiveDepth(cost_model=free_drafting), AdaptiveDepth(explore_every=0)
    for i in range(40):  # the model: depth 1 at 0.160 s (0.050 drafting), 4 drafts in 5 accepted
        model.observe(1, 1, 0 if i % 5 == 0 else 1, 0.160, drafting=0.050)
    model.observe(0, 0, 0, 0.100)  # plain: 10 tokens/s against 11.2 drafting
    model.observe_catchup(20, 20 * 0.015)  # catching up: 15 ms a token
    turns = iter(["copy"] * 4 + ["model"])
    ctl = PerSourceDepth({"copy": copy, "model": model}, lambda: next(turns))
    for _ in range(4):  # four copy rounds of 8 drafts, all accepted: 36 tokens the model has not read
        k = ctl.choose(8)
        ctl.observe(k, k, k, 0.0)
    assert model.best(1) == 1 and copy._behind == 0
    assert ctl.choose(1) == 0  # 0.54 s to catch up against 0.34 s saved over 32 tokens: plain


def test_adaptive_drafts_copy_rounds_deep_and_keeps_model_rounds_shallow(models):

    """Bigram target, unrelated draft model: once the text cycles, the copy's rounds reach the cap
    while the useless model's estimate stays shallow; the output is plain decoding's."""
    engine = load_engine(models["bigram"], models["random"])
    plain = generate(engine, **GREEDY, drafter="none")
    copy_ctl = engine.controllers["model+copy/copy"] = AdaptiveDepth(cost_model=free_drafting)
    model_ctl = engine.controllers["model+copy/model"] = AdaptiveDepth(cost_model=fake_cost)
    run = generate(engine, temperature=0, num_predict=120, **spec_opts("model", 8, "adaptive", draft_copy=True))
    assert run.tokens[:len(plain.tokens)] == plain.tokens
    assert copy_ctl.step > 0 and model_ctl.step > 0  # both sources drafted rounds
    assert copy_ctl.best(8) == 8 and model_ctl.best(8) <= 1
    # the rounds it drafted went deep (a request starts at depth 2 and doubles: AdaptiveDepth.start_depth)
    assert run.spec.draft_n >= 4 * run.spec.draft_rounds


def test_ngram_adaptive_prices_certain_copies_apart_from_lookups(models):
    """drafter=ngram with the adaptive schedule: the cycling text's certain-copy rounds get their own
    controller and reach the cap while the lookup rounds' stays as shallow as its failures make it (one
    controller for both took the lookups' acceptance into the copy rounds); the output is plain decoding's."""
    engine = load_engine(models["bigram"], models["random"])
    plain = generate(engine, **GREEDY, drafter="none")
    copy_ctl = engine.controllers["ngram/copy"] = AdaptiveDepth(cost_model=free_drafting)
    lookup_ctl = engine.controllers["ngram/lookup"] = AdaptiveDepth(cost_model=fake_cost)
    run = generate(engine, temperature=0, num_predict=120, **spec_opts("ngram", 8, "adaptive"))
    assert run.tokens[:len(plain.tokens)] == plain.tokens
    assert run.spec.drafter == "ngram"
    assert copy_ctl.step > 0 and lookup_ctl.step > 0  # the request had rounds of both kinds
    assert copy_ctl.best(8) == 8
    assert run.spec.draft_n >= 5 * run.spec.draft_rounds


def test_the_controllers_of_a_target_share_its_verification_costs(models):
    """What verifying each width costs belongs to the target: a source that has not drafted yet (a rewrite's
    certain copy) prices its first round from the widths the model's rounds measured, and drafts it, where a
    table of its own would have nothing and take a plain step to start one."""
    engine = load_engine(models["target"], models["self"])
    generate(engine, **GREEDY, **spec_opts("model", 4, "adaptive"))
    model = engine.controllers["model"]
    ctl = engine.controller(engine.drafters["ngram"], "adaptive", 0)
    copy = ctl.controllers["copy"]
    assert copy.step == 0 and model.step > 0
    for width in (1, 2, 3):
        assert copy.verify_cost(width) == model.verify_cost(width) is not None
    copy.begin_request()
    assert copy.choose(4) >= 1


def test_a_source_that_never_drafted_reports_an_empty_state():
    """On text with nothing to copy the copy's controller never observes a round; the benchmark's and
    the logs' snapshot of it is empty, not an error."""
    assert AdaptiveDepth().snapshot() == {"step": 0, "acceptance": [], "verify_ms": {}, "drafting_ms": {},
                                          "cost_ms": {}}


@pytest.mark.parametrize("weak_accepts, expect_weak", [(True, True), (False, False)])
def test_a_weak_copy_competes_with_the_model(weak_accepts, expect_weak):
    """Rounds where the copy's evidence is weak: once this request has tried the weak copy, each goes to
    whichever source the controllers expect more tokens a second from. A weak copy that is always right
    (a rewrite) keeps its rounds, free of drafting; one that is always wrong (code) hands them to a model
    that is mostly right."""
    weak, model = AdaptiveDepth(cost_model=free_drafting), AdaptiveDepth(cost_model=fake_cost)
    used: list[str] = []
    steps = iter(range(1000))
    # every fourth round the copy has no evidence at all: those go to the model whatever it is worth
    ctl = PerSourceDepth({"copy-weak": weak, "model": model},
                         lambda: "model" if next(steps) % 4 == 3 else "copy-weak", {"copy-weak": "model"}, used.append)
    ctl.begin_request()
    picks = []
    for step in range(80):
        k = ctl.choose(4)
        picks.append(ctl._current)
        accepted = k if (ctl._current == "model" and step % 10) or (ctl._current == "copy-weak" and weak_accepts) \
            else 0
        ctl.observe(k, k, accepted, 0.0)
    late = picks[-40:]
    if expect_weak:
        assert late.count("copy-weak") == 30 and not used
    else:
        assert late.count("model") >= 38 and used and set(used) == {"model"}
    assert picks[0] == "copy-weak"  # tried first: it costs no drafting


def test_the_requests_try_of_a_weak_copy_drafts_one_token():
    """The one try a request gives a competing source is a probe: a weak copy that earlier texts taught to
    run deep (a rewrite) still drafts a single token in a new request's first weak round, then what it learns
    decides."""
    weak, model = AdaptiveDepth(cost_model=free_drafting), AdaptiveDepth(cost_model=fake_cost)
    ctl = PerSourceDepth({"copy-weak": weak, "model": model}, lambda: "copy-weak", {"copy-weak": "model"})
    ctl.begin_request()
    for _ in range(40):  # a rewrite: every weak copy accepted
        k = ctl.choose(4)
        ctl.observe(k, k, k, 0.0)
    assert weak.best(4) >= 3
    ctl.begin_request()
    assert ctl.choose(4) == 1
    ctl.observe(1, 1, 1, 0.0)
    assert ctl.choose(4) >= 2  # tried: its own evidence and the carried prior decide the depth again


def test_the_model_taking_a_weak_copys_round_drafts_at_its_own_depth():
    """Only the competing source's try is held to one draft: when a tried weak copy hands its round to the
    model, the model drafts as deep as it has learned to, even in its first round of the request."""
    weak, model = AdaptiveDepth(cost_model=free_drafting), AdaptiveDepth(cost_model=fake_cost)
    turns = iter(["model"] * 40 + ["copy-weak"] * 40)
    ctl = PerSourceDepth({"copy-weak": weak, "model": model}, lambda: next(turns), {"copy-weak": "model"})
    ctl.begin_request()
    for _ in range(40):  # the model: always right; then the weak copy: always wrong
        k = ctl.choose(4)
        ctl.observe(k, k, k if ctl._current == "model" else 0, 0.0)
    assert model.best(4) >= 2
    for _ in range(40):
        k = ctl.choose(4)
        ctl.observe(k, k, 0, 0.0)
    turns = iter(["copy-weak"] * 3)
    ctl.source = lambda: next(turns)
    ctl.begin_request()
    assert ctl.choose(4) == 1 and ctl._current == "copy-weak"  # its try this request
    ctl.observe(1, 1, 0, 0.0)
    assert ctl.choose(4) >= 2 and ctl._current == "model"  # the model's first round: not a probe
