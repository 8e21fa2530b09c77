"""Write docs/bench/README.md: every benchmark run in docs/bench/, with the command that wrote it and the CPU it ran on,
read from the file itself (each run's markdown is headed by both), its JSON data beside it, and the plots.

    python -m benchmarks.bench_index            # rewrites docs/bench/README.md
    python -m benchmarks.bench_index --check    # exit 1 when the index is stale (a run added without it)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "docs" / "bench"
INDEX = BENCH / "README.md"
_CPU = re.compile(r"(AMD EPYC[^,;|]*|Intel[^,;|]*Xeon[^,;|]*|Xeon[^,;|]*|Zen ?\d[^,;|]*)")
_COMMAND = re.compile(r"`((?:python -m |tandem |bash )[^`]+)`")


def _first(pattern: re.Pattern[str], text: str) -> str:
    m = pattern.search(text)
    return " ".join(m.group(1).split()) if m else ""


def describe(md: Path) -> tuple[str, str, str]:
    """(title, command, CPU) of one run, as its file states them ("" where it does not)."""
    text = md.read_text(errors="replace")
    title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), md.stem)
    command = _first(_COMMAND, text) or next(
        (" ".join(line.split()) for line in text.splitlines() if line.lstrip().startswith(("python -m", "tandem "))), "")
    return title, command, _first(_CPU, text)


def _cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render() -> str:
    lines = ["# Benchmark runs", "",
             "Every file here, with the command that wrote it and the CPU it ran on as the file itself states them",
             "(written by `python -m benchmarks.bench_index`; a run's JSON data sits beside its markdown). What the",
             "runs showed is told where they are cited: [../performance.md](../performance.md),",
             "[../speculation-measured.md](../speculation-measured.md), [serving.md](serving.md),",
             "[speculation-defaults.md](speculation-defaults.md), [../measurements.md](../measurements.md).", "",
             "| run | title | command | CPU | data |", "|---|---|---|---|---|"]
    for md in sorted(p for p in BENCH.glob("*.md") if p != INDEX):
        title, command, cpu = describe(md)
        data = md.with_suffix(".json")
        lines.append(f"| [{md.name}]({md.name}) | {_cell(title)} | {f'`{_cell(command, 150)}`' if command else ''} | "
                     f"{_cell(cpu, 60)} | {f'[json]({data.name})' if data.exists() else ''} |")
    orphans = sorted(p for p in BENCH.glob("*.json") if not p.with_suffix(".md").exists())
    if orphans:
        lines += ["", "Data without a markdown run: " + ", ".join(f"[{p.name}]({p.name})" for p in orphans) + "."]
    plots = sorted((BENCH / "plots").glob("*.png")) if (BENCH / "plots").is_dir() else []
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{p.name}](plots/{p.name})" for p in plots) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_index", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        return 0 if INDEX.exists() and INDEX.read_text() == text else 1
    INDEX.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
