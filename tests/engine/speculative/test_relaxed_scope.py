"""relaxed_scope: the relaxed (top-N) acceptance rule limited to the model's reasoning block.

The decode loop runs with a scripted target (its distribution is a function of the generated tokens) and a
scripted drafter that always proposes a token the target ranks second, so every rank acceptance is visible.
The reasoning block opens with the prompt's trailing ``<think>`` and closes when ``</think>`` is committed;
the vocabulary is a real tokenizer's (a tiny GGUF with ``<think>``/``</think>`` control tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from engine.contract.gguf import GGUFFile
from engine.contract.options import Options, OptionRangeError
from engine.sampling.sampler import SamplingOptions, make_generator
from engine.speculative.depth import FixedDepth
from engine.speculative.drafter import Drafter, Proposal
from engine.speculative.loop import DecodeLoop, DecodeSettings
from engine.contract.special_tokens import ThinkTags
from engine.text.tokenizer import Tokenizer
from tests.tiny_gguf import TinySpec, write_tiny_gguf

THINK_LEN = 6  # the target closes its reasoning after this many generated tokens
N_NEW = 16


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    path = write_tiny_gguf(tmp_path_factory.mktemp("think") / "t.gguf",
                           TinySpec(arch="qwen2", extra_specials=("<think>", "</think>")))
    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata)


@dataclass
class Script:
    """Token ids of the scripted conversation."""

    tags: ThinkTags
    a: int  # the target's choice inside the block
    b: int  # ranked second inside the block: what the drafter proposes there
    c: int  # the target's choice in the answer
    d: int  # ranked second in the answer: what the drafter proposes there
    prompt_len: int

    def target_choice(self, generated: list[int]) -> tuple[int, int]:
        """(argmax, second) of the target after ``generated``."""
        if self.tags.close_id in generated:
            return self.c, self.d
        if len(generated) >= THINK_LEN:
            return self.tags.close_id, self.b
        return self.a, self.b

    def draft_choice(self, generated: list[int]) -> int:
        if self.tags.close_id in generated:
            return self.d
        return self.tags.close_id if len(generated) >= THINK_LEN else self.b


@dataclass
class FakeCache:
    capacity: int = 256
    tokens: list[int] = field(default_factory=list)
    snapshot_peak: int = 0

    def reset_snapshot_peak(self) -> None:
        pass

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def reuse_prefix(self, new_tokens, *, leave_last: bool = True) -> int:
        n = 0
        limit = min(len(self.tokens), len(new_tokens) - (1 if leave_last else 0))
        while n < limit and self.tokens[n] == new_tokens[n]:
            n += 1
        self.truncate(n)
        return n


class FakeTarget:
    """Logits after each position: 10 for the script's choice, 0 for the runner-up, -30 elsewhere, so
    at temperature 1 the choice has almost all the mass and the runner-up ranks second (rank 1)."""

    def __init__(self, script: Script, vocab: int):
        self.script, self.vocab = script, vocab

    def row(self, context: list[int]) -> torch.Tensor:
        first, second = self.script.target_choice(context[self.script.prompt_len:])
        r = torch.full((self.vocab,), -30.0)
        r[first], r[second] = 10.0, 0.0
        return r

    def forward(self, tokens, cache: FakeCache, logits_for: str = "last", return_hidden: bool = False):
        start = len(cache.tokens)
        cache.tokens.extend(int(t) for t in tokens)
        rows = [self.row(cache.tokens[:start + i + 1]) for i in range(len(tokens))]
        if logits_for == "none":
            return None
        return torch.stack(rows[-1:] if logits_for == "last" else rows)


class ScriptedDrafter(Drafter):
    kind = "model"

    def __init__(self, script: Script):
        super().__init__()
        self.script = script

    def propose(self, k, ctx) -> Proposal:
        gen = self.tokens[self.script.prompt_len:]
        drafts: list[int] = []
        for _ in range(k):
            drafts.append(self.script.draft_choice(gen + drafts))
        return Proposal(drafts, None, [1.0] * k)


def script_for(tok: Tokenizer, prompt: list[int]) -> Script:
    tags = tok.think_tags()
    assert tags is not None
    a, b, c, d = (tok.token_id(ch) for ch in "abcd")
    return Script(tags, a, b, c, d, len(prompt))


def run(tok: Tokenizer, prompt_text: str, *, top_n: int, scope: str, within: ThinkTags | None = "auto",
        seed: int = 3) -> tuple[list[int], list[dict], Script]:
    prompt = tok.encode(prompt_text)
    script = script_for(tok, prompt)
    opts = Options(temperature=1.0, top_k=40, top_p=1.0, relaxed_top_n=top_n, relaxed_scope=scope)
    settings = DecodeSettings(
        sampling=SamplingOptions.from_options(opts, 256), num_ctx=256, num_predict=N_NEW, cap=4, schedule="fixed",
        relaxed_top_n=top_n, relaxed_scope=scope,
        relaxed_within=(script.tags if within == "auto" else within) if scope == "thinking" else None,
        trace=True, eog_ids=frozenset({tok.eos_id}))
    loop = DecodeLoop(target=FakeTarget(script, tok.vocab_size), cache=FakeCache(), tokenizer=tok,
                      drafter=ScriptedDrafter(script), controller=FixedDepth(), settings=settings,
                      target_gen=make_generator(seed), draft_gen=make_generator(seed, stream=1))
    gen = loop.run(prompt, lambda: False)
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        result = stop.value
    return result.context[len(prompt):], result.speculation.trace, script


def target_only(script: Script, generated_prefix: list[int], n: int) -> list[int]:
    """The target's own choices after ``generated_prefix`` (greedy, no drafts)."""
    out = list(generated_prefix)
    while len(out) < n:
        out.append(script.target_choice(out)[0])
    return out


