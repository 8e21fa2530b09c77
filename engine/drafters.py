"""Drafters: cheap proposers of the next few tokens, behind one interface (docs/speculation.md).

A drafter is built once when the model loads and keeps its state (caches, indexes) across requests;
each request opens a light session with ``begin``. The decode loop talks to every drafter the same
way, with no per-kind branches:

    begin(tokens)                         the committed log is ``tokens`` (a new prompt, or a rollback):
                                          sync to it, keeping whatever still matches
    propose(k, ctx) -> Proposal           up to k tokens (fewer when unsure or when it has nothing)
    commit(run, n_total, target=None)     the round committed ``run`` (the log is now n_total long):
                                          drop speculative state past the committed prefix, extend

``target`` in ``commit`` is the target forward that produced the run (its pre-norm hidden states,
starting at ``target.start``); only drafters with ``needs_hidden`` use it, and the loop only pays for
hidden states when the drafter asks. Such a drafter can also only continue from a prefix it holds,
so the loop asks ``prefix_limit(tokens)`` before prefix reuse and re-evaluates the target from there.

Implementations: ``DraftModelDrafter`` (an independent LM with its own KV cache), ``NgramDrafter``
(prompt lookup, no weights), ``MtpDrafter`` (a DeepSeek/GLM NextN head fed by the target's hidden
states), and ``NullDrafter`` (proposes nothing: plain decoding through the same loop).

Losslessness: ``Proposal.q`` holds, per drafted token, the distribution it was actually drawn from
(the strict rule needs exactly that), or None when every token is a point mass (greedy or n-gram).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import Tensor

from engine.kvcache import KVCache
from engine.sampler import SamplingOptions, process

__all__ = [
    "Proposal",
    "DraftContext",
    "TargetOutput",
    "Drafter",
    "NullDrafter",
    "DraftModelDrafter",
    "NgramDrafter",
    "MtpDrafter",
    "find_nextn_block",
    "model_bytes",
]


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


EMPTY = Proposal([], None, [])


@dataclass
class DraftContext:
    """What a proposal may depend on besides the drafter's own state."""

    sampling: SamplingOptions
    generator: torch.Generator  # the drafter's own stream: its draws never shift the target's
    p_min: float = 0.0  # stop drafting when the top probability falls below this


@dataclass(frozen=True)
class TargetOutput:
    """Hidden states of a target forward: ``hidden[i]`` is the pre-norm state at position start + i."""

    start: int
    hidden: Tensor | None


class Drafter:
    kind = "none"
    needs_hidden = False

    def __init__(self) -> None:
        self.tokens: list[int] = []  # the committed log as this drafter knows it

    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """The longest prefix of ``tokens`` the target may keep cached for this drafter to continue."""
        return len(tokens)

    def begin(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        return EMPTY

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self.tokens.extend(int(t) for t in tokens_committed)
        if len(self.tokens) != n_total:
            raise RuntimeError(f"{self.kind} drafter out of sync: log of {len(self.tokens)} tokens, "
                               f"the decoder says {n_total}")

    def reset(self) -> None:
        """Forget everything (after an error left the state in doubt)."""
        self.tokens = []

    def memory_bytes(self) -> int:
        return 0


class NullDrafter(Drafter):
    """No speculation: the loop takes plain steps (depth 0)."""


# ------------------------------------------------------------------------------------------------
# shared helpers
# ------------------------------------------------------------------------------------------------
def _fit_vocab(logits: Tensor, vocab: int) -> Tensor:
    """Logits over the target's vocabulary: cut a larger draft vocabulary, pad a smaller one."""
    n = logits.shape[-1]
    if n == vocab:
        return logits
    if n > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - n), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


def _confidence(logits: Tensor) -> float:
    """The drafter's top probability at temperature 1 (what draft_p_min is compared with, as in
    llama.cpp: a temperature-0 request would otherwise always be 'certain')."""
    return float(torch.softmax(logits.float(), dim=-1).amax().item())


def _draw(logits: Tensor, history: list[int], ctx: DraftContext) -> tuple[int, Tensor | None]:
    """One draft token from the drafter's own filtered distribution, and that distribution."""
    dist = process(logits, history, (), ctx.sampling)
    token = int(dist.sample(ctx.generator)[0])
    return token, (None if dist.greedy else dist.probs[0])


