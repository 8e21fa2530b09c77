"""A draft model's output head cut to the tokens that occur (``draft_vocab``), plus the request's own.

The drafter then reads only those rows of its head (Qwen2.5-Coder-0.5B by default at 16k of its
151,936 tokens, a ninth of them) and gives every other token the logit -inf: its distribution is the full head's
renormalised over the kept tokens. Which tokens are kept: the most frequent in a reference text
(``engine.text.token_frequency``), and every token of the requests it drafts for (``include``: the
prompt, and what the target generates), whose rows it dequantizes on first sight. A prompt's own
words (a function's name, a topic) are the rare tokens an answer repeats most, and no fixed list has
them all.

Speculation stays lossless whatever the drafter proposes (strict acceptance samples from the target's
distribution either way); what pruning alone costs is acceptance, when the target picks a token the
drafter cannot propose (a prose answer's rare words, another language's pieces: on SmolLM2 a 16k
table missed 5-10 of every 64 tokens of English prose, docs/bench/speculation-defaults.md). So the head
also keeps the rows it does not score (``rest``), and after a chain of drafts the drafter scores them
for every drafted position in ONE matmul (``complete``) and corrects the chain to what the full head
would have drafted (``engine.speculative.full_head_check``): one read of the rest a round instead of one
a drafted token, and the drafts of the whole vocabulary.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

import torch

from engine.models.loader import output_weight_name
from engine.models.transformer import Model
from engine.ops import dequant as dq
from engine.ops.linear import Linear, QDotLinear, load_linear_rows, load_screen_rows
from engine.ops.memory import place_on_huge_pages

# Rows dequantized for requests' tokens, at most: past it they start over from the current request's.
MAX_EXTRA_ROWS = 4096
# Standard deviations of a 4-bit screened score's error within which a row is scored again exactly
# (PrunedHead._rescore_near_best): on Qwen2.5-Coder-0.5B's head the largest of 118M measured errors was 4.1.
SCREEN_SIGMAS = 8.0


class PrunedHead(Linear):
    """Logits for the rows ``ids`` of a head (and for tokens added by ``include``), -inf for the rest."""

    format = "pruned"

    def __init__(self, head: Linear, ids: torch.Tensor, vocab_size: int,
                 rows: Callable[[torch.Tensor], torch.Tensor], rest: Linear | None = None,
                 rest_ids: torch.Tensor | None = None, rest_error: torch.Tensor | None = None):
        """``head``: a linear over the rows ``ids``; ``rows(ids)``: f32 [len(ids), K] rows of the full head;
        ``rest``: a linear over every other row (``rest_ids``), for ``complete``: exact, or a lossy screen whose
        score for row j errs by about ``|x| * rest_error[j]`` for an input x (one standard deviation)."""
        super().__init__(head.in_features, vocab_size, head.compute_dtype)
        self.head = head
        self.rest = rest
        self.rest_error = rest_error
        self.register_buffer("ids", ids.to(torch.long))
        self.register_buffer("rest_ids", (rest_ids if rest_ids is not None else torch.empty(0)).to(torch.long))
        self._rows = rows
        kept = torch.zeros(vocab_size, dtype=torch.bool)
        kept[self.ids] = True
        # (kept mask, extra ids, extra rows, kept mask as bytes), replaced whole by ``include``: sequences served
        # at once share the head (engine.batching), and a forward must never see ids from one update and rows
        # from another
        self._extra = (kept, torch.empty(0, dtype=torch.long),
                       torch.empty(0, head.in_features, dtype=head.compute_dtype), _as_bytes(kept))
        self._lock = threading.Lock()

    @property
    def extra_ids(self) -> torch.Tensor:
        return self._extra[1]

    def include(self, tokens: Iterable[int]) -> int:
        """Score these tokens too from now on (those not kept yet get their dequantized rows). Returns how many of
        them were not scored before (each time one occurs)."""
        tokens = list(tokens)
        known = self._extra[3]
        # The drafter includes what every step committed, mostly tokens kept already: looked up in bytes,
        # that costs microseconds, where the tensor work below cost 0.2 ms a step (0.6 % of a target step
        # of Qwen2.5-Coder-1.5B on an AVX2 host, paid by plain steps too)
        unscored = sum(1 for t in tokens if 0 <= t < self.out_features and not known[t])
        if not unscored:
            return 0
        t = torch.as_tensor(tokens, dtype=torch.long)
        t = t[(t >= 0) & (t < self.out_features)]
        with self._lock:
            kept, extra_ids, extra_rows, _ = self._extra
            new = torch.unique(t[~kept[t]])
            if not len(new):
                return unscored
            kept = kept.clone()
            if len(extra_ids) + len(new) > MAX_EXTRA_ROWS:
                kept[extra_ids] = False
                kept[self.ids] = True
                extra_ids, extra_rows = extra_ids[:0], extra_rows[:0]
                new = torch.unique(t[~kept[t]])[:MAX_EXTRA_ROWS]
            kept[new] = True
            self._extra = (kept, torch.cat([extra_ids, new]),
                           torch.cat([extra_rows, self._rows(new).to(self.compute_dtype)]), _as_bytes(kept))
        return unscored

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        _, extra_ids, extra_rows, _ = self._extra
        out = x2.new_full((x2.shape[0], self.out_features), float("-inf"))
        out[:, self.ids] = self.head._matmul(x2)
        if len(extra_ids):
            out[:, extra_ids] = x2 @ extra_rows.t()
        return out

    @property
    def can_complete(self) -> bool:
        return self.rest is not None and len(self.rest_ids) > 0

    def complete(self, inputs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The full head's logits for head inputs ``inputs`` [m, K] (the model's final-normed hidden
        states) whose pruned logits are ``logits`` [m, V]: every token this head did not score gets the
        rest's score, in one matmul over the m rows (the scored ones keep theirs). With a 4-bit rest
        (``rest_error``), the rows whose screened score comes within its margin of the best are scored
        again from their exact rows: every token that can be a position's best has its exact score."""
        full = logits.clone()
        rest = self.rest(inputs.to(self.rest.compute_dtype)).to(full.dtype)
        if self.rest_error is not None:
            self._rescore_near_best(inputs.float(), logits, rest)
        full.index_copy_(1, self.rest_ids, rest)
        # a rest row added by ``include`` has its score in ``logits`` (unless it was added after they were
        # computed): keep that one
        extra_ids = self._extra[1]
        if len(extra_ids):
            scored = logits[:, extra_ids]
            full[:, extra_ids] = torch.where(torch.isneginf(scored), full[:, extra_ids], scored)
        return full

    def _rescore_near_best(self, inputs: torch.Tensor, logits: torch.Tensor, rest: torch.Tensor) -> None:
        """Replace, in ``rest`` [m, R], the screened scores that could reach their position's best by exact ones.

        A screened score is off by the dot product of the input with the row's rounding errors, each within
        half its group's scale: about ``|x| * rest_error`` (one standard deviation), and the margin is
        ``SCREEN_SIGMAS`` of them. The best score of a position is at least its best scored token's and the
        best screened score less its margin, so a row below that floor by more than its own margin cannot be
        the best. On Qwen2.5-Coder-0.5B that leaves about ten rows a position out of 135k (at most hundreds)."""
        sigmas = SCREEN_SIGMAS * inputs.norm(dim=1, keepdim=True)  # [m, 1]
        top, at = rest.max(dim=1, keepdim=True)
        floor = torch.maximum(logits.max(dim=1, keepdim=True).values, top - sigmas * self.rest_error[at])
        near = torch.nonzero((torch.addcmul(rest, sigmas, self.rest_error) >= floor).any(dim=0)).flatten()
        if len(near):
            rest[:, near] = (inputs @ self._rows(self.rest_ids[near]).t()).to(rest.dtype)

    def _storage_tensors(self) -> list[torch.Tensor]:
        rest = self.rest._storage_tensors() if self.rest is not None else []
        return self.head._storage_tensors() + [self._extra[2]] + rest

    def extra_repr(self) -> str:
        return f"kept={len(self.ids)}+{len(self._extra[1])} of {self.out_features}, head={self.head.format}"


