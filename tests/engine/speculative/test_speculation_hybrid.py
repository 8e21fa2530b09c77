"""Speculation over a hybrid recurrent model (qwen35: Gated DeltaNet + gated attention) through the real engine:
one batched verification forward per round (the recurrent layers record their state at each offset, the
cache restores the accepted one), lossless at temperature 0 with the target drafting for itself, a second
tiny qwen35 as DRAFT model, and n-gram; cancellation mid-stream leaves the caches consistent with the token
log, and the next request reuses the prefix and matches a fresh run. The loop has no per-model branch: the
cache's ``truncate`` is all that differs."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")

from engine.cache.recurrent import HybridCache  # noqa: E402
from tests import hf_tiny_qwen35  # noqa: E402
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts, stop_after  # noqa: E402


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    target = hf_tiny_qwen35.make_pair(d, tied=False, seed=0).path
    self_copy = shutil.copy(target, d / "self.gguf")
    other = hf_tiny_qwen35.make_pair(d, tied=False, seed=3).path
    return {"target": target, "self": self_copy, "other": other}


@pytest.fixture(scope="module")
def self_engine(paths):
    return load_engine(paths["target"], paths["self"])


@pytest.fixture(scope="module")
def other_engine(paths):
    return load_engine(paths["target"], paths["other"])


@pytest.fixture(scope="module")
def plain(self_engine):
    return generate(self_engine, **GREEDY, drafter="none")


def test_plain_output_is_varied(plain, self_engine):
    assert isinstance(self_engine.cache, HybridCache)
    assert len(set(plain.tokens)) > 10 and plain.result.eval_count == 40


@pytest.mark.parametrize("cap", [1, 3, 8])
def test_self_drafter_accepts_everything_and_matches_plain(self_engine, plain, cap):
    run = generate(self_engine, **GREEDY, **spec_opts("model", cap))
    assert run.tokens == plain.tokens
    assert run.spec.acceptance_rate == 1.0
    assert run.spec.mean_accepted_length(run.result.eval_count) > min(cap, 3)


@pytest.mark.parametrize("cap", [2, 5])
def test_second_model_drafter_is_rejected_often_and_matches_plain(other_engine, plain, cap):
    run = generate(other_engine, **GREEDY, **spec_opts("model", cap))
    assert run.tokens == plain.tokens
    assert run.spec.draft_n >= 20 and run.spec.acceptance_rate < 0.9  # rollbacks happen, restores are exact


def test_ngram_drafter_matches_plain(self_engine, plain):
    run = generate(self_engine, **GREEDY, **spec_opts("ngram", 4))
    assert run.tokens == plain.tokens


def test_verification_is_one_batched_forward(self_engine, monkeypatch):
    """Each round verifies its drafts in one target forward (no per-token fallback for recurrent layers)."""
    widths = []
    model = self_engine.target
    orig = type(model).forward

    def spy(self, tokens, cache, **kw):
        if self is model:
            widths.append(len(tokens))
        return orig(self, tokens, cache, **kw)

    monkeypatch.setattr(type(model), "forward", spy)
    run = generate(self_engine, **GREEDY, **spec_opts("model", 4))
    assert max(widths[1:]) == 5  # 4 drafts + the last committed token, in one forward
    assert len(widths) - 1 < run.result.eval_count  # fewer target forwards than tokens


def test_cancel_mid_stream_then_new_request_reuses_prefix_and_matches_fresh(paths, plain):
    engine = load_engine(paths["target"], paths["other"])
    cancelled = generate(engine, **GREEDY, **spec_opts("model", 4), should_stop=stop_after(3))
    assert cancelled.result.done_reason == "stop"
    n = cancelled.result.eval_count
    assert 3 < n < 40 and cancelled.tokens == plain.tokens[:n]
    ctx = cancelled.result.context
    assert engine.cache.tokens == ctx[:-1]
    drafter = engine.drafters["model"]
    assert drafter.tokens == ctx
    assert drafter.cache.tokens == ctx[: drafter.cache.length]
    # Continuing from the cancelled context (Ollama's `context`) right away resumes at the current length.
    cont = generate(engine, "", request={"raw_tokens": ctx}, temperature=0, num_predict=40 - n,
                    **spec_opts("model", 4))
    assert cont.result.prompt_cached == len(ctx) - 1
    assert cont.tokens == plain.tokens[n:]
    # The same prompt again resumes at its prompt-boundary checkpoint (all but its last token).
    again = generate(engine, **GREEDY, **spec_opts("model", 4))
    P = again.result.prompt_eval_count
    assert again.result.prompt_cached == P - 1
    assert again.tokens == plain.tokens
    # Where reuse stops: the cache now ends 40 tokens past the prompt and holds no state at len(ctx) - 1
    # (generated positions are not checkpoints), so the continuation resumes at the prompt's checkpoint.
    cont = generate(engine, "", request={"raw_tokens": ctx}, temperature=0, num_predict=40 - n,
                    **spec_opts("model", 4))
    assert cont.result.prompt_cached == P - 1
    assert cont.tokens == plain.tokens[n:]


def test_cancel_with_ngram_keeps_state_consistent(self_engine, plain):
    cut = generate(self_engine, **GREEDY, **spec_opts("ngram", 3), should_stop=stop_after(5))
    assert cut.result.done_reason == "stop" and cut.tokens == plain.tokens[: len(cut.tokens)]
    assert self_engine.cache.tokens == cut.result.context[:-1]
    full = generate(self_engine, **GREEDY, **spec_opts("ngram", 3))
    assert full.tokens == plain.tokens


def test_stop_string_across_a_round_leaves_the_cache_consistent(self_engine, plain):
    """A stop string drops tokens a round already committed: the recurrent cache cannot cut there (its
    records of that round are gone), so it keeps the longest prefix it has a state for, never a wrong one."""
    dec = self_engine.tokenizer.incremental_decoder()
    pieces = [dec.push(t) for t in plain.tokens]
    text = "".join(pieces) + dec.flush()
    for j in range(5, len(pieces) - 1):
        stop = pieces[j][-1:] + pieces[j + 1][:2]
        at = len("".join(pieces[: j + 1])) - 1
        if len(stop) == 3 and text.find(stop) == at:
            break
    else:
        pytest.fail("no suitable stop string in the plain output")
    run = generate(self_engine, **GREEDY, **spec_opts("model", 8), stop=[stop])
    assert run.text == text[:at] and run.result.done_reason == "stop"
    assert run.result.context[run.result.prompt_eval_count:] == plain.tokens[:j]
    assert self_engine.cache.tokens == run.result.context[: self_engine.cache.length]
    again = generate(self_engine, **GREEDY, **spec_opts("model", 8))
    assert again.tokens == plain.tokens


def test_moe_hybrid_speculation_matches_plain(tmp_path):
    """qwen35moe (routed experts, shared expert) drafting for itself and with n-gram: identical greedy output."""
    target = hf_tiny_qwen35.make_pair(tmp_path, tied=False, seed=1, moe=True).path
    engine = load_engine(target, shutil.copy(target, tmp_path / "self.gguf"))
    plain = generate(engine, **GREEDY, drafter="none")
    assert len(set(plain.tokens)) > 10
    for drafter in ("model", "ngram"):
        run = generate(engine, **GREEDY, **spec_opts(drafter, 4))
        assert run.tokens == plain.tokens, drafter
    assert run.spec.draft_n > 0


@pytest.fixture(scope="module")
def dist_engine(tmp_path_factory):
    """A tiny qwen35 target and, as DRAFT, the same model with a perturbed output head (q overlaps p, differs)."""
    import dataclasses

    import numpy as np

    from tests.tiny_gguf import write_tiny_gguf

    d = tmp_path_factory.mktemp("hybrid-dist")
    pair = hf_tiny_qwen35.make_pair(d, tied=False, seed=0)
    tensors = hf_tiny_qwen35.to_gguf_tensors(pair.hf, pair.spec)
    out = tensors["output.weight"]
    tensors["output.weight"] = out + np.random.default_rng(9).standard_normal(out.shape).astype(np.float32) * 0.1
    draft = write_tiny_gguf(d / "perturbed.gguf", dataclasses.replace(pair.spec, name="perturbed"), tensors=tensors)
    return load_engine(pair.path, draft, num_ctx=64)


def test_strict_sampling_keeps_the_target_distribution(dist_engine):
    """Sampled with a drafter whose drafts are often rejected, the first tokens follow the target's own
    distribution exactly (chi-square over 500 seeded runs): restores after rejection leave no bias."""
    from tests.engine.speculative.test_speculation import (DIST_OPTS, DIST_PROMPT, DIST_RUNS, chi_square_pvalue,
                                                           exact_first_tokens)

    exact = exact_first_tokens(dist_engine, DIST_PROMPT, DIST_OPTS, 3)
    assert min(exact.values()) * DIST_RUNS > 3  # enough expected counts per cell for chi-square
    pvalue, acceptance = chi_square_pvalue(dist_engine, exact, DIST_RUNS)
    assert 0.1 < acceptance < 0.9, acceptance
    assert pvalue > 1e-3


def test_the_distribution_test_catches_a_skipped_restore(dist_engine, monkeypatch):
    """Power: a cache that keeps the rejected positions' recurrent states (no restore) biases the output,
    and the test above sees it (an impossible sequence, or a chi-square p-value below its bound)."""
    from engine.cache.kv import KVCache
    from tests.engine.speculative.test_speculation import (DIST_OPTS, DIST_PROMPT, DIST_RUNS, chi_square_pvalue,
                                                           exact_first_tokens)

    exact = exact_first_tokens(dist_engine, DIST_PROMPT, DIST_OPTS, 3)

    def truncate_without_restore(self, n):
        KVCache.truncate(self, n)
        self._records = {n: list(self.states)} if n else {}

    monkeypatch.setattr(HybridCache, "truncate", truncate_without_restore)
    try:
        pvalue, _ = chi_square_pvalue(dist_engine, exact, DIST_RUNS)
    except AssertionError:  # sampled a sequence the target gives probability 0
        return
    assert pvalue < 1e-3


@pytest.mark.parametrize("cap", [1, 4])
def test_the_snapshot_memory_of_a_request_is_reported(paths, cap):
    """The result carries the most recurrent-state memory the cache held for rollback and prefix reuse: the
    state before a round, the cap states inside its verification but the last (the new committed one),
    and the prompt's two checkpoints, per recurrent layer. The prefill (11 tokens, one exact-recurrence
    forward) keeps only the two states a resume needs, not one per prompt position."""
    engine = load_engine(paths["target"], paths["self"])  # fresh: no checkpoints of earlier prompts
    r = engine.target.config.recurrent
    per_position = r.n_v_heads * r.head_k_dim * r.head_v_dim * 4 + r.conv_dim * (r.conv_kernel - 1) * 4
    run = generate(engine, **GREEDY, **spec_opts("model", cap))
    assert run.result.prompt_eval_count > cap + 3
    assert run.spec.snapshot_bytes == (cap + 3) * sum(r.layers) * per_position
    assert run.spec.to_json(run.result.eval_count)["snapshot_bytes"] == run.spec.snapshot_bytes
