"""Suffix drafting (engine.speculative.suffix, suffix_cache; issue 50): drafts from what the model wrote in earlier
requests. The store's counts, bound and eviction as units; through the engine: greedy output unchanged on
several architectures and under batching, the target's distribution at temperature > 0, a retried question
drafted from its earlier answer, nothing kept from a cancelled request, one model's outputs never drafting for
another, and nothing surviving a reload."""

from __future__ import annotations

import threading

import pytest
import torch

import tests.hf_tiny_qwen35 as hf_tiny_qwen35
from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest, LoadSpec
from engine.contract.speculation_plan import SUFFIX_DEFAULT_CAP, plan_speculation
from engine.runtime import ModelRuntime
from engine.sampling.sampler import SamplingOptions, make_generator
from engine.speculative.drafter import DraftContext
from engine.speculative.ngram import NgramDrafter
from engine.speculative.suffix import SuffixDrafter
from engine.speculative.suffix_cache import SuffixCache
from tests.engine.speculative import test_speculation as ts
from tests.engine.speculative.test_speculation import generate, write_model


def ctx() -> DraftContext:
    return DraftContext(SamplingOptions(temperature=0), make_generator(0, stream=1))


# ------------------------------------------------------------------------------------------------
# the store
# ------------------------------------------------------------------------------------------------
def test_a_retried_prompt_finds_its_earlier_output():
    cache = SuffixCache()
    prompt, output = [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14]
    cache.add(prompt, output)
    found = cache.match([9, 9] + prompt, 8)
    assert found.tokens == output and found.probabilities == [1.0] * 5
    assert found.length == len(prompt) and found.support == 1
    # part-way through the answer, the rest of it
    assert cache.match(prompt + output[:2], 8).tokens == output[2:]
    assert cache.match([7, 8, 9], 8) is None  # its last tokens were never written


def test_the_most_frequent_continuation_and_its_share():
    cache = SuffixCache(min_probability=0.5)
    for tail in ([20, 21], [20, 21], [30, 31]):
        cache.add([1, 2, 3], [4, 5] + tail)
    found = cache.match([1, 2, 3, 4, 5], 4)
    # all three earlier answers continue (1, 2, 3, 4, 5); their next tokens split 2:1
    assert found.tokens == [20, 21] and found.probabilities == pytest.approx([2 / 3, 2 / 3])
    assert found.support == 3
    strict = SuffixCache(min_probability=0.7)
    for tail in ([20, 21], [20, 21], [30, 31]):
        strict.add([1, 2, 3], [4, 5] + tail)
    assert strict.match([1, 2, 3, 4, 5], 4).tokens == []  # 2/3 is under its bar


def test_a_short_match_drafts_no_more_than_its_length():
    """alpha x the match length (the paper's max_spec_factor): a 3-token coincidence earns 3 drafts."""
    cache = SuffixCache(prompt_tail=0)
    cache.add([], [5, 6, 7, 8, 9, 10, 11, 12])
    assert cache.match([1, 5, 6, 7], 16).tokens == [8, 9, 10]
    assert cache.match([5, 6, 7, 8, 9], 16).length == 5
    assert cache.match([5, 6, 7, 8, 9], 16).tokens == [10, 11, 12]  # the document ends there


def test_the_longest_match_decides_and_documents_do_not_run_into_each_other():
    cache = SuffixCache(prompt_tail=0)
    cache.add([], [1, 2, 3, 40])
    cache.add([], [9, 2, 3, 50, 51])
    assert cache.match([9, 2, 3], 4).tokens == [50, 51]  # (9, 2, 3) beats the more common (2, 3)
    assert cache.match([7, 1, 2, 3], 4).tokens == [40]  # and nothing after the document's end


