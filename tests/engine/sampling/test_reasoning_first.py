"""``format`` on a model asked to think (``GenerateRequest.think_first``): the reasoning block is free
text, the format holds from its close tag on, as Ollama reasons first and applies the format after.

Token layer with a fake vocabulary (``<think>``/``</think>`` pieces added to test_constrain's), then the
engine with a tiny model whose vocabulary has the tags."""

from __future__ import annotations

import json

import pytest
import torch

from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
from engine.sampling.constrain import ReasoningFirst, TokenConstraint, TokenPieces
from engine.sampling.sampler import Distribution
from engine.contract.json_grammar import compile_format
from tests.engine.sampling.test_constrain import EOS, PIECES, FakeTokenizer
from tests.tiny_gguf import TinySpec, write_tiny_gguf

OPEN, CLOSE = len(PIECES), len(PIECES) + 1
VOCAB = PIECES + [b"<think>", b"</think>"]
LBRACE, RBRACE, HELLO, RBRACKET = 0, 1, 4, 10


def gated(inside: bool) -> ReasoningFirst:
    return ReasoningFirst(compile_format("json"), TokenPieces(FakeTokenizer(VOCAB, {EOS})), {EOS}, OPEN, CLOSE,
                          inside=inside)


def test_the_block_may_open_first_is_free_inside_and_the_format_holds_after():
    c = gated(inside=False)
    assert c.allows(OPEN) and c.allows(LBRACE)  # reason first, or answer at once
    assert not c.allows(HELLO) and not c.allows(EOS)
    c.advance_token(OPEN)
    assert all(c.allows(t) for t in (HELLO, RBRACKET, CLOSE, LBRACE)) and not c.allows(EOS)  # no answer-less end
    for t in (HELLO, RBRACKET, HELLO):
        c.advance_token(t)
    assert not c.done()
    c.advance_token(CLOSE)
    assert not c.allows(HELLO) and not c.allows(OPEN) and c.allows(LBRACE)
    c.advance_token(LBRACE)
    c.advance_token(RBRACE)
    assert c.done() and c.allows(EOS)
    with pytest.raises(ValueError):
        gated(inside=False).advance_token(HELLO)

    # Without think_first the same start is refused: the tags are not JSON.
    plain = TokenConstraint(compile_format("json"), TokenPieces(FakeTokenizer(VOCAB, {EOS})), {EOS})
    assert not plain.allows(OPEN)


def test_answering_at_once_closes_the_way_to_reasoning():
    c = gated(inside=False)
    c.advance_token(LBRACE)
    assert not c.allows(OPEN) and not c.allows(HELLO)


def rows(n: int, ids: list[int]) -> Distribution:
    cand = torch.tensor([ids] * n)
    probs = torch.full((n, len(ids)), 1.0 / len(ids))
    return Distribution(cand, probs, torch.zeros(n, len(VOCAB)), len(VOCAB))


def test_a_draft_chain_is_cut_and_masked_row_by_row():
    c = gated(inside=True)  # the prompt left the block open
    drafts = [HELLO, RBRACKET, CLOSE, LBRACE, HELLO]  # 'hello' cannot follow '{'
    states = c.walk(drafts)
    assert len(states) - 1 == 4
    d = c.mask(rows(5, [LBRACE, HELLO, EOS]), states)
    kept = [d.cand_ids[i][d.cand_probs[i] > 0].tolist() for i in range(5)]
    # rows 0-2 inside the block: anything but the end; row 3 after </think>: a JSON value must start;
    # row 4 after '{': neither '{' nor 'hello' nor the end, so the best-logit valid token is swapped in
    assert kept[:3] == [[LBRACE, HELLO]] * 3
    assert kept[3] == [LBRACE]
    assert len(kept[4]) == 1 and kept[4][0] not in (LBRACE, HELLO, EOS)
    assert c.walk([EOS]) == c.walk([])  # the end is never drafted inside the block


# -- the engine ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine.runtime import ModelRuntime

    path = write_tiny_gguf(tmp_path_factory.mktemp("think") / "t.gguf",
                           TinySpec(arch="qwen2", seed=1, extra_specials=("<think>", "</think>")))
    e = ModelRuntime.load(LoadSpec(model_path=str(path)))
    yield e
    e.close()


def run(engine, prompt: str, num_predict: int = 24, **kw) -> tuple[str, GenerateResult]:
    parts, result = [], None
    options = Options.from_map({"temperature": 0, "num_predict": num_predict})
    for item in engine.generate(GenerateRequest(prompt=prompt, options=options, **kw)):
        if isinstance(item, GenerateResult):
            result = item
        else:
            parts.append(item.text)
    return "".join(parts), result


def test_engine_leaves_the_reasoning_free_and_formats_after(engine):
    prompt = "Question: colours?<think>"
    free, free_result = run(engine, prompt)
    assert "</think>" not in free and free_result.done_reason == "length"  # this model never closes the block
    gated_text, _ = run(engine, prompt, format="json", think_first=True)
    assert gated_text == free  # inside the block: the model's own greedy text
    formatted, _ = run(engine, prompt, format="json")  # without think_first the JSON starts at once
    assert formatted.lstrip()[:1] in '{["-0123456789tfn' and "<think>" not in formatted

    # The block already closed in the prompt: the answer is held to the format from its first token.
    # (room for the random model's long number: the format bounds its length)
    text, result = run(engine, "Question: colours?<think>ok</think>", num_predict=64, format="json", think_first=True)
    assert result.done_reason == "stop"
    json.loads(text)
