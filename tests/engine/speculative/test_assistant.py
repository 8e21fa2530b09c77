"""The Gemma 4 assistant drafter (engine.models.gemma4_assistant_model + engine.speculative.assistant) on tiny models built by
transformers: its drafted logits equal a hand-rolled transformers drafting loop at every step, and through
the decode loop it is lossless (greedy output identical with and without it; strict sampling keeps the
target's distribution, by the chi-square harness of test_speculation)."""

from __future__ import annotations

import math
import random

import pytest
import torch

pytest.importorskip("transformers")

from engine.contract.capabilities import DRAFTER_ARCHITECTURES, drafter_problem  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.loader import load_assistant, load_model  # noqa: E402
from engine.contract.protocol import EngineError  # noqa: E402
from tests import hf_tiny_gemma4 as g4  # noqa: E402
from tests.engine.speculative.test_speculation import (  # noqa: E402
    DIST_OPTS,
    DIST_PROMPT,
    DIST_RUNS,
    GREEDY,
    exact_first_tokens,
    generate,
    load_engine,
    spec_opts,
)

TOL = 1e-4


@pytest.fixture(scope="module", params=["e2b", "31b"])
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp(f"assistant-{request.param}")
    target = g4.make_gemma4(request.param, d)
    return target, g4.make_assistant(target, d)