def test_thinking_scope_relaxes_inside_the_block_and_never_after(tok: Tokenizer) -> None:
    out, trace, s = run(tok, "hi<think>", top_n=2, scope="thinking")
    close = out.index(s.tags.close_id)
    thinking, answer = out[:close + 1], out[close + 1:]
    # Inside: the drafter's runner-up tokens were accepted where the target would have said `a`.
    assert s.b in thinking and thinking != target_only(s, [], close + 1)
    ranked = [e for e in trace if e["decision"] == "accept-rank"]
    assert ranked and all(e["draft_token"] == s.b for e in ranked)
    first_answer_position = s.prompt_len + close + 1
    assert all(e["position"] < first_answer_position for e in ranked)
    # After the block (including drafts of the round that committed the close tag): strict. The answer
    # is exactly the target's own continuation of this thinking prefix.
    assert answer and s.d not in answer
    assert answer == target_only(s, thinking, len(out))[close + 1:]
    assert any(e["position"] >= first_answer_position and e["draft_token"] == s.d and e["decision"] == "reject"
               for e in trace)
    # The round that crossed the close tag had answer positions in it, decided strictly.
    crossing = [e for e in trace if e["draft_token"] == s.tags.close_id]
    assert crossing and any(e["round"] == crossing[0]["round"] and e["draft_token"] == s.d and e["decision"] == "reject"
                            for e in trace)


def test_all_scope_is_unchanged_and_relaxes_the_answer_too(tok: Tokenizer) -> None:
    out_all, trace_all, s = run(tok, "hi<think>", top_n=2, scope="all")
    close = out_all.index(s.tags.close_id)
    assert s.d in out_all[close + 1:]  # the default relaxes everywhere, the answer included
    assert any(e["decision"] == "accept-rank" and e["draft_token"] == s.d for e in trace_all)
    # Inside the block both scopes decide alike (same draws, same positions).
    out_think, _, _ = run(tok, "hi<think>", top_n=2, scope="thinking")
    assert out_think[:close + 1] == out_all[:close + 1]
    # Strict acceptance: the target's own choices everywhere.
    strict, trace_strict, _ = run(tok, "hi<think>", top_n=0, scope="all")
    assert strict == target_only(s, [], len(strict))
    assert not any(e["decision"] == "accept-rank" for e in trace_strict)


def test_closed_or_absent_block_means_strict(tok: Tokenizer) -> None:
    strict, _, _ = run(tok, "hi<think>x</think>", top_n=0, scope="all")
    # A prompt whose block is already closed: the whole output is the answer, decided strictly.
    closed, trace, _ = run(tok, "hi<think>x</think>", top_n=2, scope="thinking")
    assert closed == strict and not any(e["decision"] == "accept-rank" for e in trace)
    # A vocabulary without the tags: nothing counts as reasoning.
    none, trace, _ = run(tok, "hi<think>", top_n=2, scope="thinking", within=None)
    strict_open, _, _ = run(tok, "hi<think>", top_n=0, scope="all")
    assert none == strict_open and not any(e["decision"] == "accept-rank" for e in trace)


def test_the_model_opening_its_own_block_enters_it(tok: Tokenizer) -> None:
    tags = tok.think_tags()
    assert tags.inside_after([tags.open_id, 5, 6], False) is True
    assert tags.inside_after([tags.open_id, 5, tags.close_id, 7], False) is False
    assert tags.reasoning_positions([5, tags.close_id, 7, tags.open_id, 8], True) == [True, True, False, False, True]


def test_relaxed_scope_is_validated() -> None:
    assert Options.from_map({"relaxed_scope": "thinking"}).relaxed_scope == "thinking"
    assert Options().relaxed_scope == "all"
    with pytest.raises(OptionRangeError, match=r'invalid relaxed_scope value \[answer\]: must be "all" or "thinking"'):
        Options.from_map({"relaxed_scope": "answer"})
