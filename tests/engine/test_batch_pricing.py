"""Speculation priced by the batch (issue 34): a sequence that shares its forwards with others drafts only when
that raises the batch's tokens per second, judged from what a forward of the batch's total width costs."""

from __future__ import annotations

from engine.batching.step_loop import BatchedModel, StepLoop
from engine.speculative.depth import AdaptiveDepth, DraftingPeers, RecentTimes, WidthCosts

# Seconds of one forward of the 1.5B by rows, AMD EPYC Zen 3, 2 cores (python -m benchmarks.decode
# <1.5B> --widths 1,2,4,8,16 --no-llama: 33.8 ms, x1.06, x1.51, x2.83, x5.54)
ZEN3 = {1: 0.0338, 2: 0.0358, 4: 0.0510, 8: 0.0957, 16: 0.1873}
# A host where width is cheaper (the figures: x1.09, x1.31, x1.82, x3.35)
CHEAP_WIDTH = {1: 0.030, 2: 0.0327, 4: 0.0393, 8: 0.0546, 16: 0.1005}


def table(points: dict[int, float]) -> WidthCosts:
    t = WidthCosts()
    for w, s in points.items():
        t.add(w, s)
    return t


def trained(points: dict[int, float], sequences: int, draft_token_s: float) -> AdaptiveDepth:
    """A controller that has seen every round accepted whole, with a drafter costing ``draft_token_s`` a token."""
    ctl = AdaptiveDepth(verify_times=table(points), load=lambda: sequences)
    for _ in range(40):
        ctl.observe(4, 4, 4, seconds=1.0, drafting=4 * draft_token_s)
    return ctl


def drafting_pair(points: dict[int, float], draft_token_s: float) -> tuple[AdaptiveDepth, AdaptiveDepth, DraftingPeers]:
    """Two sequences of one pair sharing each forward, both trained on rounds accepted whole, both drafting."""
    peers = DraftingPeers()
    a, b = (AdaptiveDepth(verify_times=table(points), load=lambda: 2, peers=peers) for _ in range(2))
    for ctl in (a, b):
        for _ in range(40):
            ctl.observe(4, 4, 4, seconds=1.0, drafting=4 * draft_token_s)
        peers.join(ctl)
    return a, b, peers


def test_a_step_shared_by_sequences_is_priced_at_the_batch_width():
    t = table(ZEN3)
    ctl = AdaptiveDepth(verify_times=t, load=lambda: 4)
    before = dict(t.points())
    ctl.observe(2, 2, 1, seconds=0.5, drafting=0.01)  # a loaded step's wall time: the batch's, waits included
    assert t.points() == before  # the step loop records the batch's steps, by their total width
    assert ctl.cost(0) == t.estimate(4)
    d = ctl.drafting_cost(2)
    assert abs(ctl.cost(2) - (t.estimate(4) + 4 * (t.estimate(6) - t.estimate(4) + d))) < 1e-12


def test_a_draft_model_drafts_alone_and_not_beside_other_sequences_on_a_host_where_width_is_dear():
    # a 0.5B drafter: 12 ms a token against the 1.5B's 34 ms, every draft accepted
    assert trained(ZEN3, 1, 0.012).best(8) > 0
    for sequences in (2, 4, 8):
        assert trained(ZEN3, sequences, 0.012).best(8) == 0


def test_sequences_that_all_draft_from_one_draft_model_are_priced_together():
    """Their draft forwards share the step loop's draft steps: two sequences of a pair drafting alike pay one
    drafting and one verification over both rounds' rows, which pays on Zen 3's widths where one drafting beside
    an idle-waiting sequence does not; at eight, the sixteen-row verification costs more than it commits."""
    for sequences, drafts in ((2, True), (4, False), (8, False)):
        peers = DraftingPeers()
        ctls = []
        for _ in range(sequences):
            ctl = AdaptiveDepth(verify_times=table(ZEN3), load=lambda n=sequences: n, peers=peers)
            for _ in range(40):
                ctl.observe(4, 4, 4, seconds=1.0, drafting=4 * 0.012)
            peers.join(ctl)
            ctls.append(ctl)
        assert (ctls[0].best(8) > 0) == drafts, sequences
    # a peer whose controller chose plain no longer counts: priced as drafting alone beside it
    a, b, peers = drafting_pair(ZEN3, 0.012)
    assert a.best(8) > 0 and peers.besides(a) == 1
    peers.mark(b, False)
    assert peers.besides(a) == 0 and a.best(8) == 0
    peers.leave(b)
    peers.mark(b, True)  # a member that left is not counted again
    assert peers.besides(a) == 0