def test_memory_is_bounded_and_the_oldest_outputs_go_first():
    cache = SuffixCache(max_tokens=1000, prompt_tail=0)
    for i in range(400):
        cache.add([], [1000 + i] + [i % 7 + 10 * j for j in range(49)])
    assert cache.tokens <= 1000 and cache.documents == 20
    assert cache.match([1000 + 399], 2) is None  # a 1-token context is below the key length
    assert cache.match([1000 + 399, 399 % 7, 399 % 7 + 10], 2).tokens == [399 % 7 + 20, 399 % 7 + 30]
    assert cache.match([1000 + 0, 0, 10], 2) is None  # the first output was dropped
    # stale index entries are rebuilt away: what the store holds stays proportional to what it keeps
    assert cache.memory_bytes() < 1000 * 400
    before = cache.memory_bytes()
    for i in range(400, 800):
        cache.add([], [1000 + i] + [i % 7 + 10 * j for j in range(49)])
    assert cache.memory_bytes() < 2 * before
    cache.clear()
    assert cache.tokens == 0 and cache.match([1799, 799 % 7, 799 % 7 + 10], 2) is None


def test_a_zero_bound_keeps_nothing():
    cache = SuffixCache(max_tokens=0)
    cache.add([1, 2, 3], [4, 5, 6])
    assert cache.tokens == 0 and cache.match([1, 2, 3], 4) is None


def test_concurrent_writers_and_readers():
    cache = SuffixCache(max_tokens=5000)
    errors = []

    def write(seed):
        try:
            for i in range(200):
                cache.add([seed, i, 1], [(seed * 7 + i + j) % 50 for j in range(30)])
                cache.match([seed, i, 1, (seed * 7 + i) % 50], 8)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and cache.tokens <= 5000


# ------------------------------------------------------------------------------------------------
# the drafter's sources
# ------------------------------------------------------------------------------------------------
def test_each_round_names_its_source():
    outputs = SuffixCache(prompt_tail=0)
    outputs.add([], list(range(100, 130)))
    d = SuffixDrafter(outputs, NgramDrafter())
    d.begin([1, 2, 3, 4, 5])  # matches nothing anywhere
    assert d.round_source() == "lookup" and d.propose(4, ctx()).tokens == []
    d.begin([7, 101, 102, 103])  # a 3-token match of an earlier output
    assert d.round_source() == "suffix-short" and d.propose(8, ctx()).tokens == [104, 105, 106]
    d.begin(list(range(100, 112)))  # a long one (12 tokens): as many drafts as it is long, up to the depth
    assert d.round_source() == "suffix" and d.propose(16, ctx()).tokens == list(range(112, 124))
    own = list(range(200, 220))
    d.begin(own + [1] + own[:10])  # the output is rewriting its own prompt: the context copy is cheapest
    assert d.round_source() == "copy" and d.propose(4, ctx()).tokens == own[10:14]
    d.commit([own[10]], 32)
    assert d.tokens[-1] == own[10] and d.context.tokens == d.tokens


# ------------------------------------------------------------------------------------------------
# through the engine
# ------------------------------------------------------------------------------------------------
def test_the_plan_drafts_suffixes_by_default_without_a_draft():
    plan = plan_speculation(Options(), has_draft_layer=False, has_mtp_head=False)
    assert (plan.drafter, plan.cap) == ("suffix", SUFFIX_DEFAULT_CAP)
    assert plan.as_options()["draft_suffix"] is True
    explicit = plan_speculation(Options.from_map({"draft_num_predict": 6}), has_draft_layer=False,
                                has_mtp_head=False)
    assert (explicit.drafter, explicit.cap) == ("suffix", 6)
    off = Options.merged({"draft_suffix": False}, None)  # a PARAMETER draft_suffix false
    assert plan_speculation(off, has_draft_layer=False, has_mtp_head=False).drafter == "none"
    with_draft = plan_speculation(Options(), has_draft_layer=True, has_mtp_head=False)
    assert (with_draft.drafter, with_draft.copy, with_draft.suffix) == ("model", True, True)
    assert not plan_speculation(off, has_draft_layer=True, has_mtp_head=False).suffix
    # an engine without the drafter (vLLM) plans what it had before
    assert plan_speculation(Options(), has_draft_layer=False, has_mtp_head=False,
                            suffix_drafting=False).drafter == "none"
    forced = Options.from_map({"drafter": "suffix", "draft_suffix": False})
    assert plan_speculation(forced, has_draft_layer=False, has_mtp_head=False).drafter == "suffix"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("suffix")
    return {
        "llama": write_model(d, "llama", 0),
        "draft": write_model(d, "draft", 3),
        "gemma": write_model(d, "gemma", 2, arch="gemma3", n_layer=3,
                             extra_metadata={"gemma3.attention.sliding_window_pattern": 2,
                                             "gemma3.attention.sliding_window": 4}),
        "qwen35": hf_tiny_qwen35.make_pair(d, n_layer=4).path,
    }


