"""The drafter interface: cheap proposers of the next few tokens, behind one interface (docs/speculation.md).

A drafter is built once when the model loads and keeps its state (caches, indexes) across requests;
each request opens a light session with ``begin``. The decode loop talks to every drafter the same
way, with no per-kind branches:

    begin(tokens)                         the committed log is ``tokens`` (a new prompt, or a rollback):
                                          sync to it, keeping whatever still matches
    propose(k, ctx) -> Proposal           up to k tokens (fewer when unsure or when it has nothing)
    commit(run, n_total, target=None)     the round committed ``run`` (the log is now n_total long):
                                          drop speculative state past the committed prefix, extend
    round_source() -> str                 what will draft the coming round (``kind``, unless the drafter
                                          switches source by round): the adaptive depth controller
                                          prices each source on its own

``target`` in ``commit`` is the target forward that produced the run (its pre-norm hidden states,
starting at ``target.start``); only drafters with ``needs_hidden`` use it, and the loop only pays for
hidden states when the drafter asks. Such a drafter can also only continue from a prefix it holds,
so the loop asks ``prefix_limit(tokens)`` before prefix reuse and re-evaluates the target from there.

Implementations, one file each: ``draft_model.DraftModelDrafter`` (an independent LM with its own KV
cache), ``ngram.NgramDrafter`` (prompt lookup, no weights), ``mtp.MtpDrafter`` (a DeepSeek/GLM NextN head
fed by the target's hidden states), ``assistant.AssistantDrafter`` (Gemma 4's assistant: the target's
hidden state and read-only KV cache, one fixed position, no state of its own), and ``NullDrafter`` here
(proposes nothing: plain decoding through the same loop).

Losslessness: ``Proposal.q`` holds, per drafted token, the distribution it was actually drawn from
(the strict rule needs exactly that), or None when every token is a point mass (greedy or n-gram).
"""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from engine.sampling.sampler import SamplingOptions, native_row_ops, process


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    q: Tensor | None = None  # [len(tokens), V] draft distributions; None = point masses
    confidences: list[float] = field(default_factory=list)  # drafter's top probability per token
    # Seconds spent catching up on a long run of tokens committed while the drafter sat idle (plain
    # steps). Real time, but owed by those earlier steps: the depth controller leaves it out of this
    # round's cost, or a probe after many plain steps would make drafting look dear and keep the
    # controller plain for ever.
    catchup_seconds: float = 0.0
    catchup_tokens: int = 0  # how many tokens that catch-up forwarded


EMPTY = Proposal([], None, [])


@dataclass
class TokenAcceptance:
    """A per-token acceptance estimate from drafts checked against committed tokens: decayed counts
    behind a Beta mean (``prior`` worth ``weight`` tokens)."""

    prior: float = 0.5
    weight: float = 2.0
    decay: float = 0.9  # per checked round: what the last ~10 rounds said
    hits: float = 0.0
    trials: float = 0.0
    streak: int = 0  # checked tokens that agreed since the last that did not

    def check(self, drafted: Sequence[int], committed: Sequence[int]) -> None:
        """Drafts ``drafted`` against the round's ``committed`` run: the agreeing prefix counts as accepted,
        the first disagreement as rejected, and nothing past it (or past the run) is known."""
        checked = min(len(drafted), len(committed))
        if checked == 0:
            return
        agree = 0
        while agree < checked and drafted[agree] == committed[agree]:
            agree += 1
        self.streak = self.streak + agree if agree == checked else 0
        self.hits = self.decay * self.hits + agree
        self.trials = self.decay * self.trials + agree + (1 if agree < checked else 0)

    @property
    def estimate(self) -> float:
        return (self.prior * self.weight + self.hits) / (self.weight + self.trials)


@dataclass
class DraftContext:
    """What a proposal may depend on besides the drafter's own state."""

    sampling: SamplingOptions
    generator: torch.Generator  # the drafter's own stream: its draws never shift the target's
    p_min: float = 0.0  # stop drafting when the top probability falls below this
    # What a target step costs now (the depth controller's estimate; None with a fixed depth): what a token
    # the round gains or loses is worth, for a drafter pricing optional work (a pruned head's chain check)
    token_seconds: float | None = None


@dataclass(frozen=True)
class TargetOutput:
    """Hidden states of a target forward: ``hidden[i]`` is the pre-norm state at position start + i; ``captured[i]``
    the residual stream at the layers the target records (``Model.capture_at``: an EAGLE-3 head's), if any."""

    start: int
    hidden: Tensor | None
    captured: Tensor | None = None

    def states(self, reads: str) -> Tensor | None:
        """What a head reads: ``prenorm`` (the last layer's output) or ``captured``."""
        return self.captured if reads == "captured" else self.hidden


