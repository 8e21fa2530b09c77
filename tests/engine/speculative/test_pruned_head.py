"""A draft model's pruned output head (``draft_vocab``): engine.models.pruned_head and
engine.text.token_frequency.

* the head scores exactly the kept rows (bit for bit the full head's values) and -inf elsewhere, and
  a request's own tokens once the drafter includes them;
* which rows: every special token, then the most frequent in the reference text, ties by id; counted
  once and kept in the store's directory (a damaged table is recounted);
* speculation with a pruned drafter stays lossless: greedy output equals plain decoding, and sampled
  output keeps the target's exact distribution (chi-square, with the drafter both accepted and rejected);
* ``draft_vocab`` reaches the engine from a LoadSpec (and from the options through the model lifecycle).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.models.loader import load_model
from engine.models.pruned_head import SCREEN_SIGMAS, PrunedHead, prune_output_head
from engine.ops import dequant as dq
from engine.ops.kernels import qdot_fast
from engine.ops.linear import QDotLinear, load_linear_rows
from engine.contract.protocol import LoadSpec
from engine.runtime import ModelRuntime
from engine.text import token_frequency as tf
from engine.text.tokenizer import Tokenizer
from tests.engine.speculative.test_speculation import (
    DIST_OPTS, DIST_PROMPT, DIST_RUNS, GREEDY, chi_square_pvalue, exact_first_tokens, generate, make_dist_engine,
    spec_opts, write_model,
)
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.mark.parametrize("fmt", ["f32", "qdot"])
def test_the_pruned_head_scores_exactly_the_kept_rows(tmp_path, fmt):
    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", tied_output=False, seed=3))
    model = load_model(path, fmt=fmt)
    try:
        vocab = model.config.vocab_size
        ids = torch.tensor(sorted(set(range(0, vocab, 3)) | {vocab - 1}))
        full = model.forward([5, 6, 7, 8], model.new_cache(16))
        prune_output_head(model, ids)
        assert isinstance(model.output, PrunedHead)
        pruned = model.forward([5, 6, 7, 8], model.new_cache(16))
        assert pruned.shape == full.shape
        assert torch.equal(pruned[:, ids], full[:, ids])
        others = torch.ones(vocab, dtype=torch.bool)
        others[ids] = False
        assert bool(torch.isneginf(pruned[:, others]).all())
        assert model.output.head.weight_nbytes() < 0.5 * vocab * model.config.n_embd * 4  # a third of the rows
        # the rows it does not score are kept apart: completing recorded scorings gives the full head's logits
        out = model.forward([5, 6, 7, 8], model.new_cache(16), logits_for="last", return_hidden=True)
        completed = model.output.complete(out.hidden[-1:], out.logits)
        if model.output.rest_error is None:  # an exact rest (a 4-bit screen's: the next test)
            torch.testing.assert_close(completed, full[-1:], rtol=0, atol=1e-5 * float(full.abs().max()))
        else:
            assert int(completed.argmax()) == int(full[-1:].argmax())
        # a request's own tokens are scored too once included (dequantized rows: float rounding apart)
        model.output.include([4, 7, 4])
        again = model.forward([5, 6, 7, 8], model.new_cache(16))
        assert torch.equal(again[:, ids], full[:, ids])
        torch.testing.assert_close(again[:, [4, 7]], full[:, [4, 7]], rtol=0, atol=0.05 * float(full.abs().max()))
        assert bool(torch.isneginf(again[:, 5]).all()) and model.output.extra_ids.tolist() == [4, 7]
        # tokens kept or included already change nothing (the lookup that skips the tensor work); a new one among
        # them, or beside ids out of range, is still included
        model.output.include([0, 3, 4, 7, vocab - 1])
        assert model.output.extra_ids.tolist() == [4, 7]
        model.output.include([0, 7, 5, -1, vocab])
        assert model.output.extra_ids.tolist() == [4, 7, 5]
        assert not bool(torch.isneginf(model.forward([5], model.new_cache(4))[:, 5]).any())
    finally:
        model.close()


def test_a_4_bit_rest_finds_each_positions_best_token_with_its_exact_score(tmp_path):
    """On the qdot kernel the rows a pruned head does not score are kept as a 4-bit screen (half Q8_0's
    bytes, read once a drafted round): ``complete`` gives every row that could be a position's best its exact
    score, so the full head's best token and its score come out as with an exact rest."""
    if not qdot_fast():
        pytest.skip("the 4-bit screen needs the qdot kernel's vector path")
    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", tied_output=False, seed=5))
    model = load_model(path, fmt="qdot")
    try:
        vocab = model.config.vocab_size
        f = model.gguf
        info = f.tensors["output.weight"]
        weight = dq.dequantize(dq.raw_tensor(f, "output.weight"), info.ggml_type, tuple(info.shape))
        ids = torch.tensor(sorted(set(range(0, vocab, 3))))
        prune_output_head(model, ids)
        head = model.output
        assert isinstance(head.rest, QDotLinear) and head.rest.bits == 4 and head.rest_error is not None
        exact_rest = load_linear_rows(f, "output.weight", "qdot", head.rest_ids)
        assert head.rest.weight_nbytes() < 0.6 * exact_rest.weight_nbytes()
        # inputs pointing at rest rows (each position's best is then mostly a row the pruned head does not
        # score) and at kept rows, with noise that leaves close runners-up
        gen = torch.Generator().manual_seed(0)
        rest_rows = head.rest_ids[torch.randint(len(head.rest_ids), (48,), generator=gen)]
        kept_rows = ids[torch.randint(len(ids), (16,), generator=gen)]
        x = weight[torch.cat([rest_rows, kept_rows])] * 40.0
        x = x + torch.randn(x.shape, generator=gen) * float(x.std()) * 0.5
        pruned = head(x)
        completed = head.complete(x, pruned)
        reference = pruned.clone()  # what an exact rest gives: kept rows as scored, the others from their rows
        reference[:, head.rest_ids] = x @ weight[head.rest_ids].t()
        best = reference.argmax(dim=1)
        assert torch.equal(completed.argmax(dim=1), best)
        assert bool(torch.isin(best, head.rest_ids).float().mean() > 0.5)  # the rest's exact scores were needed
        torch.testing.assert_close(completed.gather(1, best[:, None]), reference.gather(1, best[:, None]),
                                   rtol=1e-5, atol=1e-4)
        # every other score is the screen's, within its margin
        margin = SCREEN_SIGMAS * x.norm(dim=1, keepdim=True) * head.rest_error
        assert bool(((completed[:, head.rest_ids] - reference[:, head.rest_ids]).abs() <= margin).all())
    finally:
        model.close()


