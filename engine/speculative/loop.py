"""The decode loop: one loop for plain and speculative decoding, whatever the drafter.

Every step is a *round* (docs/speculation.md, "Vocabulary"):

1. the depth controller picks ``k`` (0 = a plain step), clamped to the tokens left in ``num_predict``
   and the room left in the context;
2. the drafter proposes up to ``k`` tokens ``d_1..d_m`` with the distributions they were drawn from;
3. ONE target forward over ``[t_last, d_1..d_m]`` gives logits for ``m + 1`` positions, which the
   sampling pipeline turns into ``p_1..p_{m+1}`` (drafts in flight count as penalty history);
4. the acceptance rule keeps ``d_1..d_a`` and one more token (residual or bonus sample);
5. the run is cut at the first end-of-generation token and at ``num_predict``; the target cache is
   truncated to the committed prefix (a length), the WHOLE run is recorded in the token log, the
   drafter is told (and given the forward's hidden states), and only then is anything streamed.

Prompt evaluation is the same round with a long input and no drafts, so the first token goes
through the same acceptance and commit path (``k = 0`` acceptance is exactly a plain sample).

State invariant between rounds: ``log`` is the committed token log; the target cache holds exactly
``log[:-1]`` (the last token is sampled but not yet forwarded) and every drafter has been told the
whole log. Stop strings and cancellation are handled between rounds, so they never split a round.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

import torch

from engine.cache.protocol import SequenceCache
from engine.contract.protocol import GenerateResult, TokenChunk, TokenLogprob
from engine.sampling.constrain import TokenConstraint
from engine.sampling.sampler import Distribution, SamplingOptions, process
from engine.speculative.acceptance import (
    AcceptResult,
    match_accept,
    relaxed_accept,
    strict_accept,
)
from engine.speculative.depth import DepthController
from engine.speculative.drafter import EMPTY, DraftContext, Drafter, TargetOutput
from engine.contract.speculation_stats import SpeculationStats
from engine.contract.special_tokens import ThinkTags
from engine.text.stops import TextStream

TRACE_ENV = "TANDEM_DRAFT_TRACE"


def trace_from_env() -> bool:
    """Whether TANDEM_DRAFT_TRACE asks for the verification trace of every request.

    An operator's switch that needs no client change; the engine reads it here and nowhere else
    (``ModelRuntime.settings`` ORs it with the request's ``draft_trace`` option).
    """
    return os.environ.get(TRACE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DecodeSettings:
    """Everything a request decided, resolved to plain values."""

    sampling: SamplingOptions
    num_ctx: int  # usable context (<= the cache capacity)
    num_predict: int = -1  # > 0: limit; -2: until the context is full; otherwise unlimited
    num_keep: int = 4  # tokens kept at the start when the context shifts
    shift: bool = True
    cap: int = 0  # draft depth cap (0 = no speculation)
    schedule: str = "adaptive"
    p_min: float = 0.0
    n_min: int = 0
    relaxed_top_n: int = 0
    # relaxed_scope "thinking": the tags of the reasoning block the relaxed rule is limited to (None with
    # relaxed_scope "all"); a model without them gets the strict rule everywhere.
    relaxed_within: ThinkTags | None = None
    relaxed_scope: str = "all"
    rule: str = "strict"  # strict | match (llama.cpp's rule, for measurements); relaxed via relaxed_top_n
    logprobs: bool = False
    top_logprobs: int = 0
    trace: bool = False
    stops: tuple[str, ...] = ()
    eog_ids: frozenset[int] = frozenset()
    prefill_chunk: int = 512


@dataclass
class TimeBreakdown:
    """Where a request's decode time went, in seconds (the benchmark explains misses with it)."""

    prefill: float = 0.0
    drafting: float = 0.0  # drafter.propose + drafter.commit
    verify: float = 0.0  # target forwards of the rounds
    accept: float = 0.0  # sampling pipeline + acceptance rule
    other: float = 0.0  # bookkeeping, text, logprobs (the rest of each round)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.__dict__.items()}


@dataclass
class _Committed:
    """One round's outcome, already recorded in the log."""

    tokens: list[int]  # committed and to be streamed (cut at EOG / num_predict)
    dist: Distribution  # target distributions of the round; row i produced tokens[i]
    end: str | None  # 'stop' (end-of-generation token) | 'length' (num_predict) | None
    result: AcceptResult | None = None
    drafts: list[int] = field(default_factory=list)


class DecodeLoop:
    def __init__(self, *, target, cache: SequenceCache, tokenizer, drafter: Drafter, controller: DepthController,
                 settings: DecodeSettings, target_gen: torch.Generator, draft_gen: torch.Generator,
                 clock: Callable[[], float] = time.perf_counter, constraint: TokenConstraint | None = None):
        self.target = target
        self.cache = cache
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.controller = controller
        self.s = settings
        self.gen = target_gen
        self.draft_ctx = DraftContext(settings.sampling, draft_gen, settings.p_min)
        self.clock = clock
        # ``format`` (engine.sampling.constrain): cuts each draft chain at its first disallowed token,
        # masks every verified row, follows the committed tokens and ends the output when the JSON
        # value closes. Acceptance sees only masked rows, so speculation stays lossless under it.
        self.constraint = constraint
        self.log: list[int] = []
        self.generated: list[int] = []
        self.stats = SpeculationStats(drafter=drafter.kind if settings.cap > 0 else "none")
        if settings.trace:
            self.stats.trace = []
        self.times = TimeBreakdown()
        self._rounds = 0
        self._last_commit_drafting = 0.0
        self._reasoning = False  # relaxed_scope "thinking": the committed log leaves the block open

    # ------------------------------------------------------------------------------------------
    # the loop
    # ------------------------------------------------------------------------------------------
    def run(self, prompt: Sequence[int], should_stop: Callable[[], bool]) -> Generator[TokenChunk, None, GenerateResult]:
        s = self.s
        text = TextStream(self.tokenizer.incremental_decoder(), s.stops)
        # Streamed-later tokens: (index in self.generated, id, logprob). A chunk goes out when it has
        # text (or logprobs were asked for); tokens whose text is held back wait for the next one.
        pending: list[tuple[int, int, TokenLogprob | None]] = []

        def chunk(txt: str) -> TokenChunk:
            ids = [t for _, t, _ in pending]
            lps = [lp for _, _, lp in pending] if s.logprobs else None
            pending.clear()
            return TokenChunk(txt, ids, lps)

        if s.cap > 0:
            self.controller.begin_request()
        if s.relaxed_within is not None:  # a prompt that ends inside an open block (a thinking prefill)
            self._reasoning = s.relaxed_within.inside_after(prompt, False)
        t_start = self.clock()
        self.cache.reset_snapshot_peak()
        cached, committed = self._evaluate(list(prompt))
        t_prompt = self.clock()
        self.times.prefill = t_prompt - t_start
        reason: str | None = None

        while True:
            # Stream the round; it is already recorded in the log and the caches.
            first = len(self.generated) - len(committed.tokens)
            pieces = []
            for i, tok in enumerate(committed.tokens):
                lp = self._logprob(committed.dist, i, tok) if s.logprobs else None
                pending.append((first + i, tok, lp))
                piece, stopped = text.push(tok)
                pieces.append(piece)
                if stopped:
                    reason = "stop"
                    self._drop_after_stop(text.visible_tokens())
                    pending[:] = [e for e in pending if e[0] < len(self.generated)]
                    break
            joined = "".join(pieces)
            if joined or (s.logprobs and pending):
                yield chunk(joined)
            if reason is None:
                reason = committed.end
            if reason is not None:
                break
            if should_stop():  # between rounds: the log and every cache agree here
                reason = "stop"
                break
            if len(self.log) > s.num_ctx:  # the pending token does not fit
                if not self._can_shift():
                    reason = "length"
                    break
                committed = self._shift()
                continue
            committed = self._round()

        tail = "" if text.stopped else text.finish()
        if tail or pending:
            yield chunk(tail)
        t_end = self.clock()
        self.stats.snapshot_bytes = self.cache.snapshot_peak
        return GenerateResult(
            done_reason=reason,
            prompt_eval_count=len(prompt),
            prompt_cached=cached,
            prompt_eval_duration_ns=int((t_prompt - t_start) * 1e9),
            eval_count=len(self.generated),
            eval_duration_ns=int((t_end - t_prompt) * 1e9),
            context=list(prompt) + self.generated,
            speculation=self.stats,
        )

    # ------------------------------------------------------------------------------------------
    # prompt evaluation (also used to rebuild after a context shift)
    # ------------------------------------------------------------------------------------------
    def _evaluate(self, log: list[int]) -> tuple[int, _Committed]:
        """Make the cache hold ``log`` (reusing its longest common prefix), sample the next token."""
        self.log = log
        drafting_before = self.times.drafting  # evaluation time is prompt (or shift) time, not drafting
        # keeps at most len(log) - 1: the last position gives logits. A drafter fed by the target's hidden
        # states holds its own prefix, and the target resumes no later than it (each cache restores to an
        # offset it can, which for recurrent layers is a recorded one, not any length).
        limit = self.drafter.prefix_limit(log) + 1 if self.drafter.needs_hidden else len(log)
        n = self.cache.reuse_prefix(log[:limit])
        self.drafter.begin(log)
        need_hidden = self.drafter.needs_hidden
        tail = log[n:]
        hidden, captured = [], []
        logits = None
        # A batched target sizes each chunk by who else is in flight (engine.batching.policy); a lone model takes
        # the settings' chunk
        chunk_rows = getattr(self.target, "prompt_chunk", lambda requested: requested)
        i = 0
        while i < len(tail):
            step = chunk_rows(self.s.prefill_chunk)
            last = i + step >= len(tail)
            out = self.target.forward(tail[i:i + step], self.cache, logits_for="last" if last else "none",
                                      return_hidden=need_hidden)
            i += step
            if need_hidden:
                hidden.append(out.prenorm_hidden)
                if out.captured is not None:
                    captured.append(out.captured)
                out = out.logits
            if last:
                logits = out
        dist = process(logits, self.log, (), self.s.sampling)
        if self.constraint is not None:
            dist = self.constraint.mask(dist)
        res = self._accept(dist, None, [])
        target_out = TargetOutput(n, torch.cat(hidden), torch.cat(captured) if captured else None) \
            if need_hidden else None
        committed = self._commit(res, dist, [], len(log) - 1, target_out)
        self.stats.target_forwards += 1
        self.times.drafting = drafting_before
        return n, committed

    # ------------------------------------------------------------------------------------------
    # one round
    # ------------------------------------------------------------------------------------------
    def _depth(self) -> int:
        s = self.s
        k = self.controller.choose(s.cap) if s.cap > 0 else 0
        k = min(k, s.cap, s.num_ctx - len(self.log))  # positions P..P+k must fit
        if s.num_predict > 0:
            k = min(k, s.num_predict - len(self.generated) - 1)  # a round commits up to k + 1
        return max(0, k)

    def _round(self) -> _Committed:
        s = self.s
        P = len(self.log) - 1
        k = self._depth()
        t0 = self.clock()
        if k > 0:
            self.draft_ctx.token_seconds = self.controller.token_seconds()
        prop = self.drafter.propose(k, self.draft_ctx) if k > 0 else EMPTY
        drafts = [int(t) for t in prop.tokens[:k]]
        q = prop.q[: len(drafts)] if (prop.q is not None and drafts) else None
        states = None
        if self.constraint is not None and drafts:
            # Cut the chain where the constraint stops it (whatever the drafter): a draft that breaks
            # the JSON could never be accepted from a masked row, so verifying it is wasted width.
            states = self.constraint.walk(drafts)
            drafts = drafts[: len(states) - 1]
            q = q[: len(drafts)] if (q is not None and drafts) else None
        if s.schedule == "fixed" and len(drafts) < s.n_min:
            drafts, q, states = [], None, None  # too short to be worth a wider verification
        t1 = self.clock()
        out = self.target.forward([self.log[-1]] + drafts, self.cache, logits_for="all",
                                  return_hidden=self.drafter.needs_hidden)
        if self.drafter.needs_hidden:
            logits, target_out = out.logits, TargetOutput(P, out.prenorm_hidden, out.captured)
        else:
            logits, target_out = out, None
        t2 = self.clock()
        dist = process(logits, self.log, drafts, s.sampling)
        if self.constraint is not None:
            dist = self.constraint.mask(dist, states[: len(drafts) + 1] if states else None)
        res = self._accept(dist, q, drafts)
        t3 = self.clock()
        committed = self._commit(res, dist, drafts, P, target_out)
        t4 = self.clock()
        drafting = (t1 - t0) - prop.catchup_seconds + self._last_commit_drafting
        self.controller.observe(k, len(drafts), res.n_accepted, (t4 - t0) - prop.catchup_seconds, drafting)
        if prop.catchup_tokens > 0:
            self.controller.observe_catchup(prop.catchup_tokens, prop.catchup_seconds)

        self.times.drafting += t1 - t0
        self.times.verify += t2 - t1
        self.times.accept += t3 - t2
        self.times.other += (t4 - t3) - self._last_commit_drafting
        self._record(k, drafts, res, P)
        return committed

    def _accept(self, dist: Distribution, q, drafts: list[int]) -> AcceptResult:
        p = dist  # the rules read its candidates, never a dense [k + 1, vocab] copy
        if self.s.rule == "match":
            return match_accept(p, q, drafts, self.gen)
        if self.s.relaxed_top_n > 0:
            return relaxed_accept(p, q, drafts, self.gen, self.s.relaxed_top_n, self._relaxed_positions(drafts))
        return strict_accept(p, q, drafts, self.gen)

    def _relaxed_positions(self, drafts: list[int]) -> list[bool] | None:
        """relaxed_scope: None (every position) for ``all``; for ``thinking``, the drafted positions
        inside the reasoning block, decided from the committed log and the earlier drafts."""
        s = self.s
        if s.relaxed_scope == "all":
            return None
        if s.relaxed_within is None:
            return [False] * len(drafts)
        return s.relaxed_within.reasoning_positions(drafts, self._reasoning)

    def _commit(self, res: AcceptResult, dist: Distribution, drafts: list[int], P: int,
                target_out: TargetOutput | None) -> _Committed:
        """Cut the run, truncate the cache, record the run, tell the drafter. Nothing streamed yet."""
        run, end = self._cut(res.tokens)
        if self.constraint is not None:
            for j, t in enumerate(run):
                self.constraint.advance_token(t)
                if self.constraint.done():  # the JSON value is closed (llama.cpp's grammar ends there too)
                    if j + 1 < len(run):
                        run, end = run[: j + 1], "stop"
                    else:
                        end = end or "stop"
                    break
        new_len = len(self.log) + len(run)
        # The cache holds positions up to P + k; keep t_last and the accepted drafts (never more
        # than the log, when the run was cut before them).
        self.cache.truncate(min(P + 1 + res.n_accepted, new_len, self.cache.length))
        self.log.extend(run)
        self.generated.extend(run)
        if self.s.relaxed_within is not None:
            self._reasoning = self.s.relaxed_within.inside_after(run, self._reasoning)
        t0 = self.clock()
        self.drafter.commit(run, len(self.log), target_out)
        self._last_commit_drafting = self.clock() - t0
        self.times.drafting += self._last_commit_drafting
        return _Committed(run, dist, end, res, drafts)

    def _cut(self, run: list[int]) -> tuple[list[int], str | None]:
        """The run up to (not including) the first end-of-generation token, and within num_predict."""
        out: list[int] = []
        budget = self.s.num_predict - len(self.generated) if self.s.num_predict > 0 else None
        for t in run:
            if t in self.s.eog_ids:
                return out, "stop"
            if budget is not None and len(out) >= budget:
                return out, "length"
            out.append(t)
        if budget is not None and len(out) >= budget:
            return out, "length"
        return out, None

    # ------------------------------------------------------------------------------------------
    # context
    # ------------------------------------------------------------------------------------------
    def _keep_discard(self) -> tuple[int, int]:
        keep = max(0, min(self.s.num_keep, self.s.num_ctx - 1))
        return keep, (len(self.log) - 1 - keep) // 2

    def _can_shift(self) -> bool:
        return self.s.shift and self.s.num_predict != -2 and self._keep_discard()[1] > 0

    def _shift(self) -> _Committed:
        """Ollama's context shift: keep num_keep tokens, drop half of the rest, and re-evaluate what
        remains (exact: the cache is rebuilt from the kept tokens, at the price of a prefill)."""
        keep, discard = self._keep_discard()
        return self._evaluate(self.log[:keep] + self.log[keep + discard:])[1]

    def _drop_after_stop(self, visible: int) -> None:
        """A stop string ended the output: forget the tokens it (partly) covered, everywhere."""
        drop = len(self.generated) - visible
        if drop <= 0:
            return
        del self.generated[visible:]
        del self.log[len(self.log) - drop:]
        # Keep the longest prefix of the log the cache can cut back to: for an attention cache that is all
        # of it, a recurrent cache (engine.cache.recurrent) only resumes where it recorded a state.
        self.cache.reuse_prefix(self.log, leave_last=False)
        self.drafter.begin(self.log)

    # ------------------------------------------------------------------------------------------
    # reporting
    # ------------------------------------------------------------------------------------------
    def _record(self, k: int, drafts: list[int], res: AcceptResult, P: int) -> None:
        st = self.stats
        st.target_forwards += 1
        st.depth_sum += k
        if not drafts:
            st.plain_steps += 1
        if drafts:
            st.draft_rounds += 1
            st.draft_n += len(drafts)
            st.draft_n_accepted += res.n_accepted
            while len(st.drafted_per_position) < len(drafts):
                st.drafted_per_position.append(0)
                st.accepted_per_position.append(0)
            for i in range(len(drafts)):
                st.drafted_per_position[i] += 1
                if i < res.n_accepted:
                    st.accepted_per_position[i] += 1
            for d in res.decisions:
                st.evaluated += 1
                st.strict_accept_sum += d.strict_probability
                st.match_accept_sum += d.match_probability
        if st.trace is not None and drafts:
            piece = self._piece
            for d in res.decisions:
                st.trace.append({
                    "round": self._rounds,
                    "position": P + 1 + d.position,
                    "draft_token": d.draft_token,
                    "draft_text": piece(d.draft_token),
                    "target_token": d.target_token,
                    "target_text": piece(d.target_token),
                    "rank": d.draft_rank,
                    "p": round(d.draft_prob, 6),
                    "q": round(d.draft_q, 6),
                    "pool_size": d.pool_size,
                    "decision": d.decision,
                    "emitted_token": d.emitted_token,
                })
        self._rounds += 1

    def _piece(self, token: int) -> str:
        try:
            return self.tokenizer.token_to_piece(token).decode("utf-8", errors="replace")
        except IndexError:
            return ""

    def _logprob(self, dist: Distribution, row: int, token: int) -> TokenLogprob:
        def entry(t: int) -> tuple[str, list[int]]:
            try:
                b = self.tokenizer.token_to_piece(t)
            except IndexError:
                b = b""
            return b.decode("utf-8", errors="replace"), list(b)

        text, raw = entry(token)
        top = []
        for t, lp in dist.top_logprobs(row, self.s.top_logprobs):
            tt, tb = entry(t)
            top.append((tt, lp, tb))
        return TokenLogprob(text, dist.logprob(row, token), raw, top)
