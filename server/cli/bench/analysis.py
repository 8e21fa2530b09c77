"""From measurements to paired ratios, per-cell summaries, an overall ranking and the best setting.

* pair: a setting's tok/s over plain's tok/s in the same block (run, prompt, temperature);
* cell (prompt, temperature, setting): the spread of its tok/s and of its per-run paired ratios;
  acceptance pooled over the runs (accepted / drafted), mean accepted length pooled (committed tokens
  per target forward), per-position acceptance averaged over the runs;
* overall (temperature, setting): per run, the geometric mean over prompts of the paired ratios; the
  spread of those per-run values;
* best (per temperature): the setting with the highest overall median ratio (plain counts, at 1.0).
  **Noise rule**: it is compared with the runner-up on every block both ran in (same run, prompt and
  temperature, so the same plain and the same noise): the two-sided sign test over the blocks one of
  them won (ties dropped). The difference is called real only when p < 0.05; otherwise it is
  "within noise". (With 3 prompts, 2 runs give 6 blocks, and 6-0 is the only split with p < 0.05.)
  Whether the two settings' per-run overall-ratio IQRs overlap is reported alongside.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

from .grid import Setting
from .stats import geomean, overlap, sign_test, spread

ALPHA = 0.05
NOISE_RULE = ("best vs runner-up: two-sided sign test over the paired blocks (same run, prompt and "
              f"temperature); a difference counts only when p < {ALPHA:g}, otherwise it is within noise")


def _as_dict(m: Any) -> dict[str, Any]:
    return m if isinstance(m, dict) else m.to_json()


def pairs(measurements: Iterable[Any]) -> list[dict[str, Any]]:
    """Each non-plain measurement with the plain one of its block and their ratio."""
    ms = [_as_dict(m) for m in measurements]
    plain = {(m["run"], m["prompt"], m["temperature"]): m for m in ms if m["setting"] == "plain"}
    out = []
    for m in ms:
        p = plain.get((m["run"], m["prompt"], m["temperature"]))
        if p is None or not p["tok_s"]:
            continue
        out.append({"run": m["run"], "prompt": m["prompt"], "temperature": m["temperature"],
                    "setting": m["setting"], "tok_s": m["tok_s"], "plain_tok_s": p["tok_s"],
                    "ratio": m["tok_s"] / p["tok_s"]})
    return out


def _mean_positions(lists: Sequence[Sequence[float]]) -> list[float]:
    width = max((len(x) for x in lists), default=0)
    out = []
    for i in range(width):
        vals = [x[i] for x in lists if len(x) > i]
        out.append(sum(vals) / len(vals))
    return out


def cells(measurements: Iterable[Any], prs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ms = [_as_dict(m) for m in measurements]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for m in ms:
        groups[(m["prompt"], m["temperature"], m["setting"])].append(m)
    ratio_of: dict[tuple, dict[int, float]] = defaultdict(dict)
    for p in prs:
        ratio_of[(p["prompt"], p["temperature"], p["setting"])][p["run"]] = p["ratio"]
    out = []
    for key, group in groups.items():
        prompt, temp, setting = key
        group.sort(key=lambda m: m["run"])
        drafted = sum(m["draft_n"] for m in group)
        accepted = sum(m["draft_n_accepted"] for m in group)
        tokens = sum(m["eval_count"] for m in group)
        forwards = sum(m["eval_count"] / m["mean_accepted_length"] for m in group if m["mean_accepted_length"] > 0)
        per_run = [ratio_of[key][m["run"]] for m in group if m["run"] in ratio_of[key]]
        r = spread(per_run)
        t = spread([m["tok_s"] for m in group])
        out.append({
            "prompt": prompt, "temperature": temp, "setting": setting, "runs": len(group),
            "drafter": group[0]["drafter"],
            "tok_s": t["median"], "tok_s_min": t["min"], "tok_s_max": t["max"],
            "ratio": r["median"], "ratio_q1": r["q1"], "ratio_q3": r["q3"], "ratio_min": r["min"],
            "ratio_max": r["max"], "ratio_per_run": per_run,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": tokens / forwards if forwards else None,
            "acceptance_by_position": _mean_positions([m["acceptance_by_position"] for m in group
                                                       if m["acceptance_by_position"]]),
            "mean_depth": sum(m["mean_depth"] for m in group) / len(group),
        })
    return out


def overall(prs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (temperature, setting): per run, the geometric mean over prompts of the paired ratios."""
    by: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in prs:
        by[(p["temperature"], p["setting"])][p["run"]].append(p["ratio"])
    out = []
    for (temp, setting), runs in by.items():
        per_run = [geomean(runs[r]) for r in sorted(runs)]
        s = spread(per_run)
        out.append({"temperature": temp, "setting": setting, "ratio": s["median"], "ratio_q1": s["q1"],
                    "ratio_q3": s["q3"], "ratio_min": s["min"], "ratio_max": s["max"], "ratio_per_run": per_run})
    return out