def test_a_pruned_head_refuses_to_keep_everything_or_nothing(tmp_path):
    model = load_model(write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", seed=4)), fmt="f32")
    try:
        for ids in (torch.arange(model.config.vocab_size), torch.tensor([], dtype=torch.long)):
            with pytest.raises(ValueError, match="keeps between"):
                prune_output_head(model, ids)
    finally:
        model.close()


# -- which tokens -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from engine.contract.gguf import GGUFFile

    path = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "t.gguf", TinySpec(arch="qwen2", seed=1))
    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata)


def test_frequent_tokens_keeps_specials_then_the_most_frequent(tokenizer):
    vocab = tokenizer.vocab_size
    specials = set(tokenizer.special_ids())
    assert specials  # the tiny vocabulary has control tokens
    counts = np.zeros(vocab, dtype=np.int64)
    counts[[40, 41, 42, 43]] = [5, 9, 9, 1]
    kept = tf.frequent_tokens(tokenizer, len(specials) + 3, counts)
    assert set(kept) == specials | {41, 42, 40}  # 43 has the lowest count
    kept = tf.frequent_tokens(tokenizer, len(specials) + 2, counts)
    assert set(kept) == specials | {41, 42}
    # a tie at the cut: the lower id first
    counts[44] = 5
    assert 40 in tf.frequent_tokens(tokenizer, len(specials) + 3, counts)
    assert 44 not in tf.frequent_tokens(tokenizer, len(specials) + 3, counts)
    assert list(kept) == sorted(kept)


