"""Speculation defaults never cost acceptance (issue 33): a model drafting for itself has every draft accepted
with the default options, whatever the text. Two defaults used to lose drafts:

* the pruned draft head (``draft_vocab``) could not propose a token outside its table: the full head now
  corrects each chain (``engine.speculative.full_head_check``);
* the context copy (``draft_copy``) drafted what looked like a copy and was not (a counting list): it now
  drafts only after its shadow checks in the request agree for a stretch (``CopyFirstDrafter.copy_trusted``).
"""

from __future__ import annotations

import pytest
import torch

import engine.text.token_frequency as tf
from engine.models.pruned_head import PrunedHead
from engine.contract.protocol import LoadSpec
from engine.runtime import ModelRuntime
from engine.sampling.sampler import SamplingOptions
from engine.speculative.copy_first import CopyFirstDrafter
from engine.speculative.drafter import DraftContext, Drafter, Proposal
from engine.speculative.full_head_check import CheckPrice, correct_chain
from engine.speculative.ngram import NgramDrafter
from tests.engine.speculative.test_speculation import generate, write_model

PROMPTS = ["def fib(n): return the", "Once upon a time, in a quiet", "1, 2, 3, 4, 5,"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("defaults")
    return d, write_model(d, "target", 0), write_model(d, "self", 0)


@pytest.fixture
def pruned_self_engine(models):
    """A target drafting for itself with a head pruned to a ninth of its vocabulary (the default keeps 16,384
    of Qwen2.5's 151,936), from a reference text that misses most of what the model writes. A new engine
    for each test: the head learns the tokens of the requests it drafted for."""
    d, target, draft = models
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tf, "reference_corpus", lambda limit=0: ["the def return in an self print " * 20])
        engine = ModelRuntime.load(LoadSpec(model_path=str(target), draft_path=str(draft), num_ctx=128,
                                            weight_format="f32", draft_weight_format="f32", device="cpu",
                                            draft_vocab=284 // 9, pack_dir=str(d / "packs")))
    yield engine
    engine.close()


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("options", [{}, {"draft_num_predict": 4, "draft_schedule": "fixed"}],
                         ids=["defaults", "fixed-n4"])
def test_a_self_draft_accepts_every_draft_with_default_options(pruned_self_engine, prompt, options):
    drafter = pruned_self_engine.drafters["model"]
    assert isinstance(drafter.model.output, PrunedHead)
    corrected = drafter.corrected
    plain = generate(pruned_self_engine, prompt, temperature=0, num_predict=40, drafter="none")
    pruned_self_engine.outputs.clear()  # the earlier runs' answers would draft this one instead of the model
    run = generate(pruned_self_engine, prompt, temperature=0, num_predict=40, **options)
    assert run.tokens == plain.tokens
    assert run.spec.drafter == "model+suffix" and run.spec.draft_n > 0
    assert run.spec.draft_n_accepted == run.spec.draft_n
    if options:  # every round drafts: the pruned head alone would have missed some of these tokens
        assert drafter.corrected > corrected


# -- the full head's correction of a pruned chain ------------------------------------------------------------


def test_the_chain_check_is_priced_by_how_often_the_text_leaves_the_heads_tokens():
    """A check costs its time whatever it finds and gains a token where the target's token is one the pruned head
    could not score: it runs when that rate, the drafter's acceptance and a target step's time make it pay."""
    price = CheckPrice()
    assert price.worth(2, 0.03) and price.worth(2, None)  # not timed yet; a fixed depth prices nothing
    price.observe_check(0.003)
    price.observe_round([5, 6], [5, 7])  # the drafter's acceptance falls below the always-check threshold
    price.observe_round([8], [9])
    assert price.acceptance.estimate < price.always_above
    price.observe_committed(200, 0)  # a text (code) whose every token the head scores
    assert not price.worth(1, 0.03) and not price.worth(4, 0.03)
    assert price.worth(4, 0.03 * 1000)  # a slow enough target step makes even a rare rescue pay
    price.observe_committed(50, 30)  # a text (Chinese) that leaves the head's tokens at every other token
    assert price.worth(1, 0.03)
    price.begin_request()  # a new request starts from the prior, not the last text's rate
    assert price.rate == price.prior
    perfect = CheckPrice()
    perfect.observe_check(0.003)
    perfect.observe_committed(200, 0)
    perfect.observe_round([5, 6], [5, 6])
    assert perfect.worth(1, 1e-6)  # a drafter that is always right is always checked (a self-draft keeps it all)


def test_a_draft_model_skips_the_check_only_where_it_would_not_pay(models):
    """The drafter's own bookkeeping feeds the price: its drafts against what was committed, and the generated
    tokens its pruned head had not scored; a chain it leaves unchecked is the pruned head's."""
    d, target, _ = models
    other = write_model(d, "other", 1)  # a drafter that disagrees with the target, so it is priced
    engine = ModelRuntime.load(LoadSpec(model_path=str(target), draft_path=str(other), num_ctx=128,
                                        weight_format="f32", draft_weight_format="f32", device="cpu",
                                        draft_vocab=200, pack_dir=str(d / "packs-other")))
    try:
        drafter = engine.drafters["model"]
        ctx = DraftContext(SamplingOptions(temperature=0), torch.Generator().manual_seed(0))
        drafter.begin([3, 4, 5, 6])

        def round_rejected(token_seconds: float | None) -> None:
            """A round of two drafts whose first the target rejects (committing another token)."""
            ctx.token_seconds = token_seconds
            drafts = drafter.propose(2, ctx).tokens
            drafter.commit([drafts[0] + 1], len(drafter.tokens) + 1)

        round_rejected(1e-9)  # a free target step: no rescue pays, but the check is timed once first
        assert drafter.checks_skipped == 0 and drafter.check_price.cost is not None
        round_rejected(1e-9)
        assert drafter.checks_skipped == 1
        round_rejected(1e9)  # a dear target step: every rescue pays
        assert drafter.checks_skipped == 1
        round_rejected(None)  # a fixed depth: always checked
        assert drafter.checks_skipped == 1
    finally:
        engine.close()


def test_a_greedy_chain_is_cut_where_the_full_head_disagrees():
    full = torch.tensor([[0.0, 3.0, 1.0, -1.0], [0.0, 0.0, 5.0, 9.0], [4.0, 0.0, 0.0, 0.0]])
    ctx = DraftContext(SamplingOptions(temperature=0), torch.Generator().manual_seed(0))
    prop = Proposal([1, 2, 0], None, [0.9, 0.8, 0.7])  # the pruned head could not score token 3
    fixed, replaced = correct_chain(prop, full, [], ctx, 4)
    assert fixed.tokens == [1, 3] and replaced == 1 and fixed.q is None
    unchanged, replaced = correct_chain(Proposal([1], None, [0.9]), full, [], ctx, 4)
    assert unchanged.tokens == [1] and replaced == 0


def test_a_sampled_draft_is_distributed_as_the_full_heads():
    """A token drawn from the pruned distribution and passed through the correction is distributed as the full
    head's distribution, which the proposal reports as its q (what the target's acceptance divides by)."""
    logits = torch.tensor([[1.0, 0.5, 0.0, 1.5, -0.5]])
    kept = torch.tensor([True, True, True, False, False])
    opts = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    q_full = torch.softmax(logits[0], -1)
    q_pruned = torch.softmax(logits[0].masked_fill(~kept, float("-inf")), -1)
    gen = torch.Generator().manual_seed(7)
    ctx = DraftContext(opts, gen)
    runs, counts = 20000, torch.zeros(5)
    for _ in range(runs):
        d = int(torch.multinomial(q_pruned, 1, generator=gen))
        prop, _ = correct_chain(Proposal([d], q_pruned[None], [float(q_pruned.max())]), logits, [], ctx, 5)
        counts[prop.tokens[0]] += 1
        assert torch.allclose(prop.q[0], q_full, atol=1e-6)
    expected = q_full * runs
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # 4 degrees of freedom, p = 0.001


# -- the copy earns its rounds -----------------------------------------------------------------------------


class Oracle(Drafter):
    """A perfect draft model: proposes the text's own continuation."""

    kind = "model"

    def __init__(self, text: list[int]):
        super().__init__()
        self.text = text

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        n = len(self.tokens)
        return Proposal(self.text[n:n + k], None, [1.0] * len(self.text[n:n + k]))


def count_tokens(upto: int) -> list[int]:
    """"1, 2, 3, ..." as a tokenizer that splits digits writes it: digits 0-9, ',' = 10, ' ' = 11."""
    out: list[int] = []
    for n in range(1, upto + 1):
        out += [int(c) for c in str(n)] + [10, 11]
    return out


def drive(text: list[int], prompt_len: int, k: int = 4) -> tuple[int, int, int]:
    """Decode ``text`` after its first ``prompt_len`` tokens with a copy-first drafter over a perfect model:
    (drafted, accepted, rounds the copy drafted)."""
    drafter = CopyFirstDrafter(Oracle(text), NgramDrafter())
    ctx = DraftContext(SamplingOptions(temperature=0), torch.Generator())
    drafter.begin(text[:prompt_len])
    n, drafted, accepted = prompt_len, 0, 0
    while n < len(text) - k - 1:
        drafter.round_source()
        prop = drafter.propose(k, ctx)
        a = 0
        while a < len(prop.tokens) and prop.tokens[a] == text[n + a]:
            a += 1
        drafted, accepted = drafted + len(prop.tokens), accepted + a
        run = text[n:n + a + 1]
        n += len(run)
        drafter.commit(run, n)
    return drafted, accepted, drafter.copied_rounds


def test_a_copy_that_looks_right_and_is_not_never_drafts():
    """A counting list agrees with its own earlier stretches on every comma and space: the copy would draft
    ``1, 2`` after ``21, 2`` and lose the round to a model that writes ``22``."""
    drafted, accepted, copied = drive(count_tokens(40), prompt_len=9)
    assert drafted > 100 and accepted == drafted and copied == 0


def test_a_rewrite_is_still_drafted_by_the_copy():
    source = [int(t) for t in torch.randint(12, 200, (80,), generator=torch.Generator().manual_seed(1))]
    text = source + [5, 6] + source  # the answer repeats its prompt
    drafted, accepted, copied = drive(text, prompt_len=len(source) + 2)
    assert accepted == drafted and copied >= 5
