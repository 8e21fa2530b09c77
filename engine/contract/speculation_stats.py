"""Per-request speculation statistics: what every result carries across the process boundary and the API
reports beside Ollama's fields. Torch-free (the server imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpeculationStats:
    """Per-request speculation statistics (the API's final chunk adds these to Ollama's fields)."""

    drafter: str = "none"  # none | model | mtp | ngram
    draft_n: int = 0  # tokens drafted
    draft_n_accepted: int = 0
    draft_rounds: int = 0  # target forwards that verified at least one drafted token
    target_forwards: int = 0  # all decode forwards of the target (rounds + plain steps)
    # decode steps that verified no draft: the adaptive controller chose plain decoding (the text does not
    # pay for drafting on this machine) or the drafter had nothing to propose
    plain_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # accepted count at draft position i
    drafted_per_position: list[int] = field(default_factory=list)  # drafted count at position i
    depth_sum: int = 0  # sum of chosen depths over all decode steps (for the mean depth)
    # Paired rule comparison on the very drafts this request evaluated: the sum over evaluated
    # positions of the probability that strict rejection sampling (min(1, p/q)) and llama.cpp's
    # exact-match rule (p: the target's own sample equals the draft) accept that draft. Comparing
    # two runs' realised rates instead mixes in their different texts (for the benchmark).
    evaluated: int = 0
    strict_accept_sum: float = 0.0
    match_accept_sum: float = 0.0
    trace: list[dict[str, Any]] | None = None
    # Hybrid recurrent targets: the most bytes of recurrent-state snapshots (rollback records and prompt
    # checkpoints) the target's cache held during the request; 0 for attention-only models.
    snapshot_bytes: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def mean_accepted_length(self, committed_tokens: int) -> float:
        """Tokens committed per target forward (1.0 = no gain from speculation)."""
        return committed_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def mean_depth(self) -> float:
        return self.depth_sum / self.target_forwards if self.target_forwards else 0.0

    def to_json(self, committed_tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "drafter": self.drafter,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "draft_rounds": self.draft_rounds,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length(committed_tokens), 4),
            "acceptance_by_position": [round(x, 4) for x in self.per_position_acceptance],
            "mean_depth": round(self.mean_depth, 4),
            "plain_steps": self.plain_steps,
        }
        if self.snapshot_bytes:
            out["snapshot_bytes"] = self.snapshot_bytes
        if self.trace is not None:
            out["trace"] = self.trace
        return out
