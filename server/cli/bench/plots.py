"""PNG plots of a bench report (matplotlib, Agg backend: no display needed).

* ``speed_vs_relaxed_top_n.png``: median tok/s (bars: min–max over runs) against relaxed_top_n
  ("strict" = 0), one line per draft length, plain as a dashed line; one panel per prompt and
  temperature;
* ``speed_vs_n_max.png``: median tok/s against n_max for strict and each relaxed top-N;
* ``acceptance_by_position.png``: acceptance rate at each draft position, one line per strict
  setting (and the adaptive and n-gram ones);
* ``quality_pass_at_1.png`` (with ``--quality``): HumanEval pass@1 with its 95% Wilson interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(report: dict[str, Any], path: Path, title: str, xlabel: str, ylabel: str, draw) -> None:
    """One panel per (temperature, prompt): ``draw(ax, prompt, temp)`` plots into it; labels, grid,
    legend, the figure title and the PNG file are the same for every speed figure."""
    temps, prompts, _, _ = _cells(report)
    plt = _plt()
    fig, axes = plt.subplots(len(temps), len(prompts), figsize=(4.6 * len(prompts), 3.6 * len(temps)),
                             squeeze=False)
    for i, temp in enumerate(temps):
        for j, prompt in enumerate(prompts):
            ax = axes[i][j]
            draw(ax, prompt, temp)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{prompt}, temperature {temp:g}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{report['model']}: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cells(report: dict[str, Any]) -> tuple[list[float], list[str], dict, dict]:
    temps = list(report["config"]["temperatures"])
    prompts = list(dict.fromkeys(r["prompt"] for r in report["results"]))
    cell = {(r["prompt"], r["temperature"], r["setting"]): r for r in report["results"]}
    meta = {s["name"]: s for s in report["settings"]}
    return temps, prompts, cell, meta


def _errbar(ax, xs, rows, label, **kw):
    ys = [r["tok_s"] for r in rows]
    lo = [max(0.0, r["tok_s"] - r["tok_s_min"]) for r in rows]
    hi = [max(0.0, r["tok_s_max"] - r["tok_s"]) for r in rows]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, **kw)


def _plain_line(ax, cell, prompt, temp):
    p = cell.get((prompt, temp, "plain"))
    if p:
        ax.axhline(p["tok_s"], color="grey", linestyle="--", linewidth=1, label="plain")


def speed_vs_relaxed(report: dict[str, Any], path: Path) -> bool:
    _, _, cell, meta = _cells(report)
    relaxed = [s for s in meta.values() if s["kind"] == "relaxed"]
    if not relaxed:
        return False
    tops = sorted({s["relaxed_top_n"] for s in relaxed})
    depths = sorted({s["n_max"] for s in relaxed})
    xs_all = [0] + tops

    def draw(ax, prompt, temp):
        for n in depths:
            pts = []
            st = next((s for s in meta.values() if s["kind"] == "strict" and s["n_max"] == n), None)
            if st and (prompt, temp, st["name"]) in cell:
                pts.append((0, cell[(prompt, temp, st["name"])]))
            for s in relaxed:
                if s["n_max"] == n and (prompt, temp, s["name"]) in cell:
                    pts.append((s["relaxed_top_n"], cell[(prompt, temp, s["name"])]))
            pts.sort(key=lambda p: p[0])
            if pts:
                _errbar(ax, [xs_all.index(x) for x, _ in pts], [r for _, r in pts], f"n_max {n}")
        _plain_line(ax, cell, prompt, temp)
        ax.set_xticks(range(len(xs_all)), ["strict"] + [str(t) for t in tops])

    _panels(report, path, "decode speed against relaxed_top_n", "relaxed_top_n", "tokens/s", draw)
    return True


def speed_vs_n_max(report: dict[str, Any], path: Path) -> bool:
    _, _, cell, meta = _cells(report)
    families: dict[str, list[dict]] = {}
    for s in meta.values():
        if s["kind"] == "strict":
            families.setdefault("strict", []).append(s)
        elif s["kind"] == "relaxed":
            families.setdefault(f"relaxed top-{s['relaxed_top_n']}", []).append(s)
    if not families:
        return False

    def draw(ax, prompt, temp):
        for label, members in families.items():
            pts = sorted((s["n_max"], cell[(prompt, temp, s["name"])]) for s in members
                         if (prompt, temp, s["name"]) in cell)
            if pts:
                _errbar(ax, [n for n, _ in pts], [r for _, r in pts], label)
        _plain_line(ax, cell, prompt, temp)
        ax.set_xticks(sorted({s["n_max"] for m in families.values() for s in m}))

    _panels(report, path, "decode speed against n_max", "n_max (draft length)", "tokens/s", draw)
    return True


def acceptance_by_position(report: dict[str, Any], path: Path) -> bool:
    _, _, cell, meta = _cells(report)
    shown = [s for s in meta.values() if s["kind"] in ("strict", "adaptive", "ngram")]
    if not any(cell[k]["acceptance_by_position"] for k in cell):
        return False

    def draw(ax, prompt, temp):
        width = 1
        for s in shown:
            r = cell.get((prompt, temp, s["name"]))
            if r and r["acceptance_by_position"]:
                xs = list(range(1, len(r["acceptance_by_position"]) + 1))
                ax.plot(xs, r["acceptance_by_position"], marker="o", label=s["name"])
                width = max(width, len(xs))
        ax.set_xticks(range(1, width + 1))
        ax.set_ylim(0, 1.05)

    _panels(report, path, "acceptance by draft position", "draft position", "acceptance rate", draw)
    return True


def pass_at_1(quality: dict[str, Any], model: str, path: Path) -> bool:
    he = quality.get("humaneval")
    if not he or not he["summary"]:
        return False
    plt = _plt()
    rows = he["summary"]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 2), 4))
    labels = [f"{r['setting']}\nt={r['temperature']:g}" for r in rows]
    ys = [r["pass_at_1"] or 0.0 for r in rows]
    err = [[max(0.0, y - r["ci_low"]) for y, r in zip(ys, rows)], [max(0.0, r["ci_high"] - y) for y, r in zip(ys, rows)]]
    ax.bar(range(len(rows)), ys, yerr=err, capsize=4, color=["tab:blue" if "verdict" in r and
                                                             r["verdict"].startswith("reference") else "tab:orange"
                                                             for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (95% Wilson interval)")
    ax.set_title(f"{model}: HumanEval, {he['n_problems']} problems")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_speed_plots(report: dict[str, Any], folder: str | Path) -> list[str]:
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for name, fn in (("speed_vs_relaxed_top_n.png", speed_vs_relaxed), ("speed_vs_n_max.png", speed_vs_n_max),
                     ("acceptance_by_position.png", acceptance_by_position)):
        if fn(report, d / name):
            out.append(str(d / name))
    return out


def write_quality_plots(quality: dict[str, Any], model: str, folder: str | Path) -> list[str]:
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "quality_pass_at_1.png"
    return [str(path)] if pass_at_1(quality, model, path) else []