def test_a_draft_model_does_not_slow_a_sequence_beside_it_that_does_not_draft():
    """A code request beside a prose one: where width is cheap and the drafter quick (5 ms a token against a 33 ms
    step), drafting 4 deep would raise the pair's tokens a second, but each of the prose request's steps would
    take twice as long; timed to the last answer, the burst of the two is slower. Beside a peer that drafts too,
    the two gain together and draft."""

    def pair(other_drafts: bool) -> AdaptiveDepth:
        a, b, peers = drafting_pair(CHEAP_WIDTH, 0.005)
        peers.mark(b, other_drafts)
        return a

    beside_plain = pair(other_drafts=False)
    assert beside_plain.best(8) == 0
    # the batch's tokens a second alone would have it draft: 5 tokens in 0.0327 + 2 x 0.034 s against 1 in 0.0327
    assert beside_plain.throughput(4) > beside_plain.throughput(0)
    assert pair(other_drafts=True).best(8) > 0
    # a drafter with no draft model (an n-gram, a copy) has no peers to spare: priced by the batch as before
    assert trained(CHEAP_WIDTH, 2, 0.0).best(8) > 0


def test_a_free_drafter_still_drafts_beside_other_sequences_where_width_is_cheap():
    # an n-gram or copy proposal costs nothing; four rows cost 1.31 of one
    assert trained(CHEAP_WIDTH, 4, 0.0).best(8) > 0
    assert trained(ZEN3, 8, 0.0).best(8) == 0  # eight rows already cost 2.8 of one: none to spare


class Call:
    def __init__(self, tokens, logits_for="all"):
        self.tokens, self.logits_for = tokens, logits_for


def test_the_step_loop_records_decode_steps_by_their_total_width():
    """Drafts and steps carrying a prompt chunk are not verification widths; a verification of 3 beside two
    single rows is a step of 5."""
    recorded: list[tuple[int, float]] = []
    loop = StepLoop(run_batch=lambda model, calls: [None] * len(calls), on_step=lambda w, s: recorded.append((w, s)))
    target, draft = BatchedModel(object(), loop, draft=False), BatchedModel(object(), loop, draft=True)

    def together(*calls):
        for model, tokens, logits_for in calls:
            loop.start(lambda model=model, tokens=tokens, logits_for=logits_for:
                       model.forward(tokens, None, logits_for=logits_for))
        while loop.busy:
            loop.step()

    together((target, [1, 2, 3], "all"), (target, [4], "all"), (target, [5], "all"))
    assert [w for w, _ in recorded] == [5] and recorded[0][1] >= 0
    together((draft, [1], "all"), (draft, [2], "all"))
    together((target, list(range(10)), "last"), (target, [4], "all"))
    assert [w for w, _ in recorded] == [5]


def test_a_draft_model_behind_by_its_prompt_stays_plain_where_catching_up_would_stall_the_batch():
    """Beside other sequences a draft model reads its request's prompt lazily, at its first proposal, in a forward
    that every sequence waits through (a 75-token catch-up of the 0.5B held a batch of eight for 180-340 ms, for a
    one-token round). Its controller prices that catch-up by the tokens the drafter reports it lacks, at what any
    slot's catch-ups measured, for every sequence that waits; in step with its drafter it drafts as before."""
    peers, shared = DraftingPeers(), RecentTimes()
    ctls = []
    for _ in range(8):
        ctl = AdaptiveDepth(verify_times=table(CHEAP_WIDTH), load=lambda: 8, peers=peers, catchup_times=shared)
        for _ in range(40):
            ctl.observe(4, 4, 4, seconds=1.0, drafting=4 * 0.006)
        peers.join(ctl)
        ctls.append(ctl)
    lacks = {"tokens": 75}
    a = ctls[0]
    a.backlog = lambda: lacks["tokens"]
    assert a.best(8) > 0  # eight drafting alike pay on these widths, the catch-up aside
    assert a.choose(8) > 0  # no catch-up measured anywhere yet: nothing to price it by
    ctls[5].observe_catchup(75, 0.090)  # another slot's drafter caught up on 75 tokens in 90 ms
    assert a.choose(8) == 0
    lacks["tokens"] = 1  # in step: its last round drafted
    assert a.choose(8) > 0


def test_alone_a_request_drafts_whatever_prompt_its_drafter_has_yet_to_read():
    """Alone, the unread prompt is read once a request whatever is chosen (a lone model's drafter reads it with
    the prompt), and a long request repays it: only the plain steps since the drafter last ran are priced. The same
    backlog beside another sequence, which would wait through it, keeps the round plain."""
    shared = RecentTimes()
    sequences = {"n": 1}
    ctl = AdaptiveDepth(verify_times=table(CHEAP_WIDTH), load=lambda: sequences["n"], catchup_times=shared,
                        backlog=lambda: 2000)
    for _ in range(40):
        ctl.observe(4, 4, 4, seconds=1.0, drafting=4 * 0.006)
    shared.add(0.002)  # 2 ms a token caught up: 4 s for the prompt, more than 32 tokens of drafting save
    assert ctl.choose(8) > 0
    ctl.observe(0, 0, 0, seconds=0.03)  # a plain step: one token behind besides the prompt
    assert ctl.choose(8) > 0
    sequences["n"] = 2
    assert ctl.best(8) > 0 and ctl.choose(8) == 0
