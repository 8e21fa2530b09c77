"""Fitting a NextN (MTP) head to a frozen target (engine/training/): on a tiny random qwen2 model, in seconds.

The oracle for the head's arithmetic is the engine itself: a head written as a head-only GGUF and loaded by the
engine's loader must compute the logits the trainable module computed. Then training must teach it something (its
greedy drafts agree with the target's greedy tokens far above chance), a stopped run resumed from its checkpoint
must take the same steps as one that ran through, and the engine must draft with the trained head losslessly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.contract.drafter_provenance import read_provenance
from engine.contract.gguf import GGUFFile
from engine.models.loader import find_nextn_block, load_model, load_nextn_head
from engine.training.fit import FitConfig, HeldOut, acceptance, fit_head, split_tokens, target_pass
from engine.training.head_gguf import write_head_gguf
from engine.training.nextn_head import (TrainableNextN, UntrainableTarget, check_trainable, initial_weights,
                                        weights_from_head_gguf)
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def target_path(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_tiny_gguf(tmp_path_factory.mktemp("train") / "tiny.gguf", TinySpec(arch="qwen2", seed=3))


@pytest.fixture(scope="module")
def target(target_path):
    return load_model(str(target_path), fmt="f32")


def random_text(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_the_engine_runs_the_head_as_it_was_trained(target, target_path, tmp_path):
    head = TrainableNextN(target, initial_weights(target, torch.Generator().manual_seed(1)))
    with torch.no_grad():  # away from the initial values, so that every weight's name and layout matters
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    path = write_head_gguf(tmp_path / "head.gguf", target_path, head.tensors(target.config.n_layer),
                           {"tokens": 0}, "tiny-head")
    with GGUFFile(path) as f:
        assert find_nextn_block(f.tensors) == target.config.n_layer and "token_embd.weight" not in f.tensors
        engine_head = load_nextn_head(target, f, target.config.n_layer, "f32")
        ids = random_text(40, target.config.vocab_size, seed=5)
        hidden, _ = target_pass(target, ids)
        g = engine_head.forward(engine_head.from_target(hidden[:-1]), ids[1:], engine_head.new_cache(64))
        theirs = torch.cat([engine_head.logits(row) for row in g])
        with torch.no_grad():
            ours = head.logits(head(hidden[:-1], torch.tensor(ids[1:])))
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_written_head_reads_back_as_the_weights_it_was_written_from(target, target_path, tmp_path):
    """What benchmarks.head_acceptance compares heads by: a stored head back in the trainable module, every weight."""
    head = TrainableNextN(target, initial_weights(target, torch.Generator().manual_seed(2)))
    path = write_head_gguf(tmp_path / "head.gguf", target_path, head.tensors(target.config.n_layer), {}, "tiny-head")
    back = weights_from_head_gguf(str(path), target.config.n_layer)
    assert set(back) == {k.replace("__", ".") for k in head.weights}
    for key, p in head.weights.items():
        torch.testing.assert_close(back[key.replace("__", ".")].float(), p.detach())
    with pytest.raises(ValueError, match="no head block"):
        weights_from_head_gguf(str(path), target.config.n_layer + 1)


def test_training_teaches_the_head_the_targets_next_next_token(target):
    vocab = target.config.vocab_size
    cfg = FitConfig(tokens=8000, window=64, lr=3e-3, validate_every=40, validation_tokens=1024)
    tokens = random_text(8000, vocab)
    _, valid = split_tokens(tokens, cfg)
    before = acceptance(TrainableNextN(target, initial_weights(target, torch.Generator().manual_seed(0))),
                        HeldOut.of(target, valid))
    result = fit_head(target, tokens, cfg)
    assert result.steps == cfg.steps and result.curve[-1][0] == result.tokens_seen
    # chance is 1 / vocab (0.35 %); the untrained head is near it
    assert before < 3 / vocab
    assert result.validation_acceptance > 10 / vocab and result.validation_acceptance > 4 * before


def test_a_stopped_run_resumes_where_it_stopped(target, tmp_path):
    cfg = FitConfig(tokens=1200, window=48, lr=3e-3, validate_every=10, validation_tokens=400, checkpoint_every_s=0)
    tokens = random_text(3000, target.config.vocab_size, seed=2)
    through = fit_head(target, tokens, cfg, checkpoint=tmp_path / "a.ckpt")
    calls = {"n": 0}

    def stop_at_twelve() -> bool:
        calls["n"] += 1
        return calls["n"] > 12

    first = fit_head(target, tokens, cfg, checkpoint=tmp_path / "b.ckpt", should_stop=stop_at_twelve)
    assert first.stopped and first.steps == 12
    resumed = fit_head(target, tokens, cfg, checkpoint=tmp_path / "b.ckpt")
    assert not resumed.stopped and resumed.steps == through.steps == cfg.steps
    assert resumed.curve == through.curve
    for name, t in through.head.tensors(2).items():
        torch.testing.assert_close(resumed.head.tensors(2)[name], t, rtol=0, atol=0)
    other = FitConfig(tokens=1300, window=48, validation_tokens=400)
    with pytest.raises(ValueError, match="another run"):
        fit_head(target, tokens, other, checkpoint=tmp_path / "b.ckpt")


def test_the_engine_drafts_with_a_trained_head_losslessly(target, target_path, tmp_path):
    vocab = target.config.vocab_size
    result = fit_head(target, random_text(6000, vocab, seed=4), FitConfig(tokens=6000, window=64, lr=3e-3,
                                                                          validate_every=100))
    path = write_head_gguf(tmp_path / "head.gguf", target_path, result.head.tensors(target.config.n_layer),
                           {"tokens": result.tokens_seen, "validation_acceptance": result.validation_acceptance},
                           "tiny-head")
    with GGUFFile(path) as f:
        assert read_provenance(f.metadata) == {"tokens": result.tokens_seen,
                                               "validation_acceptance": pytest.approx(result.validation_acceptance, abs=1e-4)}
    plain = generate(load_engine(target_path), **GREEDY, drafter="none")
    drafted = generate(load_engine(target_path, path), **GREEDY, **spec_opts("mtp", 3))
    assert drafted.tokens == plain.tokens
    assert drafted.spec.draft_n > 0 and drafted.spec.draft_n_accepted > 0


def test_a_target_it_cannot_train_for_is_refused_before_any_work(tmp_path):
    gemma = load_model(str(write_tiny_gguf(tmp_path / "g.gguf", TinySpec(arch="gemma3"))), fmt="f32")
    with pytest.raises(UntrainableTarget, match="not gemma3"):
        check_trainable(gemma.config)
