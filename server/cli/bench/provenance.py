"""The claim `tandem bench --apply` stores beside each parameter it writes, and its one-line reading.

A claim is plain JSON in the model's tuning layer (``application/vnd.tandem.tuning``, see
importer.create): the server stamps the parameter's ``value`` on it and drops it when a later create
sets that parameter by hand, so a claim always speaks for the value the model holds. `/api/show`
returns the claims under ``speculation.tuning``; `tandem show` prints :func:`describe` of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE = "tandem bench"


@dataclass(frozen=True)
class Measurement:
    """What an applied setting was measured at (one sweep, one temperature)."""

    setting: str
    ratio: float  # the setting's median tok/s over plain's, geometric mean over the prompts
    lossless: bool
    prompts: list[str]
    temperature: float
    num_predict: int
    runs: int
    measured_at: str  # ISO 8601, UTC
    server_version: str
    within_noise: bool | None = None  # vs the runner-up, when the setting was the overall best
    runner_up: str | None = None
    runner_up_ratio: float | None = None
    cpu: str | None = None  # only when the server names its CPU (it does not today)

    def claim(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": SOURCE, "setting": self.setting, "ratio": round(self.ratio, 4),
                               "lossless": self.lossless, "prompts": list(self.prompts),
                               "temperature": self.temperature, "num_predict": self.num_predict,
                               "runs": self.runs, "measured_at": self.measured_at,
                               "server_version": self.server_version}
        if self.within_noise is not None:
            out["within_noise"] = self.within_noise
        if self.runner_up is not None:
            out["runner_up"] = self.runner_up
        if self.runner_up_ratio is not None:
            out["runner_up_ratio"] = round(self.runner_up_ratio, 4)
        if self.cpu:
            out["cpu"] = self.cpu
        return out


def describe(claim: dict[str, Any]) -> str:
    """One line, e.g. ``tandem bench: 1.42x plain (strict-n2) on code, prose, repetitive at temperature 0,
    2026-12-02``. Tolerates missing fields: the layer is data another version may have written."""
    source = str(claim.get("source") or "unknown source")
    setting = claim.get("setting")
    ratio = claim.get("ratio")
    if setting == "plain":
        what = "plain decoding fastest"
        if claim.get("runner_up") and isinstance(claim.get("runner_up_ratio"), (int, float)):
            what += f" (next: {claim['runner_up']} at {claim['runner_up_ratio']:.2f}x)"
    elif isinstance(ratio, (int, float)):
        what = f"{ratio:.2f}x plain" + (f" ({setting})" if setting else "")
    else:
        what = str(setting or "")
    text = what
    prompts = claim.get("prompts")
    if isinstance(prompts, list) and prompts:
        text += " on " + ", ".join(str(p) for p in prompts)
    if isinstance(claim.get("temperature"), (int, float)):
        text += f" at temperature {claim['temperature']:g}"
    if claim.get("cpu"):
        text += f" on {claim['cpu']}"
    if claim.get("lossless") is False:
        text += ", lossy"
    if claim.get("within_noise"):
        text += ", within noise of the runner-up"
    if claim.get("measured_at"):
        text += f", {str(claim['measured_at'])[:10]}"
    return f"{source}: {text}"
