"""The NextN (MTP) head of Qwen3.5 / Qwen3.6 (qwen35, qwen35moe) on tiny random models whose GGUF carries the head
as llama.cpp writes it (block N = n_layer, ``nextn_predict_layers`` 1, ``block_count`` counting it).

transformers has no module for the head, so the oracle (tests/hf_tiny_qwen35.MtpHead) is assembled from
transformers' own decoder layer and norm, in float64, from the tensor definitions: it reads the target's
final-normed hidden state, ends with its own norm, and a chained step takes that normed output as its hidden
state. Then the head drafts through the real engine: greedy output identical with and without it, rejected
drafts leave no trace in the hybrid cache, and a cancelled stream leaves every cache consistent."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine.models.loader import find_nextn_block, load_model  # noqa: E402
from tests import hf_tiny_qwen35  # noqa: E402
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts, stop_after  # noqa: E402
from tests.model_checks import TOL, random_ids, relative_error  # noqa: E402


@pytest.fixture(scope="module", params=["dense", "moe"])
def pair(request, tmp_path_factory):
    torch.set_num_threads(1)
    moe = request.param == "moe"
    # seeds whose greedy text runs long before an end-of-text token
    return hf_tiny_qwen35.make_pair(tmp_path_factory.mktemp(request.param), tied=False, seed=1 if moe else 2,
                                    moe=moe, mtp=True)


@pytest.fixture(scope="module")
def model(pair):
    return load_model(pair.path, fmt="f32")


def test_the_head_block_is_not_a_layer(pair, model):
    assert model.config.n_layer == 4 and model.config.recurrent.layers == (True, True, True, False)
    assert find_nextn_block(model.gguf.tensors) == 4
    assert model.config.nextn_hidden == "normed"


def test_head_matches_the_reference_over_the_prompt_and_a_chain(pair, model):
    tokens = random_ids(pair.vocab_size, 12)
    drafts = random_ids(pair.vocab_size, 3, seed=5)
    want = pair.mtp.chain(pair.hf, tokens, drafts)
    assert relative_error(hf_tiny_qwen35.engine_head_logits(model, tokens, drafts), want) < TOL


@pytest.fixture(scope="module")
def engine(pair):
    return load_engine(pair.path, num_ctx=160)


@pytest.fixture(scope="module")
def plain(engine):
    return generate(engine, **GREEDY, drafter="none")


def test_the_gguf_head_is_the_mtp_drafter(engine):
    assert "mtp" in engine.drafters and engine.facts.architecture in ("qwen35", "qwen35moe")


@pytest.mark.parametrize("cap", [1, 3, 6])
def test_drafting_with_the_head_is_lossless(engine, plain, cap):
    run = generate(engine, **GREEDY, **spec_opts("mtp", cap))
    assert len(set(plain.tokens)) > 10
    assert run.tokens == plain.tokens
    assert run.spec.drafter == "mtp" and run.spec.draft_n >= 15  # rejections restore the recurrent states
    assert len(run.spec.drafted_per_position) == cap


def test_cancel_mid_stream_then_the_same_prompt_matches_plain(engine, plain):
    cut = generate(engine, **GREEDY, **spec_opts("mtp", 4), should_stop=stop_after(4))
    n = cut.result.eval_count
    assert cut.result.done_reason == "stop" and 0 < n < 40 and cut.tokens == plain.tokens[:n]
    assert engine.cache.tokens == cut.result.context[:-1]
    mtp = engine.drafters["mtp"]
    assert mtp.cache.tokens == cut.result.context[1:mtp.cache.length + 1]  # pair j holds t_{j+1}
    again = generate(engine, **GREEDY, **spec_opts("mtp", 4))
    assert again.tokens == plain.tokens
    assert again.result.prompt_cached == again.result.prompt_eval_count - 1  # resumed at the prompt checkpoint


def test_accepted_and_rejected_drafts_leave_the_caches_exact(pair, engine):
    """Sampling with relaxed acceptance (any draft among the target's 150 likeliest) accepts many drafts and rejects
    others, so rounds end at varied offsets; a greedy continuation from that context then equals a fresh
    engine's."""
    run = generate(engine, temperature=1.0, seed=3, num_predict=40, top_k=1000, **spec_opts("mtp", 4),
                   relaxed_top_n=150)
    assert run.spec.draft_n_accepted > 10 and run.spec.draft_n_accepted < run.spec.draft_n
    ctx = run.result.context
    warm = generate(engine, "", request={"raw_tokens": ctx}, temperature=0, num_predict=12, **spec_opts("mtp", 3))
    assert warm.result.prompt_cached > len(ctx) // 2  # resumed from the speculative run's cache
    fresh = generate(load_engine(pair.path, num_ctx=160), "", request={"raw_tokens": ctx}, temperature=0,
                     num_predict=12, drafter="none")
    assert warm.tokens == fresh.tokens


def test_head_behind_the_target_resumes_where_both_have_a_state(pair):
    """A request without drafting moves the target's cache past the head's pairs; the next MTP request must
    resume no later than the head, at a position the recurrent layers hold a state for (not wherever the
    head's pairs end), and still produce the plain answer."""
    engine = load_engine(pair.path, num_ctx=160)
    a = generate(engine, temperature=0, num_predict=6, **spec_opts("mtp", 3))
    longer = a.result.context + [5, 6, 7, 8, 9, 10, 11]
    b = generate(engine, "", request={"raw_tokens": longer}, temperature=0, num_predict=5, drafter="none")
    ctx = b.result.context
    c = generate(engine, "", request={"raw_tokens": ctx}, temperature=0, num_predict=10, **spec_opts("mtp", 3))
    fresh = generate(load_engine(pair.path, num_ctx=160), "", request={"raw_tokens": ctx}, temperature=0,
                     num_predict=10, drafter="none")
    assert c.tokens == fresh.tokens
    assert 0 < c.result.prompt_cached < len(a.result.context)  # the head's pairs bound the reuse


def test_a_head_only_file_drafts_as_the_in_file_head_does(pair, engine, tmp_path):
    """The head alone in its own GGUF (block N's tensors, no embeddings), given as DRAFT to the target
    without a head, drafts exactly as the head inside the target's file."""
    from dataclasses import replace

    from tests.tiny_gguf import write_tiny_gguf

    spec = pair.spec
    bare = write_tiny_gguf(tmp_path / "bare.gguf", replace(spec, n_nextn=0),
                           tensors=hf_tiny_qwen35.to_gguf_tensors(pair.hf, spec))
    head_only = write_tiny_gguf(tmp_path / "head.gguf", replace(spec, name="tiny-head"),
                                tensors=hf_tiny_qwen35.mtp_gguf_tensors(pair.mtp, spec))
    separate = load_engine(bare, head_only, num_ctx=160)
    assert separate.target.config.n_layer == 4 and "mtp" in separate.drafters
    options = dict(temperature=1.0, seed=3, num_predict=30, top_k=1000, relaxed_top_n=150, **spec_opts("mtp", 3))
    a, b = generate(engine, **options), generate(separate, **options)
    assert a.tokens == b.tokens and a.spec.accepted_per_position == b.spec.accepted_per_position
    assert b.spec.draft_n_accepted > 0
