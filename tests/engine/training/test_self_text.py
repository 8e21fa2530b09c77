"""The target's own answers as training text (engine/training/self_text.py): greedy, as the engine decodes."""

from __future__ import annotations

import torch

from engine.models.loader import load_model
from engine.training.self_text import answer_greedily, answer_side_by_side, self_written_tokens
from tests.engine.speculative.test_speculation import generate, load_engine
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_answers_are_the_engines_greedy_text_and_the_budget_holds(tmp_path):
    torch.set_num_threads(1)
    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="qwen2", seed=3))
    target = load_model(str(path), fmt="f32")
    prompt = [5, 17, 42, 9]
    answer = answer_greedily(target, prompt, 20, frozenset())
    alone = generate(load_engine(path), "", request={"raw_tokens": prompt}, temperature=0, num_predict=20,
                     drafter="none")
    assert answer[:4] == prompt and answer[4:] == alone.tokens
    stopped = answer_greedily(target, prompt, 20, frozenset({answer[4]}))
    assert stopped == answer[:5]  # an end token ends the answer, and is kept
    seen = []
    tokens = self_written_tokens(target, [prompt, [3, 4], [8]], 30, 20, frozenset(), lambda d, b: seen.append(d),
                                 width=1)
    assert len(tokens) == 30 and tokens[:24] == answer and seen[-1] == 30


def test_answers_decoded_side_by_side_are_each_answer_alone(tmp_path):
    """Batched answering (ragged prompts, answers ending at different steps) writes what answering one by one does."""
    torch.set_num_threads(1)
    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="qwen2", seed=3))
    target = load_model(str(path), fmt="f32")
    prompts = [[5, 17, 42, 9], [3, 4], [8], [60, 61, 62, 63, 64, 65]]
    alone = [answer_greedily(target, p, 12, frozenset()) for p in prompts]
    stop = frozenset({alone[1][2]})  # the second answer ends at its first token
    alone = [answer_greedily(target, p, 12, stop) for p in prompts]
    assert len(alone[1]) == 3 and any(len(a) == len(p) + 12 for a, p in zip(alone, prompts))
    assert answer_side_by_side(target, prompts, 12, stop) == alone
    budget = sum(map(len, alone)) - 3
    assert self_written_tokens(target, prompts, budget, 12, stop, width=3) == [t for a in alone for t in a][:budget]