def _rank(rows: list[dict[str, Any]], temp: float, allowed: set[str] | None, runs: int) -> list[dict[str, Any]]:
    cand = [r for r in rows if r["temperature"] == temp and (allowed is None or r["setting"] in allowed)]
    if (allowed is None or "plain" in allowed) and not any(r["setting"] == "plain" for r in cand):
        cand.append({"temperature": temp, "setting": "plain", "ratio": 1.0, "ratio_q1": 1.0, "ratio_q3": 1.0,
                     "ratio_min": 1.0, "ratio_max": 1.0, "ratio_per_run": [1.0] * runs})
    return sorted(cand, key=lambda r: r["ratio"], reverse=True)


def compare(measurements: Iterable[Any], a: str, b: str, temp: float) -> dict[str, Any]:
    """Paired comparison of settings ``a`` and ``b`` over the blocks both ran in."""
    ms = [_as_dict(m) for m in measurements if _as_dict(m)["temperature"] == temp]
    tok = {(m["run"], m["prompt"], m["setting"]): m["tok_s"] for m in ms}
    wins = losses = ties = 0
    for (run, prompt, setting), x in tok.items():
        if setting != a or (run, prompt, b) not in tok:
            continue
        y = tok[(run, prompt, b)]
        wins += x > y
        losses += x < y
        ties += x == y
    return {"wins": wins, "losses": losses, "ties": ties, "sign_test_p": sign_test(wins, losses)}


def best(measurements: Iterable[Any], rows: list[dict[str, Any]], settings: list[Setting],
         temperatures: list[float]) -> list[dict[str, Any]]:
    ms = [_as_dict(m) for m in measurements]
    runs = len({m["run"] for m in ms})
    lossless = {s.name for s in settings if s.lossless}
    out = []
    for temp in temperatures:
        ranked = _rank(rows, temp, None, runs)
        if not ranked:
            continue
        top = ranked[0]
        entry: dict[str, Any] = {"temperature": temp, "setting": top["setting"], "ratio": top["ratio"],
                                 "lossless": top["setting"] in lossless, "rule": NOISE_RULE}
        if len(ranked) > 1:
            second = ranked[1]
            c = compare(ms, top["setting"], second["setting"], temp)
            entry.update({
                "runner_up": second["setting"], "runner_up_ratio": second["ratio"], **c,
                "spreads_overlap": overlap((top["ratio_q1"], top["ratio_q3"]), (second["ratio_q1"], second["ratio_q3"])),
                "within_noise": c["sign_test_p"] >= ALPHA,
            })
        if top["setting"] not in lossless:
            safe = _rank(rows, temp, lossless, runs)
            if safe:
                entry["best_lossless"] = {"setting": safe[0]["setting"], "ratio": safe[0]["ratio"]}
        out.append(entry)
    return out


def analyse(measurements: Iterable[Any], settings: list[Setting], temperatures: list[float]) -> dict[str, Any]:
    ms = [_as_dict(m) for m in measurements]
    prs = pairs(ms)
    rows = overall(prs)
    return {"pairs": prs, "results": cells(ms, prs), "overall": rows,
            "best": best(ms, rows, settings, temperatures)}