def test_counts_are_counted_once_and_a_damaged_table_is_recounted(tokenizer, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tf, "reference_corpus", lambda limit=0: calls.append(1) or ["def f(x):\n    return x\n"] * 3)
    first = tf.token_counts(tokenizer, tmp_path)
    want = tf.count_tokens(tokenizer, ["def f(x):\n    return x\n"] * 3)
    assert np.array_equal(first, want) and int(first.sum()) > 0
    (table,) = tmp_path.glob("token-counts-*.npy")
    assert np.array_equal(tf.token_counts(tokenizer, tmp_path), first) and len(calls) == 1  # from the file
    table.write_bytes(b"not a table")
    assert np.array_equal(tf.token_counts(tokenizer, tmp_path), first) and len(calls) == 2
    assert np.array_equal(np.load(table), first)  # rewritten


def test_the_reference_corpus_is_the_standard_library():
    texts = tf.reference_corpus(200_000)
    assert sum(len(t) for t in texts) == 200_000
    assert any("def " in t for t in texts)


# -- speculation stays lossless -----------------------------------------------------------------


@pytest.fixture(scope="module")
def pruned_dist_engine(tmp_path_factory):
    """The distribution test's engine with its drafter's head cut to the even token ids: the drafter still
    proposes the target's likely tokens when they are even, and cannot when they are odd."""
    engine = make_dist_engine(tmp_path_factory.mktemp("pruned"))
    draft = engine.drafters["model"].model
    prune_output_head(draft, torch.arange(0, draft.config.vocab_size, 2))
    yield engine
    engine.close()


def test_strict_sampling_with_a_pruned_drafter_keeps_the_target_distribution(pruned_dist_engine, monkeypatch):
    # the static cut only (included request tokens would, over 500 runs, give the drafter its whole head back)
    monkeypatch.setattr(PrunedHead, "include", lambda self, tokens: 0)
    exact = exact_first_tokens(pruned_dist_engine, DIST_PROMPT, DIST_OPTS, 3)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-5)
    assert any(t % 2 for key in exact for t in key)  # the target has candidates the drafter lacks
    pvalue, acceptance = chi_square_pvalue(pruned_dist_engine, exact, DIST_RUNS)
    assert 0.1 < acceptance < 0.9
    assert pvalue > 1e-3


def test_greedy_output_with_a_pruned_drafter_is_plain_decoding(pruned_dist_engine):
    plain = generate(pruned_dist_engine, DIST_PROMPT, **GREEDY)
    drafted = generate(pruned_dist_engine, DIST_PROMPT, **GREEDY, **spec_opts("model", 3))
    assert drafted.tokens == plain.tokens and drafted.spec.draft_n > 0


# -- from the load spec ---------------------------------------------------------------------------


def test_draft_vocab_prunes_the_drafter_at_load(tmp_path, monkeypatch):
    monkeypatch.setattr(tf, "reference_corpus", lambda limit=0: ["the def return in an self print " * 20])
    small = dict(n_layer=1, n_embd=32, n_head=2, n_head_kv=1)
    target, draft = write_model(tmp_path, "t", 0, **small), write_model(tmp_path, "d", 0, noise=0.3, **small)
    spec = LoadSpec(model_path=str(target), draft_path=str(draft), num_ctx=64, weight_format="f32",
                    draft_weight_format="f32", device="cpu", draft_vocab=200, pack_dir=str(tmp_path / "packs"))
    engine = ModelRuntime.load(spec)
    try:
        head = engine.drafters["model"].model.output
        assert isinstance(head, PrunedHead) and len(head.ids) == 200
        assert set(engine.tokenizer.special_ids()) <= set(head.ids.tolist())
        assert list((tmp_path / "packs").glob("token-counts-*.npy"))
        assert generate(engine, DIST_PROMPT, **GREEDY, **spec_opts("model", 3)).tokens == \
            generate(engine, DIST_PROMPT, **GREEDY).tokens
    finally:
        engine.close()
    whole = ModelRuntime.load(LoadSpec(model_path=str(target), draft_path=str(draft), num_ctx=64, weight_format="f32",
                                       draft_weight_format="f32", device="cpu", draft_vocab=0))
    try:
        assert not isinstance(whole.drafters["model"].model.output, PrunedHead)
    finally:
        whole.close()
