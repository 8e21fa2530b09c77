"""Constrained decoding for Ollama's ``format``, the token layer: keep only the next tokens whose text
keeps ``engine.text.json_grammar``'s recogniser valid (JSON mode and a JSON-schema subset)."""

from __future__ import annotations

import torch

from engine.sampling.sampler import Distribution
from engine.text.json_grammar import JsonRecognizer, Node

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

    def allows(self, tid: int) -> bool:
        if tid in self.eog_ids:
            return self.state.is_complete()
        text = self.pieces.text(tid)
        return text is not None and self.state.clone().advance(text)

    def advance_token(self, tid: int) -> None:
        if tid in self.eog_ids:
            return
        text = self.pieces.text(tid)
        if text is None or not self.state.advance(text):
            raise ValueError(f"token {tid} violates the format constraint")

    def done(self) -> bool:
        return self.state.done()

    def filter(self, dist):
        """Row 0 of ``dist`` restricted to allowed tokens, renormalised (a new Distribution).

        The pool's candidates are checked in descending probability; if none is allowed, the
        vocabulary is scanned by descending raw logit (at most ``FALLBACK_SCAN`` entries) and the
        first allowed token gets all the mass (for greedy decoding that is the constrained argmax).
        The scan looks at the best ``FALLBACK_SCAN`` tokens first and only then at the rest.
        """
        ids, probs = dist.cand_ids[0], dist.cand_probs[0]
        order = torch.argsort(probs, descending=True, stable=True).tolist()
        id_list, p_list = ids.tolist(), probs.tolist()
        keep = [j for j in order if p_list[j] > 0 and self.allows(id_list[j])]
        if keep:
            keep.sort()  # back to ascending token id
            new_ids = ids[keep].unsqueeze(0)
            new_p = probs[keep]
            new_p = (new_p / new_p.sum()).unsqueeze(0)
        else:
            raw = dist.raw_logits[0]
            n = min(FALLBACK_SCAN, raw.shape[-1])
            top = torch.topk(raw, n).indices.tolist()
            pick = next((t for t in top if self.allows(t)), None)
            if pick is None and n < raw.shape[-1]:  # rare: the rest of the vocabulary, once
                rest = torch.argsort(raw, descending=True)[n:].tolist()
                pick = next((t for t in rest if self.allows(t)), None)
            if pick is None:
                raise RuntimeError("format: no token can continue the JSON output")
            new_ids = torch.tensor([[pick]], dtype=ids.dtype, device=ids.device)
            new_p = torch.ones(1, 1, dtype=probs.dtype, device=probs.device)
        return Distribution(new_ids, new_p, dist.raw_logits[:1], dist.vocab_size, greedy=dist.greedy)
