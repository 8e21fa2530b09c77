"""Two checkouts of tandem, side by side: plain decode and speculation, in one interleaved run.

    python -m benchmarks.ab --base DIR [--base-module engine.bench_spec] --model target.gguf --draft draft.gguf
        [--rounds 3] [--tokens 64] [--prompts code,prose] [--temps 0] [--configs strict-n2,adaptive]
        [--json out.json] [--markdown out.md]

A change that should not move speed (a restructuring, say) is checked against the commit before it by
running the same speculation benchmark (``benchmarks.speculation``, or the module of that name in the
base checkout) in both, alternately: round r runs the base then this checkout, round r + 1 the other way
round, each in a fresh process (one loaded model per process, as in the server). The machine's drift then
hits both sides alike, and the per-round ratio of this checkout to the base, with its spread over rounds,
says whether the change moved anything beyond noise. Reported per (prompt, temperature, configuration):
tok/s on each side (median over rounds), this/base ratio per round, and each side's ratio to plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _run(tree: Path, module: str, args: list[str], out: Path) -> dict:
    """One benchmark process in ``tree`` (its packages first on the path); its JSON report."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", module, *args, "--json", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _cells(report: dict) -> dict[tuple[str, str, str], float]:
    return {(r["prompt"], str(r["temperature"]), r["config"]): float(r["tok_s"]) for r in report["results"]}


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (a git worktree of the base commit)")
    ap.add_argument("--base-module", default="benchmarks.speculation",
                    help="the speculation benchmark's module in the base checkout (engine.bench_spec before "
                         "the restructuring)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", default="code,prose")
    ap.add_argument("--temps", default="0")
    ap.add_argument("--configs", default="strict-n2,adaptive")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)

    bench_args = ["--model", args.model, "--tokens", str(args.tokens), "--runs", "1", "--warmup", "1",
                  "--prompts", args.prompts, "--temps", args.temps, "--configs", args.configs,
                  "--threads", str(args.threads)]
    if args.draft:
        bench_args += ["--draft", args.draft]
    sides = {"base": (Path(args.base).resolve(), args.base_module), "this": (HERE, "benchmarks.speculation")}
    samples: dict[str, list[dict]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
            for side in order:
                tree, module = sides[side]
                report = _run(tree, module, bench_args, Path(tmp) / f"{side}-{r}.json")
                samples[side].append(_cells(report))
                print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)

    keys = sorted(set.intersection(*(set(c) for c in samples["base"] + samples["this"])))
    rows = []
    for key in keys:
        prompt, temp, config = key
        base = [c[key] for c in samples["base"]]
        this = [c[key] for c in samples["this"]]
        ratios = [t / b for t, b in zip(this, base) if b > 0]
        plain = (prompt, temp, "plain")
        row = {"prompt": prompt, "temperature": temp, "config": config,
               "base_tok_s": round(statistics.median(base), 3), "this_tok_s": round(statistics.median(this), 3),
               "this_over_base": round(statistics.median(ratios), 3) if ratios else None,
               "this_over_base_range": _spread(ratios)}
        if config != "plain" and plain in keys:
            row["base_vs_plain"] = round(statistics.median(
                [c[key] / c[plain] for c in samples["base"] if c[plain] > 0]), 3)
            row["this_vs_plain"] = round(statistics.median(
                [c[key] / c[plain] for c in samples["this"] if c[plain] > 0]), 3)
        rows.append(row)

    table = ["| prompt | temp | config | base tok/s | this tok/s | this / base (median) | per-round range "
             "| base × plain | this × plain |", "|---|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        table.append(f"| {r['prompt']} | {r['temperature']} | {r['config']} | {r['base_tok_s']:.2f} | "
                     f"{r['this_tok_s']:.2f} | {r['this_over_base']} | {r['this_over_base_range']} | "
                     f"{r.get('base_vs_plain', '')} | {r.get('this_vs_plain', '')} |")
    text = "\n".join(table)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "samples": {
            side: [{"|".join(k): v for k, v in c.items()} for c in cs] for side, cs in samples.items()}},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
