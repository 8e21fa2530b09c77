"""The batch policy: what each step of a loaded model's sequences runs, in one place.

The step loop (engine.batching.step_loop) applies these rules and nothing else decides them:

* **Prompt chunks.** A prompt is evaluated at most PROMPT_CHUNK_ROWS tokens a forward, and only
  SHARED_PROMPT_CHUNK while other sequences are in flight (``prompt_chunk``).
* **Draft-first order.** When some sequences wait on a draft model, those forwards run first, and only they
  (``next_group``): a sequence drafting a chain comes back for its next draft step while the others keep waiting
  at their verification, which then shares one target forward with every other sequence's rows.
* **Prefix sharing.** A new sequence copies the positions another slot holds of its prompt when that saves at least
  SHARED_PREFIX_MIN of them (``engine.batching.slots.SlotPool.share_prefix``, run when the sequence joins).
* **Depth priced by the batch.** Which steps tell the width table what a forward of their total width costs
  (``prices_widths``): decode rows and verifications, never a step that carries a prompt chunk or a draft. The
  depth controllers (engine.speculative.depth) price a sequence's drafts against that table and the number of
  sequences sharing each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

#: A prompt is evaluated at most this many tokens a forward, whatever num_batch asks (llama.cpp's physical batch,
#: n_ubatch, beside its logical num_batch): on Zen 5 a 1,700-token prompt 1.19x faster in chunks of 256 than of 512
#: and a 4,000-token one 1.12x (a chunk's activations and f32 gate/up rows stay nearer the core); 384 as fast, 64
#: and 128 0.94-0.99x (docs/bench/prompt-chunks-zen5.md).
PROMPT_CHUNK_ROWS = 256

#: With other sequences in flight, a prompt is evaluated at most this many tokens a step: its chunk shares each
#: forward with their decode rows, and a larger one would stall their streams for its length. Alone, a prompt
#: takes the whole chunk it asked for (no stream waits on it; a request that arrives meanwhile joins the next
#: step): a lone 1,700-token prompt 1.07x faster in chunks of 256 than of 64 (docs/bench/prompt-chunks-zen5.md).
SHARED_PROMPT_CHUNK = 64

#: A slot adopts another's cached prefix only when that saves at least this many positions: a copy of a few is
#: not worth the step boundary it is made at.
SHARED_PREFIX_MIN = 16


@dataclass
class ForwardCall:
    """One sequence's forward, waiting for its step: what the policy picks among."""

    model: Any
    draft: bool  # a draft model's forward (run before the targets')
    tokens: list[int]
    cache: Any
    logits_for: str
    return_hidden: bool
    result: Any = None
    error: BaseException | None = None


def prompt_chunk(requested: int, sequences: int) -> int:
    """How many of a prompt's tokens the next step evaluates when ``sequences`` share the steps: all ``requested``
    alone, else at most SHARED_PROMPT_CHUNK."""
    return requested if sequences <= 1 else min(requested, SHARED_PROMPT_CHUNK)


def next_group(waiting: Sequence[ForwardCall]) -> list[ForwardCall]:
    """The forwards the next step runs, of those the sequences wait in: every draft-model forward when there is
    one, else all of them."""
    drafts = [c for c in waiting if c.draft]
    return drafts if drafts else list(waiting)


def prices_widths(group: Sequence[ForwardCall]) -> bool:
    """Whether a step over ``group`` prices the width table: target rows that all want logits (decode steps and
    verifications). A prompt chunk's rows compute no logits and would price every width wider than verifying
    costs; draft forwards are another model's."""
    return all(not c.draft and (len(c.tokens) == 1 or c.logits_for == "all") for c in group)
