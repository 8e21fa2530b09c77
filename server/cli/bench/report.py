"""Terminal tables (rich), markdown tables and the best-setting sentence."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table


def _f(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _ratio(r: dict[str, Any]) -> str:
    if r["setting"] == "plain":
        return "1.00"
    return f"{_f(r['ratio'])} [{_f(r['ratio_q1'])}–{_f(r['ratio_q3'])}]"


def _positions(xs: list[float], n: int = 6) -> str:
    if not xs:
        return "–"
    s = " ".join(f"{x:.2f}" for x in xs[:n])
    return s + (" …" if len(xs) > n else "")


def _order(rows: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    rank = {n: i for i, n in enumerate(names)}
    return sorted(rows, key=lambda r: rank.get(r["setting"], len(rank)))


def best_sentences(best: list[dict[str, Any]]) -> list[str]:
    out = []
    for b in best:
        line = f"Best setting at temperature {b['temperature']:g}: {b['setting']} ({b['ratio']:.2f}x plain"
        line += ", lossless)" if b["lossless"] else ", lossy)"
        if "runner_up" in b:
            verdict = "within noise" if b["within_noise"] else "a real difference"
            line += (f"; runner-up {b['runner_up']} ({b['runner_up_ratio']:.2f}x): {verdict} "
                     f"(won {b['wins']} of {b['wins'] + b['losses'] + b['ties']} paired blocks, sign test p = "
                     f"{b['sign_test_p']:.3f}; IQRs {'overlap' if b['spreads_overlap'] else 'do not overlap'})")
        out.append(line + ".")
        if "best_lossless" in b:
            bl = b["best_lossless"]
            out.append(f"Best lossless setting at temperature {b['temperature']:g}: {bl['setting']} "
                       f"({bl['ratio']:.2f}x plain).")
    return out


def speed_tables(console: Console, report: dict[str, Any]) -> None:
    names = [s["name"] for s in report["settings"]]
    for temp in report["config"]["temperatures"]:
        t = Table(title=f"Speed at temperature {temp:g} (× plain: median [IQR] of same-run ratios, "
                        f"{report['config']['runs']} runs)")
        for col, just in (("prompt", "left"), ("setting", "left"), ("tok/s", "right"), ("× plain", "right"),
                          ("accept", "right"), ("mean acc. len", "right"), ("acceptance by position", "left")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        prompts = []
        for r in report["results"]:
            if r["prompt"] not in prompts:
                prompts.append(r["prompt"])
        for p in prompts:
            rows = _order([r for r in report["results"] if r["prompt"] == p and r["temperature"] == temp], names)
            for r in rows:
                t.add_row(p, r["setting"], _f(r["tok_s"]), _ratio(r), _f(r["acceptance_rate"]),
                          _f(r["mean_accepted_length"]), _positions(r["acceptance_by_position"]))
            t.add_section()
        console.print(t)
        o = Table(title=f"All prompts at temperature {temp:g} (geometric mean over prompts, per run)")
        for col in ("setting", "× plain median", "IQR", "min–max"):
            o.add_column(col, justify="left" if col == "setting" else "right")
        for r in _order([r for r in report["overall"] if r["temperature"] == temp], names):
            o.add_row(r["setting"], _f(r["ratio"]), f"{_f(r['ratio_q1'])}–{_f(r['ratio_q3'])}",
                      f"{_f(r['ratio_min'])}–{_f(r['ratio_max'])}")
        console.print(o)
    for line in best_sentences(report["best"]):
        console.print(line)
    console.print(f"Rule: {report['noise_rule']}.")


def speed_markdown(report: dict[str, Any]) -> str:
    names = [s["name"] for s in report["settings"]]
    out = ["| prompt | temp | setting | tok/s | × plain (median) | × plain IQR | accept | mean acc. len | "
           "acceptance by position |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for temp in report["config"]["temperatures"]:
        rows = [r for r in report["results"] if r["temperature"] == temp]
        prompts = list(dict.fromkeys(r["prompt"] for r in rows))
        for p in prompts:
            for r in _order([r for r in rows if r["prompt"] == p], names):
                iqr = "" if r["setting"] == "plain" else f"{_f(r['ratio_q1'])}–{_f(r['ratio_q3'])}"
                out.append(f"| {p} | {temp:g} | {r['setting']} | {_f(r['tok_s'])} | {_f(r['ratio'])} | {iqr} | "
                           f"{_f(r['acceptance_rate'])} | {_f(r['mean_accepted_length'])} | "
                           f"{_positions(r['acceptance_by_position'], 8)} |")
    out += ["", "| temp | setting | × plain, all prompts (median) | IQR | min–max |", "|---|---|---:|---:|---:|"]
    for temp in report["config"]["temperatures"]:
        for r in _order([r for r in report["overall"] if r["temperature"] == temp], names):
            out.append(f"| {temp:g} | {r['setting']} | {_f(r['ratio'])} | {_f(r['ratio_q1'])}–{_f(r['ratio_q3'])} | "
                       f"{_f(r['ratio_min'])}–{_f(r['ratio_max'])} |")
    out += [""] + [f"- {line}" for line in best_sentences(report["best"])] + [f"- Rule: {report['noise_rule']}."]
    return "\n".join(out) + "\n"


def quality_tables(console: Console, quality: dict[str, Any]) -> None:
    he = quality.get("humaneval")
    if he:
        t = Table(title=f"HumanEval pass@1 ({he['n_problems']} problems; 95% Wilson interval; paired with strict)")
        for col in ("temp", "setting", "passed", "pass@1", "95% CI", "vs strict (both/strict only/setting only)",
                    "McNemar p", "verdict"):
            t.add_column(col)
        for r in he["summary"]:
            vs = r.get("vs_strict")
            t.add_row(f"{r['temperature']:g}", r["setting"], f"{r['passed']}/{r['n']}", _f(r["pass_at_1"], 3),
                      f"{_f(r['ci_low'], 3)}–{_f(r['ci_high'], 3)}",
                      f"{vs['both']}/{vs['strict_only']}/{vs['setting_only']}" if vs else "",
                      _f(vs["mcnemar_p"], 3) if vs else "", r["verdict"])
        console.print(t)
    prose = quality.get("prose")
    if prose:
        t = Table(title=f"Target likelihood of generated prose ({prose['n_prompts']} prompts)")
        for col in ("temp", "setting", "tokens", "mean NLL", "perplexity", "Δ NLL vs strict", "≠ target greedy"):
            t.add_column(col)
        for r in prose["summary"]:
            t.add_row(f"{r['temperature']:g}", r["setting"], str(r["tokens"]), _f(r["mean_nll"], 3),
                      _f(r["perplexity"], 2), _f(r.get("delta_nll_vs_strict"), 3), _f(r["differs_from_greedy"], 3))
        console.print(t)


def quality_markdown(quality: dict[str, Any]) -> str:
    out = []
    he = quality.get("humaneval")
    if he:
        out += [f"HumanEval, {he['n_problems']} problems:", "",
                "| temp | setting | pass@1 | 95% CI | both / strict only / setting only | McNemar p | verdict |",
                "|---|---|---:|---|---|---:|---|"]
        for r in he["summary"]:
            vs = r.get("vs_strict")
            out.append(f"| {r['temperature']:g} | {r['setting']} | {_f(r['pass_at_1'], 3)} ({r['passed']}/{r['n']}) | "
                       f"{_f(r['ci_low'], 3)}–{_f(r['ci_high'], 3)} | "
                       f"{(str(vs['both']) + ' / ' + str(vs['strict_only']) + ' / ' + str(vs['setting_only'])) if vs else ''} | "
                       f"{_f(vs['mcnemar_p'], 3) if vs else ''} | {r['verdict']} |")
        out.append("")
    prose = quality.get("prose")
    if prose:
        out += [f"Prose, {prose['n_prompts']} prompts (target's log-likelihood of the generated text):", "",
                "| temp | setting | tokens | mean NLL | Δ NLL vs strict | ≠ target greedy |", "|---|---|---:|---:|---:|---:|"]
        for r in prose["summary"]:
            out.append(f"| {r['temperature']:g} | {r['setting']} | {r['tokens']} | {_f(r['mean_nll'], 3)} | "
                       f"{_f(r.get('delta_nll_vs_strict'), 3)} | {_f(r['differs_from_greedy'], 3)} |")
    return "\n".join(out) + "\n"