def load(path, draft=None, **spec) -> ModelRuntime:
    return ModelRuntime.load(LoadSpec(model_path=str(path), draft_path=str(draft) if draft else None,
                                      num_ctx=spec.pop("num_ctx", 160), weight_format="f32",
                                      draft_weight_format="f32", **spec))


GREEDY = dict(temperature=0, num_predict=48)
# Counts of drafted tokens are asserted at a fixed depth (the suffix drafter's default cap, 16): the adaptive
# depth follows measured times, and a test must not depend on what they choose.
FIXED = dict(GREEDY, draft_schedule="fixed")
PROMPTS = [ts.PROMPT, "Once upon a time", "import os\nimport"]


@pytest.mark.parametrize("arch", ["llama", "gemma", "qwen35"])
def test_greedy_output_is_plain_output_and_a_retry_is_drafted_from_the_first(tiny, arch):
    eng = load(tiny[arch])
    plain = [generate(eng, p, **GREEDY, drafter="none", draft_suffix=False).tokens for p in PROMPTS]
    eng.outputs.clear()
    first = [generate(eng, p, **GREEDY) for p in PROMPTS]  # no options: the suffix drafter
    assert [r.tokens for r in first] == plain
    assert {r.spec.drafter for r in first} == {"suffix"}
    again = [generate(eng, p, **FIXED) for p in PROMPTS]
    assert [r.tokens for r in again] == plain
    for run in again:  # the earlier answer, drafted and accepted whole
        assert run.spec.draft_n_accepted == run.spec.draft_n > 0
        assert run.spec.target_forwards < len(run.tokens) / 3


def test_with_a_draft_model_the_outputs_join_its_copy_rounds(tiny):
    eng = load(tiny["llama"], tiny["draft"])
    plain = generate(eng, ts.PROMPT, **GREEDY, drafter="none").tokens
    first = generate(eng, ts.PROMPT, **GREEDY)
    again = generate(eng, ts.PROMPT, **GREEDY)
    assert first.tokens == again.tokens == plain
    assert again.spec.drafter == "model+suffix"
    suffix_rounds = eng.controllers["model+suffix/suffix"]  # the controller of the rounds the outputs drafted
    assert suffix_rounds.step > 0
    assert generate(eng, ts.PROMPT, **GREEDY, draft_suffix=False).spec.drafter == "model+copy"

    # under the adaptive schedule the outputs' rounds may go to the suffix drafter's cap, the model's and the
    # copy's stay at the request's
    plan = eng.plan(GenerateRequest(prompt=ts.PROMPT, options=Options()))
    assert (plan.cap, plan.suffix_cap) == (4, SUFFIX_DEFAULT_CAP)
    drafter, cap = eng.resolve_drafter(plan)
    assert cap == SUFFIX_DEFAULT_CAP and drafter.source_caps == {"copy": 4, "copy-weak": 4, "model": 4}
    controller = eng.controller(drafter, plan.schedule, plan.n_min)
    assert controller.caps == drafter.source_caps
    for options in ({"draft_schedule": "fixed"}, {"draft_num_predict": 6}):  # a fixed depth, an explicit cap
        plan = eng.plan(GenerateRequest(prompt=ts.PROMPT, options=Options.from_map(options)))
        drafter, cap = eng.resolve_drafter(plan)
        assert cap == plan.cap == plan.suffix_cap and drafter.source_caps == {}


def test_concurrent_requests_get_what_they_get_alone(tiny):
    """Four sequences at once, each a retry of a prompt another slot answered: every one the tokens it gets
    alone, drafted from the shared store."""
    eng = load(tiny["llama"], num_parallel=4)
    alone = [generate(eng, p, **GREEDY, drafter="none").tokens for p in PROMPTS + ["the cat"]]
    results: dict[int, object] = {}

    def run(i):
        results[i] = generate(eng, (PROMPTS + ["the cat"])[i], **FIXED)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i].tokens for i in range(4)] == alone
    assert all(results[i].spec.draft_n_accepted > 20 for i in range(4))
    assert eng.batch_loop.rows > eng.batch_loop.steps