def _as_bytes(mask: torch.Tensor) -> bytes:
    """A bool mask as bytes (one per entry, 0 or 1), for lookups without tensor calls."""
    return mask.to(torch.uint8).numpy().tobytes()


def prune_output_head(model: Model, ids: torch.Tensor) -> None:
    """Replace ``model``'s output head by the rows ``ids`` of its file's head (a CPU model whose GGUF is
    still open, as ``load_model`` leaves it)."""
    if model.gguf is None or model.device.type != "cpu":
        raise ValueError("a pruned head is built from the model's open GGUF, on the CPU")
    if not 0 < len(ids) < model.config.vocab_size:
        raise ValueError(f"a pruned head keeps between 1 and {model.config.vocab_size - 1} tokens, not {len(ids)}")
    f = model.gguf
    name = output_weight_name(model.config)
    info = f.tensors[name]

    def rows(which: torch.Tensor) -> torch.Tensor:
        return dq.dequantize_rows(dq.raw_tensor(f, name), info.ggml_type, info.shape, which)

    rest_ids = torch.ones(model.config.vocab_size, dtype=torch.bool)
    rest_ids[ids] = False
    rest_ids = torch.nonzero(rest_ids).flatten()
    head = load_linear_rows(f, name, model.fmt, ids)
    # The rest is read once a drafted round to check the chain, and that read cost as much as the pruning saved
    # (Qwen2.5-Coder-0.5B: 135k rows of Q8_0, 4.6 ms a round on an AVX2 host). Where the head runs on the
    # qdot kernel the rest is a 4-bit screen, half those bytes, and the few rows near a position's best are
    # scored again exactly (PrunedHead.complete).
    screen = load_screen_rows(f, name, rest_ids) if isinstance(head, QDotLinear) else None
    if screen is not None:
        rest, error = screen, screen_error(screen)
    else:
        rest, error = load_linear_rows(f, name, model.fmt, rest_ids), None
    model.output = PrunedHead(head, ids, model.config.vocab_size, rows, rest=rest, rest_ids=rest_ids,
                              rest_error=error)
    place_on_huge_pages(model.output)


def screen_error(screen: QDotLinear) -> torch.Tensor:
    """Per row of a 4-bit screen with offset codes (Q4_0's rule), its score's error per unit of input norm
    (one standard deviation): rounding errors spread evenly over half a group's scale have a standard deviation
    of scale / sqrt(12), and the row's largest group scale stands for all of its groups (an input that
    concentrates where the scale is largest errs most)."""
    per_row = screen.scales.float().abs().permute(0, 2, 1).reshape(-1, screen.scales.shape[1])[:screen.out_features]
    return per_row.amax(dim=1) / 12 ** 0.5
