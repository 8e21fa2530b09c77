"""The speed sweep: every setting, on every prompt, at every temperature, through the server's API.

Pairing: a *block* is one (run, prompt, temperature); inside a block every setting (plain included)
runs back to back on the same prompt with the same seed, so a slow patch of the machine hits the
block's settings alike, and a setting's ratio to plain is taken inside its block. The order inside a
block rotates by one from block to block, so no setting always runs first or always follows the same
neighbour. The first ``warmup`` runs go through the whole grid and are discarded (the model is loaded
before them).

Throughput is the server's own: ``eval_count / eval_duration`` of the final chunk (decode only, no
prompt evaluation, no HTTP), as Ollama's `eval rate`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from ..client import Client
from .grid import Setting
from .prompts import Prompt, sampling_options


@dataclass
class Measurement:
    run: int  # 0-based, warm-up runs excluded
    prompt: str
    temperature: float
    setting: str
    order: int  # position inside its block
    eval_count: int
    eval_duration_ns: int
    tok_s: float
    done_reason: str = ""
    drafter: str = "none"
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_rounds: int = 0
    acceptance_rate: float = 0.0
    mean_accepted_length: float = 0.0
    acceptance_by_position: list[float] = field(default_factory=list)
    mean_depth: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def final_chunk(parts: Iterator[dict[str, Any]]) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """Drain a streamed generation: (final chunk, text, every token's logprob entry)."""
    final: dict[str, Any] = {}
    text: list[str] = []
    logprobs: list[dict[str, Any]] = []
    for part in parts:
        text.append(part.get("response") or part.get("message", {}).get("content", ""))
        logprobs.extend(part.get("logprobs") or [])
        if part.get("done"):
            final = part
    if not final:
        raise RuntimeError("the server's stream ended without a final chunk")
    return final, "".join(text), logprobs


def measurement(final: dict[str, Any], run: int, prompt: str, temperature: float, setting: str,
                order: int) -> Measurement:
    n = int(final.get("eval_count", 0))
    ns = int(final.get("eval_duration", 0))
    return Measurement(
        run=run, prompt=prompt, temperature=temperature, setting=setting, order=order, eval_count=n,
        eval_duration_ns=ns, tok_s=n / (ns / 1e9) if ns > 0 else 0.0, done_reason=final.get("done_reason", ""),
        drafter=final.get("drafter", "none"), draft_n=int(final.get("draft_n", 0)),
        draft_n_accepted=int(final.get("draft_n_accepted", 0)), draft_rounds=int(final.get("draft_rounds", 0)),
        acceptance_rate=float(final.get("acceptance_rate", 0.0)),
        mean_accepted_length=float(final.get("mean_accepted_length", 0.0)),
        acceptance_by_position=[float(x) for x in final.get("acceptance_by_position") or []],
        mean_depth=float(final.get("mean_depth", 0.0)))


def rotated(settings: list[Setting], block: int) -> list[Setting]:
    k = block % len(settings) if settings else 0
    return settings[k:] + settings[:k]


@dataclass
class SpeedPlan:
    model: str
    prompts: list[Prompt]
    settings: list[Setting]
    temperatures: list[float]
    num_predict: int = 128
    runs: int = 3
    warmup: int = 1
    min_p: float = 0.01
    seed: int = 1000
    keep_alive: str | None = None

    @property
    def requests(self) -> int:
        return (self.warmup + self.runs) * len(self.prompts) * len(self.temperatures) * len(self.settings)

    def options(self, setting: Setting, temperature: float, run: int) -> dict[str, Any]:
        return {**sampling_options(temperature, self.min_p), "num_predict": self.num_predict,
                "seed": self.seed + run, **setting.options}


Progress = Callable[[str, Measurement | None], None]  # (what runs now, its measurement when done)


def run_speed(client: Client, plan: SpeedPlan, progress: Progress | None = None,
              out: list[Measurement] | None = None) -> list[Measurement]:
    """Every block of the plan, in order; returns the measured (non-warm-up) requests, appended to
    ``out`` as they complete (so an interrupted sweep keeps what it measured)."""
    out = [] if out is None else out
    block = 0
    for rep in range(plan.warmup + plan.runs):
        warm = rep < plan.warmup
        label = f"warm-up {rep + 1}/{plan.warmup}" if warm else f"run {rep - plan.warmup + 1}/{plan.runs}"
        for prompt in plan.prompts:
            for temp in plan.temperatures:
                for order, setting in enumerate(rotated(plan.settings, block)):
                    what = f"{label} {prompt.name} t={temp:g} {setting.name}"
                    if progress:
                        progress(what, None)
                    body: dict[str, Any] = {"model": plan.model, "prompt": prompt.text,
                                            "options": plan.options(setting, temp, rep)}
                    if plan.keep_alive is not None:
                        body["keep_alive"] = plan.keep_alive
                    final, _, _ = final_chunk(client.generate(body))
                    m = measurement(final, rep - plan.warmup, prompt.name, temp, setting.name, order)
                    if not warm:
                        out.append(m)
                    if progress:
                        progress(what, m)
                block += 1
    return out