def test_sampled_output_keeps_the_target_distribution(tmp_path):
    """At temperature 1 the store fills with the engine's own earlier samples; drafts from it (point masses)
    under strict rejection leave the first three tokens' distribution the target's (chi-square, seeded)."""
    small = dict(n_layer=1, n_embd=32, n_head=2, n_head_kv=1)
    eng = ts.load_engine(write_model(tmp_path, "t", 0, **small), num_ctx=64)
    opts = dict(ts.DIST_OPTS, drafter="suffix")
    exact = ts.exact_first_tokens(eng, ts.DIST_PROMPT, opts, 3)
    pvalue, acceptance = ts.chi_square_pvalue(eng, exact, ts.DIST_RUNS, opts)
    assert 0.05 < acceptance < 0.95  # drafts accepted and rejected both
    assert pvalue > 1e-3


def test_constrained_and_relaxed_requests_stay_exact(tiny):
    eng = load(tiny["llama"])
    fmt = {"format": "json"}
    plain = generate(eng, ts.PROMPT, **GREEDY, drafter="none", request=fmt).tokens
    generate(eng, ts.PROMPT, **GREEDY, request=fmt)
    assert generate(eng, ts.PROMPT, **GREEDY, request=fmt).tokens == plain
    # relaxed top-1 at temperature 0 is the strict rule
    assert generate(eng, ts.PROMPT, **GREEDY, relaxed_top_n=1).tokens == \
        generate(eng, ts.PROMPT, **GREEDY, drafter="none").tokens
    # relaxed top-5 while sampling from the top 5: an earlier sample's tokens, drafted again, rank in the target's
    # top 5 at the same positions, so the relaxed rule keeps them
    sampled = dict(FIXED, temperature=0.8, top_k=5, seed=5, relaxed_top_n=5)
    eng.outputs.clear()
    first = generate(eng, "Once upon a time", **sampled)
    relaxed = generate(eng, "Once upon a time", **sampled)
    assert relaxed.spec.drafter == "suffix" and relaxed.spec.draft_n > 0
    assert relaxed.spec.draft_n_accepted > first.spec.draft_n_accepted


def test_a_cancelled_request_adds_nothing(tiny):
    eng = load(tiny["llama"])
    seen = []
    run = generate(eng, ts.PROMPT, **GREEDY, drafter="none", should_stop=lambda: seen.append(1) or len(seen) > 5)
    assert 0 < len(run.tokens) < GREEDY["num_predict"]
    assert eng.outputs.tokens == 0
    # a consumer that stops reading mid-stream adds nothing either
    stream = eng.generate(GenerateRequest(prompt=ts.PROMPT, options=Options.from_map(GREEDY)))
    next(stream)
    stream.close()
    assert eng.outputs.tokens == 0
    generate(eng, ts.PROMPT, **GREEDY)
    assert eng.outputs.tokens > 0


def test_one_models_outputs_never_draft_for_another_and_a_reload_starts_empty(tiny):
    a, b = load(tiny["llama"]), load(tiny["llama"])
    generate(a, ts.PROMPT, **GREEDY)
    prompt_ids = a.tokenize(ts.PROMPT)
    assert a.outputs.match(prompt_ids, 8) is not None
    assert b.outputs.tokens == 0 and b.outputs.match(prompt_ids, 8) is None
    retried, fresh = generate(a, ts.PROMPT, **FIXED), generate(b, ts.PROMPT, **FIXED)
    assert retried.tokens == fresh.tokens
    assert fresh.spec.target_forwards > retried.spec.target_forwards  # b had nothing to draft the answer from
    assert load(tiny["llama"]).outputs.tokens == 0  # a reload of the same file holds nothing


def test_the_load_bounds_the_store(tiny):
    eng = load(tiny["llama"], suffix_tokens=60)
    for p in PROMPTS:
        generate(eng, p, **GREEDY)
    assert 0 < eng.outputs.tokens <= 60
    none = load(tiny["llama"], suffix_tokens=0)
    generate(none, ts.PROMPT, **GREEDY)
    assert none.outputs.tokens == 0