class Drafter:
    kind = "none"
    needs_hidden = False
    sources: tuple[str, ...] = ()  # what ``round_source`` may name, for a drafter that switches by round
    # A source that competes with another: the depth controller may take the other one instead
    # (``use_source``), when it expects more tokens a second from it (engine.speculative.depth.PerSourceDepth).
    fallbacks: tuple[tuple[str, str], ...] = ()
    # Depth caps of some sources below the request's (``PerSourceDepth.caps``): a drafter whose sources differ in
    # how deep they pay (CopyFirstDrafter with the earlier outputs) drafts those to the request's cap only.
    source_caps: dict[str, int] = {}

    def __init__(self) -> None:
        self.tokens: list[int] = []  # the committed log as this drafter knows it

    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """The longest prefix of ``tokens`` the target may keep cached for this drafter to continue."""
        return len(tokens)

    def begin(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        return EMPTY

    def backlog(self) -> int:
        """Tokens of the committed log a draft model forwards before its next proposal (0: none to catch up on)."""
        return 0

    def round_source(self) -> str:
        """What will draft the coming round; asked before the depth is chosen."""
        return self.kind

    def use_source(self, source: str) -> None:
        """Draft the coming round from ``source`` (one of ``sources``) instead of what round_source said."""

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self.tokens.extend(int(t) for t in tokens_committed)
        if len(self.tokens) != n_total:
            raise RuntimeError(f"{self.kind} drafter out of sync: log of {len(self.tokens)} tokens, "
                               f"the decoder says {n_total}")

    def reset(self) -> None:
        """Forget everything (after an error left the state in doubt)."""
        self.tokens = []

    def fork(self, target_cache) -> "Drafter":
        """A drafter over the same weights with state of its own, for another sequence whose target cache is
        ``target_cache`` (engine.batching: one per sequence slot)."""
        return type(self)()

    def memory_bytes(self) -> int:
        return 0


class NullDrafter(Drafter):
    """No speculation: the loop takes plain steps (depth 0)."""


def sample_chain(k: int, ctx: DraftContext, history: list[int], vocab_size: int, logits: Tensor,
                 advance: Callable[[int], Tensor], catchup_seconds: float = 0.0, catchup_tokens: int = 0) -> Proposal:
    """Up to ``k`` drafts sampled one after another: ``logits`` [1, V] give the first, ``advance(token)``
    feeds a drafted token back and returns the next row (a model forward, a head step). Stops early
    when the drafter's confidence falls below ``ctx.p_min``; ``advance`` is not called after the last."""
    drafts: list[int] = []
    qs: list[Tensor | None] = []
    confs: list[float] = []
    for i in range(k):
        row = fit_vocab(logits, vocab_size)
        conf = confidence(row)
        if conf < ctx.p_min:
            break
        token, q = draw(row, history + drafts, ctx)
        drafts.append(token)
        qs.append(q)
        confs.append(conf)
        if i + 1 < k:
            logits = advance(token)
    return Proposal(drafts, stack(qs), confs, catchup_seconds, catchup_tokens)


# Helpers every drafter that samples from logits shares.
def fit_vocab(logits: Tensor, vocab: int) -> Tensor:
    """Logits over the target's vocabulary: cut a larger draft vocabulary, pad a smaller one."""
    n = logits.shape[-1]
    if n == vocab:
        return logits
    if n > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - n), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


def confidence(logits: Tensor) -> float:
    """The drafter's top probability at temperature 1 (what draft_p_min is compared with, as in
    llama.cpp: a temperature-0 request would otherwise always be 'certain')."""
    rows = logits.float().reshape(-1, logits.shape[-1])
    ops = native_row_ops(rows)
    if ops is not None:  # one pass, without writing the probabilities of a whole vocabulary
        return float(ops.logits_top_probability(rows).amax().item())
    return float(torch.softmax(rows, dim=-1).amax().item())


def draw(logits: Tensor, history: list[int], ctx: DraftContext) -> tuple[int, Tensor | None]:
    """One draft token from the drafter's own filtered distribution, and that distribution."""
    dist = process(logits, history, (), ctx.sampling)
    token = int(dist.sample(ctx.generator)[0])
    return token, (None if dist.greedy else dist.probs[0])


def stack(rows: list[Tensor | None]) -> Tensor | None:
    if not rows or rows[0] is None:
        return None
    return torch.stack(rows)