def _stack(rows: list[Tensor | None]) -> Tensor | None:
    if not rows or rows[0] is None:
        return None
    return torch.stack(rows)


def model_bytes(module: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # mkldnn tensors have no storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


# ------------------------------------------------------------------------------------------------
# draft model
# ------------------------------------------------------------------------------------------------
class DraftModelDrafter(Drafter):
    """An independent causal LM with the target's vocabulary and its own KV cache.

    Its cache holds a prefix of ``tokens`` (never the last one, whose logits a proposal needs) plus
    the drafts of the round in flight; ``commit`` truncates it to the prefix the round kept (a
    length: no copies) and the next proposal forwards the committed tail (usually 1-2 tokens). The
    cache survives across requests, so a follow-up prompt reuses it like the target's.
    """

    kind = "model"

    def __init__(self, model, capacity: int, vocab_size: int, prefill_chunk: int = 512, fuse_tokens: int = 4):
        super().__init__()
        self.model = model
        self.fuse_tokens = fuse_tokens  # committed tokens forwarded with the round's first draft step
        self.cache: KVCache = model.new_cache(capacity)
        self.vocab_size = vocab_size
        self.prefill_chunk = prefill_chunk

    def _sync(self) -> None:
        n = min(self.cache.common_prefix(self.tokens), max(len(self.tokens) - 1, 0))
        self.cache.truncate(n)

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self._sync()
        # Evaluate the prompt now (counted with the prompt), not inside the first round's timing.
        self._forward_tail(upto=len(self.tokens) - 1, want_logits=False)

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        self._sync()

    def _forward_tail(self, upto: int, want_logits: bool) -> Tensor | None:
        """Forward ``tokens[cache.length:upto]``; the last position's logits if asked (None when there
        was nothing to forward or none were asked)."""
        tail = self.tokens[self.cache.length:upto]
        logits = None
        for i in range(0, len(tail), self.prefill_chunk):
            part = tail[i:i + self.prefill_chunk]
            last = i + self.prefill_chunk >= len(tail)
            logits = self.model.forward(part, self.cache, logits_for="last" if (last and want_logits) else "none")
        return logits

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - len(self.tokens) + 1)
        if k <= 0 or not self.tokens:
            return EMPTY
        # A drafting round leaves two committed tokens to forward (the last draft and the bonus);
        # plain steps in between add theirs. A few go in the same forward (a 0.5B step over 4 tokens
        # costs about what it costs over 2; a separate forward would cost a whole step, ~70 ms here);
        # a long run is forwarded first and timed apart (``catchup_seconds``).
        catchup = 0.0
        if len(self.tokens) - self.cache.length > self.fuse_tokens:
            t0 = time.perf_counter()
            self._forward_tail(upto=len(self.tokens) - 2, want_logits=False)
            catchup = time.perf_counter() - t0
        logits = self._forward_tail(upto=len(self.tokens), want_logits=True)
        drafts: list[int] = []
        qs: list[Tensor | None] = []
        confs: list[float] = []
        for i in range(k):
            row = _fit_vocab(logits[-1:], self.vocab_size)
            conf = _confidence(row)
            if conf < ctx.p_min:
                break
            token, q = _draw(row, self.tokens + drafts, ctx)
            drafts.append(token)
            qs.append(q)
            confs.append(conf)
            if i + 1 < k:
                logits = self.model.forward([token], self.cache, logits_for="last")
        return Proposal(drafts, _stack(qs), confs, catchup)

    def reset(self) -> None:
        super().reset()
        self.cache.reset()

    def memory_bytes(self) -> int:
        return model_bytes(self.model) + self.cache.nbytes()


