"""`tandem bench MODEL`: the command-line entry (arguments, then the speed sweep or the quality run).

This module imports only argparse at load time (the CLI builds its parser on every start); the
benchmark's own modules, rich and matplotlib load when the command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class BenchError(Exception):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--host", help="server address (default: TANDEM_HOST, else OLLAMA_HOST, else 127.0.0.1:11434)")
    g = p.add_argument_group("what to run")
    g.add_argument("--prompts", metavar="FILE", help="JSON prompts file (default: built-in code, prose, repetitive)")
    g.add_argument("--prompt-names", metavar="A,B", help="only these prompts (comma-separated names)")
    g.add_argument("--temperature", metavar="T,T",
                   help="comma-separated temperatures (default 0,0.6; 0.6 with --quality); above 0 with --min-p")
    g.add_argument("--min-p", type=float, default=0.01, help="min_p at temperatures above 0 (default 0.01)")
    g.add_argument("--num-predict", type=int, default=128, help="tokens generated per request (default 128)")
    g.add_argument("--runs", type=int, default=3, help="measured runs of the whole grid (default 3)")
    g.add_argument("--warmup", type=int, default=1, help="discarded warm-up runs of the whole grid (default 1)")
    g.add_argument("--seed", type=int, default=1000, help="seed of run 0 (run r uses seed + r)")
    g.add_argument("--keepalive", help="keep_alive sent with every request (e.g. 30m)")
    s = p.add_argument_group("settings grid (plain is always included)")
    s.add_argument("--n-max", default="1,2,4", help="strict draft lengths (default 1,2,4)")
    s.add_argument("--relaxed", default="1,2,5,20", help="relaxed top-N values (default 1,2,5,20; '' for none)")
    s.add_argument("--relaxed-n-max", default="2,4", help="draft lengths of the relaxed settings (default 2,4)")
    s.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive setting")
    s.add_argument("--adaptive-n-max", type=int, default=8, help="depth cap of the adaptive setting (default 8)")
    s.add_argument("--no-ngram", action="store_true", help="leave out the n-gram settings")
    s.add_argument("--ngram-n-max", type=int, default=4, help="draft length of the fixed n-gram setting (default 4)")
    s.add_argument("--grid", metavar="FILE", help="JSON grid: the knobs above, or an explicit list of settings")
    q = p.add_argument_group("quality (--quality: HumanEval pass@1 and prose likelihood, strict vs relaxed)")
    q.add_argument("--quality", action="store_true", help="run the quality harness instead of the speed sweep")
    q.add_argument("--limit", type=int, help="only the first N HumanEval problems")
    q.add_argument("--quality-num-predict", type=int, default=512, help="tokens per HumanEval completion (default 512)")
    q.add_argument("--prose-num-predict", type=int, help="tokens per prose generation (default: --num-predict)")
    q.add_argument("--timeout", type=float, default=10.0, help="seconds per sandboxed test program (default 10)")
    q.add_argument("--memory-mb", type=int, default=1024, help="address-space limit of a test program (default 1024)")
    q.add_argument("--no-humaneval", action="store_true", help="skip HumanEval")
    q.add_argument("--no-prose", action="store_true", help="skip the prose likelihood measurement")
    a = p.add_argument_group("apply (write the best setting into the model, through the server)")
    a.add_argument("--apply", action="store_true",
                   help="after the sweep, write the best lossless setting of the measured temperature into the "
                        "model as PARAMETERs, with where they came from (one temperature: see README)")
    a.add_argument("--as", dest="apply_as", metavar="NEW",
                   help="with --apply: create NEW (from MODEL plus the setting) instead of replacing MODEL")
    a.add_argument("--allow-lossy", action="store_true",
                   help="with --apply: apply the overall best even when it is lossy (relaxed_top_n above 0)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write the full report (every measurement) as JSON")
    o.add_argument("--plots", metavar="DIR", help="write PNG plots to this folder")
    o.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    o.add_argument("--quiet", action="store_true", help="no progress bar")


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise BenchError(f"{flag} needs at least one value, none negative (got {text!r})")
    return values


def _settings(args: argparse.Namespace):
    from .grid import GridError, build_grid, load_grid, parse_int_list

    try:
        if args.grid:
            return load_grid(args.grid)
        return build_grid(n_max=parse_int_list(args.n_max, "--n-max"),
                          relaxed_top=parse_int_list(args.relaxed, "--relaxed"),
                          relaxed_n_max=parse_int_list(args.relaxed_n_max, "--relaxed-n-max"),
                          adaptive=not args.no_adaptive, adaptive_n_max=args.adaptive_n_max,
                          ngram=not args.no_ngram, ngram_n_max=args.ngram_n_max)
    except GridError as e:
        raise BenchError(str(e)) from None


def _host(args: argparse.Namespace) -> str | None:
    return args.host or os.environ.get("TANDEM_HOST") or os.environ.get("OLLAMA_HOST") or None


def _effective_drafter(client, model: str) -> str:
    info = client._request("POST", "/api/show", json={"model": model, "options": {"draft_num_predict": 4}}).json()
    return str(((info.get("speculation") or {}).get("effective") or {}).get("drafter", "none"))


class _Progress:
    """A rich progress bar on stderr (or nothing with --quiet)."""

    def __init__(self, total: int, quiet: bool):
        self.bar = None
        if quiet:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self.task = self.bar.add_task("starting", total=total)
        self.last = ""

    def __enter__(self) -> "_Progress":
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.stop()

    def __call__(self, what: str, result: Any) -> None:
        if not self.bar:
            return
        if result is None:
            self.bar.update(self.task, description=f"{what}{self.last}")
            return
        if hasattr(result, "tok_s"):
            self.last = f"  (last: {result.tok_s:.1f} tok/s)"
        elif isinstance(result, dict) and "status" in result:
            self.last = f"  (last: {result['status']})"
        self.bar.update(self.task, advance=1, description=f"{what}{self.last}")


def run_bench(args: argparse.Namespace) -> None:
    from rich.console import Console

    from ..client import APIError, Client
    from .prompts import PromptsError, builtin_prompts, builtin_prose, load_prompts, select

    if args.runs < 1 or args.warmup < 0 or args.num_predict < 1:
        raise BenchError("--runs and --num-predict must be at least 1, --warmup at least 0")
    temps = _floats(args.temperature or ("0.6" if args.quality else "0,0.6"), "--temperature")
    if (args.apply_as or args.allow_lossy) and not args.apply:
        raise BenchError("--as and --allow-lossy only go with --apply")
    if args.apply and args.quality:
        raise BenchError("--apply goes with the speed sweep, not --quality")
    settings = _settings(args)
    try:
        prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
        prompts = select(prompts, args.prompt_names)
    except PromptsError as e:
        raise BenchError(str(e)) from None
    console = Console(width=None if sys.stdout.isatty() else 200)
    client = Client(_host(args))
    try:
        try:
            version = client.version()
            drafter = _effective_drafter(client, args.model)
            shown = client.show(args.model) if args.apply else {}
        except APIError as e:
            raise BenchError(str(e)) from None
        apply_temp = None
        if args.apply:
            from .apply import ApplyError, apply_temperature

            try:
                apply_temp = apply_temperature(temps, shown)  # refuses before anything is measured
            except ApplyError as e:
                raise BenchError(str(e)) from None
        if drafter == "none":
            dropped = [s.name for s in settings if s.kind != "plain" and s.needs_draft_model]
            settings = [s for s in settings if s.name not in dropped]
            if dropped:
                console.print(f"note: {args.model} has no DRAFT model or MTP head; skipping {', '.join(dropped)}",
                              soft_wrap=True)
        report: dict[str, Any] = {
            "tandem_bench": 1, "model": args.model, "host": client.base_url, "server_version": version,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv[1:],
            "drafter": drafter,
        }
        try:
            # Load the model before anything is timed (a request without a prompt only loads).
            body: dict[str, Any] = {"model": args.model}
            if args.keepalive is not None:
                body["keep_alive"] = args.keepalive
            for _ in client.generate(body):
                pass
            if args.quality:
                prose = [p for p in prompts if p.kind == "prose"] if args.prompts else []
                _quality(args, client, console, report, settings, temps, prose or builtin_prose())
            else:
                _speed(args, client, console, report, settings, temps, prompts)
                if apply_temp is not None:
                    _apply(args, client, console, report, settings, apply_temp, shown)
        except APIError as e:
            raise BenchError(str(e)) from None
    finally:
        client.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    if report.get("interrupted"):
        raise KeyboardInterrupt


def _speed(args, client, console, report, settings, temps, prompts) -> None:
    from .analysis import NOISE_RULE, analyse
    from .report import speed_markdown, speed_tables
    from .runner import SpeedPlan, run_speed

    if len(settings) < 2:
        raise BenchError("nothing to compare: the grid has no setting besides plain")
    plan = SpeedPlan(model=args.model, prompts=prompts, settings=settings, temperatures=temps,
                     num_predict=args.num_predict, runs=args.runs, warmup=args.warmup, min_p=args.min_p,
                     seed=args.seed, keep_alive=args.keepalive)
    measurements: list = []
    try:
        with _Progress(plan.requests, args.quiet) as progress:
            run_speed(client, plan, progress, measurements)
    except KeyboardInterrupt:
        # Report what was measured (the caller exits with 130 after writing the outputs).
        report["interrupted"] = True
        console.print(f"interrupted: reporting the {len(measurements)} measurements made so far")
        if not measurements:
            raise
    analysis = analyse(measurements, settings, temps)
    report.update({
        "config": {"prompts": [{"name": p.name, "kind": p.kind, "text": p.text} for p in prompts],
                   "temperatures": temps, "min_p": args.min_p, "num_predict": args.num_predict, "runs": args.runs,
                   "warmup": args.warmup, "seed": args.seed,
                   "order": "per (run, prompt, temperature) block, every setting back to back with the same seed; "
                            "the order rotates by one setting per block"},
        "settings": [s.to_json() for s in settings],
        "noise_rule": NOISE_RULE,
        "measurements": [m.to_json() for m in measurements],
        **analysis,
    })
    speed_tables(console, report)
    if args.markdown:
        Path(args.markdown).write_text(speed_markdown(report))
    if args.plots:
        from .plots import write_speed_plots

        report["plots"] = write_speed_plots(report, args.plots)
        console.print(f"plots: {', '.join(report['plots'])}", soft_wrap=True)


def _apply(args, client, console, report, settings, temperature, shown) -> None:
    from .apply import ApplyError, apply_best

    if report.get("interrupted"):
        console.print("--apply: the sweep was interrupted; nothing applied")
        return
    try:
        applied = apply_best(client, report, settings, temperature, shown, source=args.model,
                             target=args.apply_as or args.model, allow_lossy=args.allow_lossy,
                             say=lambda text: console.print(text, soft_wrap=True))
    except ApplyError as e:
        raise BenchError(str(e)) from None
    report["applied"] = {"model": applied.model, "temperature": temperature, "parameters": applied.options}
    console.print(applied.message, soft_wrap=True)


def _quality(args, client, console, report, settings, temps, prose) -> None:
    from .quality import (
        INSTRUCTION,
        QualityError,
        QualityPlan,
        load_problems,
        quality_settings,
        run_humaneval,
        run_prose,
        summarize_humaneval,
        summarize_prose,
    )
    from .report import quality_markdown, quality_tables

    chosen = quality_settings(settings)
    if 0.0 in temps and len(chosen) > 1:
        console.print("note: relaxed_top_n equals strict at temperature 0 (a draft is ranked among the candidates "
                      "that survive the sampling filters, and greedy keeps one): relaxed settings can only differ "
                      "from strict at temperatures above 0", soft_wrap=True)
    try:
        problems = [] if args.no_humaneval else load_problems(args.limit)
    except QualityError as e:
        raise BenchError(str(e)) from None
    plan = QualityPlan(model=args.model, settings=chosen, temperatures=temps, problems=problems,
                       prose=[] if args.no_prose else prose, num_predict=args.quality_num_predict,
                       prose_num_predict=args.prose_num_predict or args.num_predict, min_p=args.min_p,
                       seed=args.seed, timeout=args.timeout, memory_bytes=args.memory_mb << 20,
                       keep_alive=args.keepalive)
    quality: dict[str, Any] = {"settings": [s.to_json() for s in chosen], "reference": chosen[0].name}
    with _Progress(plan.requests, args.quiet) as progress:
        try:
            if problems:
                rows = run_humaneval(client, plan, progress)
                quality["humaneval"] = {
                    "n_problems": len(problems), "limit": args.limit, "prompt": INSTRUCTION,
                    "method": "chat turn rendered by the server, answer pre-filled with ```python + the problem "
                              "prompt, raw generation stopped at ```; program = prompt + completion + tests + "
                              "check(entry_point) run in the sandbox",
                    "num_predict": args.quality_num_predict, "timeout_s": args.timeout, "memory_mb": args.memory_mb,
                    "summary": summarize_humaneval(rows, chosen, temps), "problems": rows}
            if plan.prose:
                prose_rows = run_prose(client, plan, progress)
                quality["prose"] = {"n_prompts": len(plan.prose), "num_predict": plan.prose_num_predict,
                                    "prompts": {p.name: p.text for p in plan.prose},
                                    "summary": summarize_prose(prose_rows, chosen, temps), "rows": prose_rows}
        except QualityError as e:
            raise BenchError(str(e)) from None
    report.update({"config": {"temperatures": temps, "min_p": args.min_p, "seed": args.seed}, "quality": quality})
    quality_tables(console, quality)
    for r in quality.get("humaneval", {}).get("summary", []):
        if r["setting"] != chosen[0].name:
            ref = next(x for x in quality["humaneval"]["summary"]
                       if x["setting"] == chosen[0].name and x["temperature"] == r["temperature"])
            console.print(f"{r['setting']} at temperature {r['temperature']:g}: {r['verdict']} (pass@1 "
                          f"{r['pass_at_1'] or 0:.3f} [{r['ci_low']:.3f}–{r['ci_high']:.3f}] vs strict "
                          f"{ref['pass_at_1'] or 0:.3f} [{ref['ci_low']:.3f}–{ref['ci_high']:.3f}])", soft_wrap=True)
    if args.markdown:
        Path(args.markdown).write_text(quality_markdown(quality))
    if args.plots:
        from .plots import write_quality_plots

        report["plots"] = write_quality_plots(quality, args.model, args.plots)
        console.print(f"plots: {', '.join(report['plots'])}", soft_wrap=True)
