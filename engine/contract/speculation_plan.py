"""The one rule that decides how a request speculates: drafter, depth cap and the loop's tunables.

Why one function: the server (for /api/show's "effective" settings) and the engine (for the
request it runs) used to decide the drafter separately, with different "auto" rules.  Both now
call :func:`plan_speculation` with the merged :class:`~engine.contract.options.Options` and what the model
has; the engine then only checks that the chosen drafter is actually loaded.

Torch-free: the server imports this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine.contract.options import (DEFAULT_DRAFT_VOCAB, SPECULATION_DEFAULTS, AcceptanceRule, DraftSchedule, Options,
                            RelaxedScope)

PlannedDrafter = Literal["model", "mtp", "ngram", "suffix", "none"]

#: The suffix drafter's depth cap when ``draft_num_predict`` is not set: its drafts are free and a repeat is accepted
#: whole, so its rounds run deep (the adaptive controller still picks each depth; docs/speculation.md).
SUFFIX_DEFAULT_CAP = 16


@dataclass(frozen=True)
class SpeculationPlan:
    """What a request's speculation will be; ``cap`` is 0 exactly when ``drafter`` is ``none``."""

    drafter: PlannedDrafter
    cap: int  # most tokens drafted per round
    rule: AcceptanceRule
    schedule: DraftSchedule
    p_min: float
    n_min: int
    relaxed_top_n: int
    trace: bool  # the draft_trace option (the engine also honours TANDEM_DRAFT_TRACE)
    relaxed_scope: RelaxedScope = "all"  # where relaxed_top_n applies: everywhere or the reasoning only
    copy: bool = False  # draft_copy: rounds that copy the context draft the copy (model and mtp drafters)
    suffix: bool = False  # draft_suffix with a model or mtp drafter: earlier outputs draft too (model+suffix)
    # with ``suffix`` and the adaptive schedule: how deep a round the earlier outputs draft may go (the suffix
    # drafter's own cap unless draft_num_predict is set; the model's and the copy's rounds keep ``cap``)
    suffix_cap: int = 0
    vocab: int = DEFAULT_DRAFT_VOCAB  # draft_vocab: load-time (the engine's pruned draft head), shown with the rest

    def as_options(self) -> dict[str, Any]:
        """The plan under the option names, in :data:`SPECULATION_DEFAULTS` order (/api/show)."""
        values = {"draft_num_predict": self.cap, "draft_n_min": self.n_min, "draft_p_min": self.p_min,
                  "draft_copy": self.copy, "draft_suffix": self.suffix or self.drafter == "suffix",
                  "relaxed_top_n": self.relaxed_top_n, "relaxed_scope": self.relaxed_scope,
                  "draft_schedule": self.schedule,
                  "drafter": self.drafter, "draft_trace": self.trace, "draft_acceptance": self.rule,
                  "draft_vocab": self.vocab}
        return {name: values[name] for name in SPECULATION_DEFAULTS}


def plan_speculation(options: Options, *, has_draft_layer: bool, has_mtp_head: bool,
                      draft_layer: PlannedDrafter = "model", suffix_drafting: bool = True) -> SpeculationPlan:
    """Decide the drafter and the depth cap for one request.

    ``draft_layer``: what the DRAFT layer drafts as: ``model`` (an independent model) or ``mtp`` (an MTP
    head, or a drafter architecture such as the Gemma 4 assistant, that drafts from the target's state).

    * ``none`` or a cap <= 0 -> drafter ``none``, cap 0.
    * ``auto``: the DRAFT layer (as ``draft_layer``) if the model has one; otherwise an explicit cap (set by the
      model's parameters or the request) uses the model's MTP head when it has one; otherwise the ``suffix``
      drafter while ``draft_suffix`` is on and the engine has it (``suffix_drafting``: the native engine),
      else no speculation (Ollama's rule).
    * ``model``/``mtp``/``ngram``/``suffix``: that drafter, with the default cap 4 (``suffix``: 16) unless set;
      the engine reports an error if the model cannot provide it.
    * ``copy`` and ``suffix`` (a model or MTP drafter's extra sources) follow ``draft_copy`` and ``draft_suffix``;
      the outputs need the copy rounds they join, so ``suffix`` needs both.
    """
    drafter: str = options.drafter
    cap = options.draft_num_predict
    if drafter == "auto":
        if has_draft_layer:
            drafter = draft_layer
        elif "draft_num_predict" in options.explicit and has_mtp_head:
            drafter = "mtp"
        elif options.draft_suffix and suffix_drafting:
            drafter = "suffix"
        else:
            drafter = "none"
    own_cap = "draft_num_predict" in options.explicit
    if drafter == "suffix" and not own_cap:
        cap = SUFFIX_DEFAULT_CAP
    if drafter == "none" or cap <= 0:
        drafter, cap = "none", 0
    suffix = suffix_drafting and options.draft_copy and options.draft_suffix and drafter in ("model", "mtp")
    suffix_cap = cap if own_cap or options.draft_schedule == "fixed" else max(cap, SUFFIX_DEFAULT_CAP)
    return SpeculationPlan(drafter=drafter, cap=cap, rule=options.draft_acceptance,  # type: ignore[arg-type]
                           schedule=options.draft_schedule, p_min=options.draft_p_min,
                           n_min=options.draft_n_min, relaxed_top_n=options.relaxed_top_n,
                           trace=options.draft_trace, relaxed_scope=options.relaxed_scope,
                           copy=options.draft_copy and drafter in ("model", "mtp"),
                           suffix=suffix, suffix_cap=suffix_cap if suffix else 0, vocab=options.draft_vocab)