# ------------------------------------------------------------------------------------------------
# n-gram prompt lookup
# ------------------------------------------------------------------------------------------------
class NgramDrafter(Drafter):
    """Prompt lookup with a copy cursor: continue the earlier text the output is copying.

    Two kinds of candidate source are weighed each round:

    * **suffix matches**: for each n in n_max..n_min an index maps an n-gram to the last position
      where it ended *with a successor already in the log*, found in O(n_max);
    * **the copy cursor**: the source position the previous rounds were copying from, advanced one
      position per committed token. It keeps a copy going through an edit the suffix lookup cannot
      see past: after ``acc`` replaced ``total`` on a copied line, the most recent ``acc`` is
      somewhere else entirely, but the cursor still points just after ``total`` in the original.

    The suffix match is the default (the longest, then the most recent); the cursor replaces it when
    more of the last ``window`` tokens agree with the tokens up to the cursor than with those up to
    the match (renames counted as agreement), and at least ``cursor_agreement`` do. Edits are learned as
    **renames**: when the output puts token b where the source had token a and the next token
    realigns with the source, later copies of a are drafted as b; a rename the target then refuses
    is forgotten. Renames and the cursor live for one request (``begin`` with a log that is not an
    extension clears them).

    A source with thin evidence (few of the last ``window`` tokens agree) gets a one-token draft.
    The continuation may run into the suffix itself, which makes a periodic text propose whole
    periods (``a b a b`` -> ``a b a b ...``). Drafts are point masses.
    """

    kind = "ngram"

    def __init__(self, n_max: int = 3, n_min: int = 1, window: int = 8, cursor_agreement: int = 6,
                 probe_below: int = 3):
        super().__init__()
        self.n_max = n_max
        self.n_min = n_min
        self.window = window
        # A source whose last ``window`` tokens agree with ours on fewer than ``probe_below`` is a
        # coincidence more often than a copy: draft one token from it, not k. On free text this
        # turns depth 8 from 0.76x into 1.02x (prose) and 0.90x into 1.05x (code), and leaves a real
        # copy untouched (replay of greedy outputs with the measured width costs).
        self.probe_below = probe_below
        # The cursor must agree on this many of the last ``window`` tokens to be used at all, and
        # beat the suffix match's agreement: outside a copy it would keep drafting a stale source
        # (measured on free code and prose: 0.88x/0.75x vs 1.09x/0.92x at depth 4 without the bar).
        self.cursor_agreement = cursor_agreement
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        self._clear_alignment()

    def _clear_alignment(self) -> None:
        self._cursor: int | None = None  # source position aligned with the last log token
        self._renames: dict[int, int] = {}  # source token -> the token the output writes instead
        self._pending: tuple[int, int, int] | None = None  # (source pos, source token, written token)

    def begin(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        n = len(self.tokens)
        self._clear_alignment()
        if len(tokens) >= n and tokens[:n] == self.tokens:
            self._extend(tokens[n:])
        else:
            self.tokens = []
            self._index = [{} for _ in range(self.n_max + 1)]
            self._extend(tokens)

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        n_before = len(self.tokens)
        self._extend(tokens_committed)
        if self._cursor is not None:
            self._follow(n_before)
        if len(self.tokens) != n_total:
            raise RuntimeError(f"ngram drafter out of sync: {len(self.tokens)} != {n_total}")

    def _extend(self, new: Sequence[int]) -> None:
        toks = self.tokens
        for t in new:
            toks.append(int(t))
            p = len(toks) - 1  # the n-grams ending at p - 1 now have a successor
            for n in range(1, self.n_max + 1):
                if p - n < 0:
                    break
                self._index[n][tuple(toks[p - n:p])] = p - 1

    # -- alignment -----------------------------------------------------------------------------
    def _follow(self, start: int) -> None:
        """Advance the cursor over the tokens committed from ``start`` on, learning and forgetting
        renames. (A source position is always earlier than the token it is compared with.)"""
        toks, cursor = self.tokens, self._cursor
        aligned = toks[start - 1] == self._renamed(toks[cursor])  # before the run
        for t in toks[start:]:
            cursor += 1
            src = toks[cursor]
            if self._pending is not None:
                pos, a, b = self._pending
                self._pending = None
                if pos == cursor - 1 and t == self._renamed(src):
                    self._renames[a] = b  # the copy went on after the edit: a real rename
            if t == src:
                self._renames.pop(src, None)  # the target kept the source token after all
            elif t != self._renames.get(src) and aligned:
                self._pending = (cursor, src, int(t))  # an edit inside a copy, maybe a rename
            aligned = t == self._renamed(src)
        self._cursor = cursor

    def _renamed(self, token: int) -> int:
        return self._renames.get(token, token)

    def _score(self, source: int) -> int:
        """How many of the last ``window`` tokens agree (renames included) with those ending at ``source``."""
        toks, last = self.tokens, len(self.tokens) - 1
        return sum(1 for i in range(min(self.window, source + 1))
                   if toks[last - i] == self._renamed(toks[source - i]))

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        toks = self.tokens
        L = len(toks)
        if k <= 0 or L == 0:
            return EMPTY
        source = None  # the longest suffix match (the most recent of that length)
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            source = self._index[n].get(tuple(toks[L - n:]))
            if source is not None:
                break
        score = -1 if source is None else self._score(source)
        cursor = self._cursor
        if cursor is not None and cursor < L - 1 and cursor != source:
            cursor_score = self._score(cursor)
            if cursor_score >= self.cursor_agreement and cursor_score > score:
                source, score = cursor, cursor_score
        if source is None:
            self._cursor = None
            return EMPTY
        self._cursor = source
        if score < self.probe_below:
            k = 1  # thin evidence: a one-token probe costs next to nothing to verify
        out: list[int] = []
        for i in range(k):
            j = source + 1 + i
            out.append(self._renamed(toks[j]) if j < L else out[j - L])
        return Proposal(out, None, [1.0] * len(out))

    def reset(self) -> None:
        self.begin([])


# ------------------------------------------------------------------------------------------------
# MTP (DeepSeek-V3 / GLM NextN) head
# ------------------------------------------------------------------------------------------------
_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.eh_proj\.weight$")


def find_nextn_block(tensor_names) -> int | None:
    """The block index N of a NextN head (``blk.N.nextn.eh_proj.weight``), or None."""
    for name in tensor_names:
        m = _NEXTN.match(name)
        if m:
            return int(m.group(1))
    return None


class MtpDrafter(Drafter):
    """A NextN multi-token-prediction head: one extra transformer block fed by the target.

    Entry j of its KV cache is the "pair" (h_j, t_{j+1}): the target's pre-norm hidden state at
    position j and the embedding of the token that followed, combined as
    ``eh_proj([enorm(embed(t_{j+1})), hnorm(h_j)])`` and run through the block at position j. The
    block's output g_j, through ``shared_head_norm`` and ``shared_head_head`` (or the target's own
    head when the GGUF shares it), predicts t_{j+2}.

    Invariant after every commit: pairs 0..len(tokens)-2 are cached (as many as the target's cache
    holds positions), and ``_last`` = g of the newest pair, which predicts the first draft. Deeper
    drafts chain on the head's own output: pair (g, d_i) at the next position predicts d_{i+1}.
    Those speculative pairs are dropped at commit (a truncation) and replaced by pairs built from
    the target's real hidden states, which arrive in ``commit(..., target)``.
    """

    kind = "mtp"
    needs_hidden = True

    def __init__(self, target, f, block: int, fmt: str, capacity: int):
        super().__init__()
        from engine.dequant import load_tensor
        from engine.linear import Embedding, load_linear
        from engine.model import Block, RMSNorm

        cfg = target.config
        # The head is one global-attention block; it owns its own single-layer cache.
        head_cfg = replace(cfg, local_layers=(), sliding_window=None)
        device, dtype = target.device, target.dtype
        p = f"blk.{block}.nextn."
        self.block = Block(f, head_cfg, block, fmt, device).to(device)
        self.block.attn.layer = 0  # its KV lives in layer 0 of our own cache, not the target's
        self.eh_proj = load_linear(f, p + "eh_proj.weight", fmt, device=device)
        self.enorm = RMSNorm(load_tensor(f, p + "enorm.weight"), cfg.rms_eps).to(device)
        self.hnorm = RMSNorm(load_tensor(f, p + "hnorm.weight"), cfg.rms_eps).to(device)
        self.head_norm = (RMSNorm(load_tensor(f, p + "shared_head_norm.weight"), cfg.rms_eps).to(device)
                          if p + "shared_head_norm.weight" in f.tensors else target.norm)
        self.head = (load_linear(f, p + "shared_head_head.weight", fmt, device=device)
                     if p + "shared_head_head.weight" in f.tensors else target.output)
        if p + "embed_tokens.weight" in f.tensors:
            self.embed, self.embed_scale = Embedding(f, p + "embed_tokens.weight", dtype, device=device), None
        else:
            self.embed, self.embed_scale = target.embed, cfg.embed_scale
        self.rope = target.rope_global
        self.block_ops = target.block_ops  # the target's fused ops (same device and dtype)
        self.cache = KVCache(1, cfg.n_head_kv, cfg.head_dim, capacity, v_head_dim=cfg.v_head_dim,
                             device=device, dtype=dtype)
        self.vocab_size = cfg.vocab_size
        self.device, self.dtype = device, dtype
        self.block_index = block
        # The head's own output projection and norm (a separate head file has them) use memory the
        # target's do not account for.
        self._own_head = [m for m in (self.head, self.head_norm) if m is not target.output and m is not target.norm]
        self._t0: int | None = None  # token 0 (pairs record t_{j+1}; h_j also depends on t_0)
        self._last: Tensor | None = None

    # -- state ---------------------------------------------------------------------------------
    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """Pairs still valid for ``tokens``: pair j needs t_0..t_{j+1} unchanged."""
        if not tokens or self._t0 != tokens[0]:
            return 0
        return self.cache.common_prefix(list(tokens[1:]))

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.cache.truncate(self.prefix_limit(self.tokens))
        self._t0 = self.tokens[0] if self.tokens else None
        self._last = None  # the prefill's commit brings fresh hidden states

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        if target is None or target.hidden is None:
            raise RuntimeError("the MTP drafter needs the target's hidden states at every commit")
        start = target.start
        if start > self.cache.length:
            raise RuntimeError(f"MTP head holds {self.cache.length} positions but the target resumed at {start}")
        self.cache.truncate(start)  # drop this round's speculative pairs
        end = len(self.tokens) - 1  # pairs start..end-1: every position whose successor is committed
        if end > start:
            g = self._pairs(start, target.hidden[: end - start], self.tokens[start + 1:end + 1])
            self._last = g[-1]
        if self._t0 is None and self.tokens:
            self._t0 = self.tokens[0]

    def reset(self) -> None:
        super().reset()
        self.cache.reset()
        self._t0, self._last = None, None

    # -- compute -------------------------------------------------------------------------------
    @torch.no_grad()
    def _pairs(self, start: int, hidden: Tensor, next_tokens: Sequence[int], chunk: int = 512) -> Tensor:
        """Run the head over pairs at positions start.. (writes its KV cache); return g [n, D]."""
        from engine.model import _Step

        outs = []
        for i in range(0, len(next_tokens), chunk):
            toks = [int(t) for t in next_tokens[i:i + chunk]]
            h = hidden[i:i + chunk]
            n, pos = len(toks), start + i
            ids = torch.tensor(toks, dtype=torch.long, device=self.device)
            e = self.embed(ids).to(self.dtype)
            if self.embed_scale is not None:
                e = e * torch.tensor(self.embed_scale, dtype=self.dtype)
            x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h.to(self.dtype))], dim=-1))
            cos_sin = self.rope.get(pos, n, self.device, self.dtype)
            mask = None
            if n > 1:
                q = torch.arange(pos, pos + n, device=self.device)[:, None]
                mask = torch.arange(0, pos + n, device=self.device)[None, :] <= q
            step = _Step(pos, n, {"global": cos_sin, "local": cos_sin}, {"global": mask, "local": mask},
                         {"global": 0, "local": 0}, self.block_ops)
            self.cache.check_room(n)
            x = self.block(x, self.cache, step, self.rope)
            self.cache.commit(toks)
            outs.append(x)
        return torch.cat(outs)

    def _logits(self, g: Tensor) -> Tensor:
        return self.head(self.head_norm(g.reshape(1, -1))).float()

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - self.cache.length + 1)
        if k <= 0 or self._last is None:
            return EMPTY
        g = self._last
        drafts: list[int] = []
        qs: list[Tensor | None] = []
        confs: list[float] = []
        for i in range(k):
            row = _fit_vocab(self._logits(g), self.vocab_size)
            conf = _confidence(row)
            if conf < ctx.p_min:
                break
            token, q = _draw(row, self.tokens + drafts, ctx)
            drafts.append(token)
            qs.append(q)
            confs.append(conf)
            if i + 1 < k:  # chain: the head's own output stands in for the target's hidden state
                g = self._pairs(self.cache.length, g.reshape(1, -1), [token])[-1]
        return Proposal(drafts, _stack(qs), confs)

    def memory_bytes(self) -> int:
        own = model_bytes(self.block) + model_bytes(self.eh_proj) + model_bytes(self.enorm) + \
            model_bytes(self.hnorm) + sum(model_bytes(m) for m in self._own_head)
        return own + self.cache.nbytes()