@pytest.fixture(scope="module")
def e2b(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("assistant-engine")
    target = g4.make_gemma4("e2b", d)
    return target, g4.make_assistant(target, d)


@pytest.fixture(scope="module")
def engine(e2b):
    return load_engine(e2b[0].path, e2b[1].path)


@pytest.mark.parametrize("length", [5, 8, 21])  # inside, at and past the sliding window
def test_drafted_logits_equal_a_transformers_loop(pair, length):
    target, assistant = pair
    model = load_model(target.path, fmt="f32")
    with GGUFFile(assistant.path) as f:
        drafter = load_assistant(model, f, "f32")
    rng = random.Random(length)
    log = [rng.randrange(target.vocab_size) for _ in range(length)]
    want, ref = g4.hf_assistant_drafts(target, assistant, log, 4)
    cache = model.new_cache(64)
    out = model(log[:-1], cache, return_hidden=True)
    h = model.norm(out.prenorm_hidden[-1:])[0]  # the target's post-norm state at P - 1
    token, before = log[-1], cache.length
    for i in range(4):
        logits, h = drafter.step(token, h, cache, len(log) - 1)
        scale = ref[i].abs().max()
        assert float((logits[0].double() - ref[i]).abs().max() / scale) < TOL
        token = int(logits.argmax())
        assert token == want[i]
    assert cache.length == before and cache.tokens == log[:-1]  # read only


def test_the_drafter_starts_each_round_from_the_right_state(pair):
    """AssistantDrafter between commits, as the decode loop drives it: after the prompt and after a round
    that kept one draft, its greedy proposals equal the transformers loop on the committed log (which
    needs the hidden state at the right row of the verification forward, normed)."""
    from engine.sampling.sampler import SamplingOptions, make_generator
    from engine.speculative.assistant import AssistantDrafter
    from engine.speculative.drafter import DraftContext, TargetOutput

    target, assistant = pair
    model = load_model(target.path, fmt="f32")
    with GGUFFile(assistant.path) as f:
        asst = load_assistant(model, f, "f32")
    cache = model.new_cache(64)
    drafter = AssistantDrafter(asst, cache, model.norm, target.vocab_size)
    ctx = DraftContext(SamplingOptions(temperature=0.0), make_generator(0, stream=1))
    rng = random.Random(3)
    log = [rng.randrange(target.vocab_size) for _ in range(11)]
    drafter.begin(log)
    out = model(log, cache, logits_for="last", return_hidden=True)  # the prompt's evaluation
    log.append(int(out.logits[-1].argmax()))
    drafter.commit(log[-1:], len(log), TargetOutput(0, out.prenorm_hidden))
    for _ in range(2):
        drafts = drafter.propose(3, ctx).tokens
        assert drafts == g4.hf_assistant_drafts(target, assistant, log, 3)[0]
        # a round that keeps the first draft and replaces the second with the target's own token
        P = len(log) - 1
        verify = model([log[-1]] + drafts, cache, return_hidden=True)
        run = [drafts[0], int(verify.logits[1].argmax())]
        cache.truncate(P + 2)
        log.extend(run)
        drafter.commit(run, len(log), TargetOutput(P, verify.prenorm_hidden))
    assert drafter.propose(2, ctx).tokens == g4.hf_assistant_drafts(target, assistant, log, 2)[0]


def test_binds_to_the_last_kv_layer_of_each_kind(pair):
    target, assistant = pair
    model = load_model(target.path, fmt="f32")
    with GGUFFile(assistant.path) as f:
        cfg = load_assistant(model, f, "f32").config
    # e2b: layers 4 and 5 reuse 3 (sliding) and 2 (global); 31b stores K/V in every layer.
    assert cfg.kv_source == ((3, 2) if target.variant == "e2b" else (4, 5))
    assert cfg.layer_n_head_kv == ((2, 2) if target.variant == "e2b" else (2, 1))


def test_greedy_output_is_identical_with_and_without_the_assistant(engine):
    assert engine.draft_kind == "mtp" and engine.facts.draft_architecture == "gemma4-assistant"
    plain = generate(engine, **GREEDY, drafter="none")
    assert len(set(plain.tokens)) > 5
    for cap in (1, 4):
        run = generate(engine, **GREEDY, **spec_opts("mtp", cap))
        assert run.tokens == plain.tokens
        assert run.spec.drafter == "mtp" and run.spec.draft_n > 10
    auto = generate(engine, **GREEDY, drafter="auto", draft_num_predict=3)
    assert auto.tokens == plain.tokens and auto.spec.drafter == "mtp+suffix"
    again = generate(engine, **GREEDY, **spec_opts("mtp", 3))  # prefix reuse across requests
    assert again.tokens == plain.tokens


def _cut_at_end_of_generation(exact: dict, eog: set[int]) -> dict:
    """P(first tokens) as a run reports them: a path is cut before its first end-of-generation token."""
    out: dict[tuple[int, ...], float] = {}
    for path, p in exact.items():
        cut = next((i for i, t in enumerate(path) if t in eog), len(path))
        out[path[:cut]] = out.get(path[:cut], 0.0) + p
    return out


@pytest.fixture(scope="module")
def bigram_engine(tmp_path_factory):
    """A bigram target and an assistant crafted to know it, up to noise in its head: q close to p."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("assistant-bigram")
    target = g4.make_gemma4("e2b", d, bigram=True)
    return load_engine(target.path, g4.make_assistant(target, d, copy_bigram=0.05).path)


def _sampling_pvalue(engine) -> tuple[float, float]:
    """Seeded chi-square over the first three tokens against the exact distribution from the target's
    logits (test_speculation's harness; cells expected fewer than 5 times are pooled), and the
    acceptance rate."""
    opts = {**DIST_OPTS, "temperature": 3.0}
    eog = set(engine.tokenizer.eot_ids) | {engine.tokenizer.eos_id}
    exact = _cut_at_end_of_generation(exact_first_tokens(engine, DIST_PROMPT, opts, 3), eog)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-5)
    counts: dict[tuple[int, ...], int] = {}
    drafted = accepted = 0
    for seed in range(DIST_RUNS):
        run = generate(engine, DIST_PROMPT, **opts, seed=seed)
        key = tuple(run.tokens)
        assert key in exact, f"sampled {key}, which the target gives probability 0"
        counts[key] = counts.get(key, 0) + 1
        drafted += run.spec.draft_n
        accepted += run.spec.draft_n_accepted
    big = {k for k, p in exact.items() if DIST_RUNS * p >= 5}
    observed = [counts.get(k, 0) for k in big] + [DIST_RUNS - sum(counts.get(k, 0) for k in big)]
    expected = [DIST_RUNS * exact[k] for k in big] + [DIST_RUNS * (1 - sum(exact[k] for k in big))]
    assert len(big) >= 8
    chi = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    df = sum(1 for e in expected if e > 0) - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                           torch.tensor(chi / 2, dtype=torch.float64)))
    return pvalue, accepted / drafted


def test_strict_sampling_keeps_the_target_distribution(bigram_engine):
    pvalue, acceptance = _sampling_pvalue(bigram_engine)
    assert 0.1 < acceptance < 0.95  # both accepted drafts and residual samples occur
    assert pvalue > 1e-3  # seeded: deterministic, and a correct rule fails this 1 time in 1000


def test_the_distribution_test_rejects_a_wrong_residual(bigram_engine, monkeypatch):
    """Power: sampling the replacement from p instead of norm(max(0, p - q)) biases the output."""
    import engine.speculative.acceptance as acceptance

    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q, draft: p.double() / p.double().sum())
    assert _sampling_pvalue(bigram_engine)[0] < 1e-3


def test_an_assistant_for_another_width_is_refused(e2b, tmp_path):
    target, _ = e2b
    wrong = g4.make_assistant(target, tmp_path, target_width=96, name="wrong")
    with pytest.raises(EngineError) as e:
        load_engine(target.path, wrong.path)
    assert e.value.status == 400 and "96" in str(e.value) and "64" in str(e.value)
    assert "gemma4-assistant" in DRAFTER_ARCHITECTURES
    assert "embedding_length_out" in drafter_problem("gemma4-assistant", 96, "gemma4", 64)
    assert "gemma4" in drafter_problem("gemma4-assistant", 64, "llama", 64)
    assert drafter_problem("gemma4-assistant", 64, "gemma4", 64) is None


def test_relaxed_acceptance_takes_more_of_the_assistants_drafts(bigram_engine):
    """The seed's setting (relaxed top-N, shallow drafts) through the same drafter."""
    rates = {}
    for top_n in (0, 5):
        drafted = accepted = 0
        for seed in range(8):
            run = generate(bigram_engine, DIST_PROMPT, temperature=1.0, top_k=20, num_predict=24, seed=seed,
                           relaxed_top_n=top_n, **spec_opts("mtp", 2))
            drafted += run.spec.draft_n
            accepted += run.spec.draft_n_accepted
        rates[top_n] = accepted / drafted
    assert rates[5] > rates[0], rates
