"""Constrained decoding for Ollama's ``format``, the token layer: keep only the next tokens whose text
keeps ``engine.contract.json_grammar``'s recogniser valid (JSON mode and JSON schemas).

With speculation the decode loop asks two things of it: :meth:`TokenConstraint.walk` cuts a draft
chain at its first token the constraint does not allow (cloning the recogniser along the chain, so
row ``i`` of the verification has its own state), and :meth:`TokenConstraint.mask` filters each row
of the target's distributions with that row's state. Acceptance then runs on the masked rows, so the
committed tokens are distributed exactly as constrained sampling without speculation (and greedy stays
the constrained argmax); the constraint itself advances only over committed tokens."""

from __future__ import annotations

from typing import Sequence

import torch

from engine.sampling.sampler import Distribution
from engine.contract.json_grammar import JsonRecognizer, Node

FALLBACK_SCAN = 4096  # first slice of the vocabulary (by raw logit) checked when no pool candidate is valid


class TokenPieces:
    """Token id -> its text, or None when it cannot appear in JSON output (control tokens, empty
    pieces, pieces that are not valid UTF-8 on their own). Cached; one per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, str | None] = {}

    def text(self, tid: int) -> str | None:
        if tid in self._cache:
            return self._cache[tid]
        out = None
        try:
            if not self.tokenizer.is_control(tid):
                out = self.tokenizer.token_to_piece(tid).decode("utf-8") or None
        except (IndexError, UnicodeDecodeError):
            out = None
        self._cache[tid] = out
        return out


class TokenConstraint:
    """Per-request state: filters distributions and follows the committed tokens."""

    def __init__(self, node: Node, pieces: TokenPieces, eog_ids: frozenset[int] | set[int]):
        self.state = JsonRecognizer(node)
        self.pieces = pieces
        self.eog_ids = frozenset(eog_ids)

    def allows(self, tid: int, state: JsonRecognizer | None = None) -> bool:
        state = self.state if state is None else state
        if tid in self.eog_ids:
            return state.is_complete()
        text = self.pieces.text(tid)
        return text is not None and state.clone().advance(text)

    def advance_token(self, tid: int) -> None:
        if tid in self.eog_ids:
            return
        text = self.pieces.text(tid)
        if text is None or not self.state.advance(text):
            raise ValueError(f"token {tid} violates the format constraint")

    def done(self) -> bool:
        return self.state.done()

    def walk(self, drafts: Sequence[int]) -> list[JsonRecognizer]:
        """The recogniser states along the longest allowed prefix of ``drafts``: ``states[0]`` is the
        current state and ``states[i]`` the state after ``drafts[:i]``; ``len(states) - 1`` drafts are
        kept. The chain also ends after an end-of-generation token or the token that closes the value
        (nothing useful can follow either)."""
        states = [self.state]
        cur = self.state
        for d in drafts:
            if cur.done():
                break
            if d in self.eog_ids:
                if cur.is_complete():
                    states.append(cur)
                break
            text = self.pieces.text(d)
            if text is None:
                break
            nxt = cur.clone()
            if not nxt.advance(text):
                break
            states.append(nxt)
            cur = nxt
        return states

    def mask(self, dist: Distribution, states: Sequence[JsonRecognizer] | None = None) -> Distribution:
        """``dist`` with row ``i`` restricted to what ``states[i]`` allows (default: the current state
        for row 0), renormalised; rows keep their width (disallowed candidates get probability 0).

        A row's candidates are checked in order; if none is allowed, the vocabulary is scanned by
        descending raw logit (the best ``FALLBACK_SCAN`` first, then the rest) and the first allowed
        token gets all the mass (for greedy decoding that is the constrained argmax)."""
        states = [self.state] if states is None else list(states)
        if len(states) != dist.n:
            raise ValueError(f"{dist.n} rows need {dist.n} constraint states, got {len(states)}")
        ids_rows, prob_rows = [], []
        for i, st in enumerate(states):
            ids, probs = self._row(dist, i, st)
            ids_rows.append(ids)
            prob_rows.append(probs)
        return Distribution(torch.stack(ids_rows), torch.stack(prob_rows), dist.raw_logits, dist.vocab_size,
                            greedy=dist.greedy)

    def filter(self, dist: Distribution) -> Distribution:
        """Row 0 only, with the current state (a plain step)."""
        return self.mask(Distribution(dist.cand_ids[:1], dist.cand_probs[:1], dist.raw_logits[:1],
                                      dist.vocab_size, greedy=dist.greedy))

    def _row(self, dist: Distribution, i: int, st: JsonRecognizer) -> tuple[torch.Tensor, torch.Tensor]:
        ids, probs = dist.cand_ids[i], dist.cand_probs[i]
        id_list, p_list = ids.tolist(), probs.tolist()
        keep = [p if p > 0 and self.allows(t, st) else 0.0 for t, p in zip(id_list, p_list)]
        total = sum(keep)
        if total > 0:
            return ids, torch.tensor(keep, dtype=probs.dtype, device=probs.device) / total
        raw = dist.raw_logits[i]
        n = min(FALLBACK_SCAN, raw.shape[-1])
        top = torch.topk(raw, n).indices.tolist()
        pick = next((t for t in top if self.allows(t, st)), None)
        if pick is None and n < raw.shape[-1]:  # rare: the rest of the vocabulary, once
            rest = torch.argsort(raw, descending=True)[n:].tolist()
            pick = next((t for t in rest if self.allows(t, st)), None)
        if pick is None:
            raise RuntimeError("format: no token can continue the JSON output")
        if pick not in id_list:  # swap it in for a (zero-probability) candidate: ids stay distinct, ascending
            id_list = sorted(id_list[1:] + [pick])
        new_p = [1.0 if t == pick else 0.0 for t in id_list]
        return (torch.tensor(id_list, dtype=ids.dtype, device=ids.device),
                torch.tensor(new_p, dtype=probs.dtype, device=probs.device))


class _Phase:
    """Where a reasoning-first output is: ``pre`` (nothing decided: the reasoning block may open or the
    JSON start), ``in`` (inside the block: unconstrained), ``json`` (the block closed or never opened:
    ``rec`` follows the value)."""

    __slots__ = ("name", "rec")

    def __init__(self, name: str, rec: JsonRecognizer):
        self.name = name
        self.rec = rec


class ReasoningFirst(TokenConstraint):
    """``format`` on a model asked to think, as Ollama applies it: the reasoning block is free text and
    the format holds from its close tag on (Ollama reasons unconstrained, then restarts under the
    format; here it is one pass). Inside the block only end-of-generation is refused, so an answer is
    always still to come; the block may open at the very start of the output or already be open in the
    prompt (``inside``). States along a draft chain are ``_Phase`` objects; the base class's masking
    works on them unchanged through :meth:`allows`."""

    def __init__(self, node: Node, pieces: TokenPieces, eog_ids, open_id: int, close_id: int, *, inside: bool):
        super().__init__(node, pieces, eog_ids)
        self.open_id, self.close_id = open_id, close_id
        self.phase = _Phase("in" if inside else "pre", self.state)

    def _json_allows(self, tid: int, rec: JsonRecognizer) -> bool:
        return TokenConstraint.allows(self, tid, rec)

    def allows(self, tid: int, state=None) -> bool:
        ph = self.phase if state is None else state
        if ph.name == "in":
            return tid not in self.eog_ids
        if ph.name == "pre" and tid == self.open_id:
            return True
        return self._json_allows(tid, ph.rec)

    def _step(self, ph: _Phase, tid: int) -> _Phase | None:
        """The phase after ``tid``, or None when ``tid`` is not allowed there."""
        if not self.allows(tid, ph):
            return None
        if ph.name == "in":
            return _Phase("json", ph.rec) if tid == self.close_id else ph
        if ph.name == "pre" and tid == self.open_id:
            return _Phase("in", ph.rec)
        if tid in self.eog_ids:
            return ph
        rec = ph.rec.clone()
        rec.advance(self.pieces.text(tid))  # allowed, so it advances
        return _Phase("json", rec)

    def advance_token(self, tid: int) -> None:
        nxt = self._step(self.phase, tid)
        if nxt is None:
            raise ValueError(f"token {tid} violates the format constraint")
        self.phase = nxt
        self.state = nxt.rec

    def done(self) -> bool:
        return self.phase.name == "json" and self.phase.rec.done()

    def walk(self, drafts: Sequence[int]) -> list[_Phase]:  # type: ignore[override]
        states = [self.phase]
        cur = self.phase
        for d in drafts:
            if cur.name == "json" and cur.rec.done():
                break
            nxt = self._step(cur, d)
            if nxt is None:
                break
            states.append(nxt)
            cur = nxt
            if d in self.eog_ids:
                break
        return states

    def mask(self, dist: Distribution, states=None) -> Distribution:
        return super().mask(dist, [self.phase] if states is None else states)
