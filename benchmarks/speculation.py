"""Speculative decoding benchmark: every drafter/rule/depth configuration in ONE interleaved run.

    python -m benchmarks.speculation --model target.gguf --draft draft.gguf [--head head.gguf]
        [--tokens 128 --runs 3 --warmup 1] [--prompts code,prose,repetitive] [--temps 0,0.6]
        [--configs plain,strict-n4,...] [--paired] [--json out.json] [--markdown out.md]

``--head``: an MTP head (what ``tandem train-drafter`` fits, or an EAGLE-3 head) for the same target, loaded as a
second engine beside the draft model's: the mtp-* configurations run on it, every other one on the draft model's,
so the head, the draft model and plain decoding share one interleaved run.

Configurations (issue 4): plain; strict with n_max 1, 2, 4, 8; n_max 16 with p_min 0.8; relaxed top-N
for N in 1, 2, 5, 20 at n_max 2 and 4; adaptive; n-gram (fixed and adaptive); and llama.cpp's
exact-match rule at n_max 4 (to compare its acceptance with the rejection sampler's). Prompts: code,
prose and a repetitive code edit; temperature 0 and 0.6 (min_p 0.01); 128 tokens.

Each repetition runs every (prompt, temperature, configuration) once, in the same order, so a slow
patch of the machine hits all configurations alike; the first ``--warmup`` repetitions are dropped
and the table shows medians. Ratios are to plain decoding of the same prompt and temperature in the
same run; with ``--paired``, plain decoding also runs right before every other configuration and
"× plain (paired)" is the median of those adjacent ratios (a shared host's memory bandwidth drifts
within minutes, and a ratio of medians taken minutes apart carries that drift). The breakdown
(milliseconds per generated token) says where time went: drafting (the drafter's proposals and its
catch-up), verification (target forwards), acceptance (sampling pipeline + rule) and the rest
(bookkeeping, detokenization, stop strings); together with the measured cost of a target forward at
widths 1-16 it explains a configuration that misses its target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

from benchmarks.output import host_line
from engine.contract.options import DEFAULT_DRAFT_VOCAB, Options
from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
from engine.runtime import ModelRuntime
from engine.text.tokenizer import Tokenizer
from server.cli.bench.prompt_sets import PROMPTS, TEMPERATURES, TEXT_KINDS

# PROMPTS and TEMPERATURES are shared with `tandem bench` (server/cli/bench/).


@dataclass(frozen=True)
class Config:
    name: str
    options: dict
    needs_draft: bool = True
    temps: tuple[str, ...] = ()  # empty: every temperature

    @property
    def drafter(self) -> str:
        return self.options.get("drafter", "auto")


def _fixed(n: int, **kw) -> dict:
    return {"drafter": "model", "draft_num_predict": n, "draft_schedule": "fixed", "draft_copy": False, **kw}


def _mtp(n: int, **kw) -> dict:
    return {"drafter": "mtp", "draft_num_predict": n, "draft_schedule": "fixed", "draft_copy": False, **kw}


CONFIGS: list[Config] = [
    Config("plain", dict(drafter="none"), needs_draft=False),
    # what a client that sends no speculation options gets (the DRAFT model, engine.contract.options' defaults;
    # without a DRAFT the suffix drafter)
    Config("default", {}, needs_draft=False),
    # the defaults before suffix drafting (without a DRAFT: plain decoding)
    Config("default-no-suffix", dict(draft_suffix=False)),
    Config("default-no-copy", dict(draft_copy=False)),
    *[Config(f"strict-n{n}", _fixed(n)) for n in (1, 2, 3, 4, 8)],
    Config("strict-n16-pmin0.8", _fixed(16, draft_p_min=0.8)),
    *[Config(f"relaxed{N}-n{n}", _fixed(n, relaxed_top_n=N)) for n in (2, 4) for N in (1, 2, 5, 20)],
    Config("adaptive", dict(drafter="model", draft_num_predict=8, draft_schedule="adaptive", draft_copy=False)),
    # the copy drafts the rounds that copy the context (draft_copy), the model the rest
    Config("strict-n4-copy", _fixed(4, draft_copy=True)),
    Config("adaptive-copy", dict(drafter="model", draft_num_predict=8, draft_schedule="adaptive", draft_copy=True)),
    *[Config(f"ngram-n{n}", dict(drafter="ngram", draft_num_predict=n, draft_schedule="fixed"), needs_draft=False)
      for n in (2, 3, 4, 8)],
    Config("ngram-adaptive", dict(drafter="ngram", draft_num_predict=8, draft_schedule="adaptive"),
           needs_draft=False),
    Config("match-n4", _fixed(4, draft_acceptance="match"), temps=("0.6",)),
    # an MTP head (a DRAFT that is one, e.g. what `tandem train-drafter` fits): strict, relaxed, adaptive
    # what the model `tandem train-drafter` creates drafts with when a request sets nothing
    Config("mtp-default", dict(drafter="mtp")),
    *[Config(f"mtp-n{n}", _mtp(n)) for n in (1, 2, 3, 4)],
    # at temperature 0 the relaxed rule is the strict one (greedy keeps one candidate): sampled temperatures only
    *[Config(f"mtp-relaxed{N}-n{n}", _mtp(n, relaxed_top_n=N), temps=("0.6",)) for n in (2, 3, 4) for N in (2, 5, 20)],
    Config("mtp-adaptive", dict(drafter="mtp", draft_num_predict=8, draft_schedule="adaptive", draft_copy=False)),
]


@dataclass
class Sample:
    tok_s: float
    eval_count: int
    draft_n: int
    draft_n_accepted: int
    forwards: int
    depth_sum: int
    ms_per_token: dict[str, float]
    evaluated: int = 0
    strict_accept_sum: float = 0.0
    match_accept_sum: float = 0.0
    adjacent_ratio: float | None = None  # tok/s over the plain run just before it (--paired)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)


@dataclass
class Cell:
    prompt: str
    temp: str
    config: str
    samples: list[Sample] = field(default_factory=list)

    def median(self, f) -> float:
        return statistics.median(f(s) for s in self.samples) if self.samples else float("nan")

    def summary(self) -> dict[str, Any]:
        drafted = sum(s.draft_n for s in self.samples)
        accepted = sum(s.draft_n_accepted for s in self.samples)
        tokens = sum(s.eval_count for s in self.samples)
        forwards = sum(s.forwards for s in self.samples)
        parts = ("drafting", "verify", "accept", "other")
        evaluated = sum(s.evaluated for s in self.samples)
        paired = {"evaluated": evaluated,
                  "strict": round(sum(s.strict_accept_sum for s in self.samples) / evaluated, 4),
                  "match": round(sum(s.match_accept_sum for s in self.samples) / evaluated, 4)} if evaluated else None
        by_position = []
        for i in range(max((len(s.drafted_per_position) for s in self.samples), default=0)):
            d = sum(s.drafted_per_position[i] for s in self.samples if i < len(s.drafted_per_position))
            a = sum(s.accepted_per_position[i] for s in self.samples if i < len(s.accepted_per_position))
            by_position.append(round(a / d, 3) if d else None)
        return {
            "prompt": self.prompt, "temperature": self.temp, "config": self.config, "runs": len(self.samples),
            "acceptance_by_position": by_position,
            # what drafting costs per drafted token (proposals and catch-up), against a target step's cost
            "draft_ms_per_drafted": round(self.median(lambda s: s.ms_per_token.get("drafting", 0.0) * s.eval_count
                                                      / s.draft_n if s.draft_n else float("nan")), 3),
            "tok_s": round(self.median(lambda s: s.tok_s), 3),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_accepted_length": round(tokens / forwards, 3) if forwards else None,
            "mean_depth": round(sum(s.depth_sum for s in self.samples) / forwards, 3) if forwards else None,
            "ms_per_token": {p: round(self.median(lambda s, p=p: s.ms_per_token[p]), 3) for p in parts},
            "all_tok_s": [round(s.tok_s, 3) for s in self.samples],
            "paired_ratio": round(statistics.median(pr), 3) if (pr := [s.adjacent_ratio for s in self.samples
                                                                        if s.adjacent_ratio is not None]) else None,
            "paired_acceptance": paired,
        }


def render_prompt(tokenizer: Tokenizer, text: str, raw: bool) -> str:
    """ChatML when the vocabulary has it (Qwen, SmolLM2), else the bare text."""
    if raw or tokenizer.token_id("<|im_start|>") is None:
        return text
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def run_once(engine: ModelRuntime, prompt: str, options: dict, keep_outputs: bool = False) -> Sample:
    if not keep_outputs:
        engine.outputs.clear()
    result = None
    for item in engine.generate(GenerateRequest(prompt=prompt, options=Options.from_map(options))):
        if isinstance(item, GenerateResult):
            result = item
    assert result is not None
    b = engine.last_breakdown
    n = max(result.eval_count, 1)
    secs = result.eval_duration_ns / 1e9
    other = max(0.0, secs - b.drafting - b.verify - b.accept) if b else 0.0
    ms = {"drafting": b.drafting, "verify": b.verify, "accept": b.accept, "other": other} if b else {}
    st = result.speculation
    return Sample(tok_s=result.eval_count / secs if secs > 0 else 0.0, eval_count=result.eval_count,
                  draft_n=st.draft_n, draft_n_accepted=st.draft_n_accepted, forwards=st.target_forwards,
                  depth_sum=st.depth_sum, ms_per_token={k: v * 1e3 / n for k, v in ms.items()},
                  evaluated=st.evaluated, strict_accept_sum=st.strict_accept_sum,
                  match_accept_sum=st.match_accept_sum, accepted_per_position=list(st.accepted_per_position),
                  drafted_per_position=list(st.drafted_per_position))


@torch.no_grad()
def width_costs(model, prompt_ids: list[int], widths=(1, 2, 4, 8, 16), reps: int = 5) -> dict[int, float]:
    """Median ms of one forward over ``w`` new tokens after the prompt (what verification costs)."""
    cache = model.new_cache(len(prompt_ids) + max(widths) + 1)
    model.forward(prompt_ids, cache, logits_for="none")
    base = cache.length
    out = {}
    for w in widths:
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            model.forward(prompt_ids[:1] * w, cache, logits_for="all")
            times.append(time.perf_counter() - t0)
            cache.truncate(base)
        out[w] = round(statistics.median(times[1:]) * 1e3, 3)
    return out


def explain(row: dict, plain: dict | None) -> str:
    """Which cost dominates the gap to plain decoding, per generated token."""
    if plain is None or row["config"] == "plain" or not row.get("ms_per_token"):
        return ""
    r, p = row["ms_per_token"], plain["ms_per_token"]
    extra = {
        "drafting": r["drafting"] - p["drafting"],
        "verification": r["verify"] - p["verify"],
        "overhead": (r["accept"] + r["other"]) - (p["accept"] + p["other"]),
    }
    worst = max(extra, key=extra.get)
    if extra[worst] <= 0:
        return "faster in every part"
    return f"{worst} +{extra[worst]:.1f} ms/tok"


def markdown(rows: list[dict], widths: dict, draft_widths: dict | None) -> str:
    paired = any(r.get("paired_ratio") is not None for r in rows)
    out = ["| prompt | temp | config | tok/s | × plain | " + ("× plain (paired) | " if paired else "") +
           "accept | by position | mean acc. len | depth | ms/draft | draft ms/tok | verify ms/tok | overhead ms/tok | "
           "dominant extra cost |",
           "|---|---|---|---:|---:|" + ("---:|" if paired else "") + "---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r["ms_per_token"]
        acc = "–" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        pr = r.get("paired_ratio")
        pcell = ("– | " if pr is None else f"{pr:.2f} | ") if paired else ""
        out.append(
            f"| {r['prompt']} | {r['temperature']} | {r['config']} | {r['tok_s']:.2f} | "
            f"{r.get('ratio', float('nan')):.2f} | {pcell}{acc} | "
            f"{'/'.join('–' if a is None else f'{a:.2f}' for a in r.get('acceptance_by_position') or []) or '–'} | "
            f"{r['mean_accepted_length']:.2f} | "
            f"{r['mean_depth']:.2f} | {r.get('draft_ms_per_drafted', float('nan')):.2f} | "
            f"{m['drafting']:.2f} | {m['verify']:.2f} | "
            f"{m['accept'] + m['other']:.2f} | {r.get('explain', '')} |")
    out.append("")
    out.append("Target forward cost by width (ms): " + ", ".join(f"{w}: {v}" for w, v in widths.items()))
    if draft_widths:
        out.append("\nDraft model forward cost by width (ms): " +
                   ", ".join(f"{w}: {v}" for w, v in draft_widths.items()))
    return "\n".join(out)


def match_vs_strict(rows: list[dict]) -> list[dict]:
    """Acceptance of llama.cpp's exact-match rule vs strict rejection sampling at the same depth.

    Two measurements: the realised rates of the match-n4 and strict-n4 runs (different texts, so
    noisy on a short output), and the paired one: on the drafts the strict-n4 runs evaluated, the
    mean probability that each rule accepts (strict ``min(1, p/q)``, match ``p``), which compares the
    rules on identical drafts."""
    by = {(r["prompt"], r["temperature"], r["config"]): r for r in rows}
    out = []
    for (prompt, temp, cfg), r in by.items():
        strict = by.get((prompt, temp, "strict-n4"))
        if cfg == "match-n4" and strict is not None:
            paired = strict.get("paired_acceptance") or {}
            out.append({"prompt": prompt, "temperature": temp, "match": r["acceptance_rate"],
                        "strict": strict["acceptance_rate"], "paired_match": paired.get("match"),
                        "paired_strict": paired.get("strict"), "paired_positions": paired.get("evaluated")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--head", help="an MTP head GGUF for the same target: the mtp-* configurations run on it")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompts", default=",".join(PROMPTS),
                    help="names from the speed set (code, prose, repetitive) or the text kinds set "
                         f"({','.join(TEXT_KINDS)}); 'kinds' = all of the latter")
    ap.add_argument("--temps", default=",".join(TEMPERATURES))
    ap.add_argument("--configs", default="", help="comma-separated config names (default: all)")
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--weight-format", default="auto")
    ap.add_argument("--draft-weight-format", default="auto")
    ap.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB,
                    help="keep only this many tokens in the draft model's head (0 = all; default: the engine's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--raw", action="store_true", help="do not wrap prompts in ChatML")
    ap.add_argument("--paired", action="store_true",
                    help="run plain decoding again right before every other configuration and report the "
                         "median of those adjacent ratios too (a shared machine's speed drifts within minutes)")
    ap.add_argument("--keep-outputs", action="store_true",
                    help="let each run draft from the earlier runs' outputs (suffix drafting); by default the store "
                         "is emptied before every run, so that a prompt's repetitions measure new text, not a retry")
    ap.add_argument("--json", help="write the results as JSON to this path ('-' = stdout)")
    ap.add_argument("--markdown", help="also write the markdown table to this path")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    engine = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.draft, num_ctx=args.num_ctx,
                                  device=args.device, weight_format=args.weight_format,
                                  draft_weight_format=args.draft_weight_format, draft_vocab=args.draft_vocab))
    load_s = time.perf_counter() - t0
    head_engine = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.head, num_ctx=args.num_ctx,
                                             device=args.device, weight_format=args.weight_format,
                                             draft_weight_format=args.draft_weight_format)) if args.head else None

    def engine_for(cfg: Config) -> ModelRuntime:
        return head_engine if head_engine is not None and cfg.drafter == "mtp" else engine

    known = {**PROMPTS, **TEXT_KINDS}
    names = list(TEXT_KINDS) if args.prompts == "kinds" else [k for k in args.prompts.split(",") if k]
    unknown = [k for k in names if k not in known]
    if unknown:
        ap.error(f"unknown prompt(s) {', '.join(unknown)}; known: {', '.join(known)}")
    prompts = {k: render_prompt(engine.tokenizer, known[k], args.raw) for k in names}
    temps = [t for t in args.temps.split(",") if t]
    wanted = set(c for c in args.configs.split(",") if c)
    # a config for a drafter the loaded pair lacks (the mtp ones beside a draft model, the model ones beside a head)
    # runs only when named
    configs = [c for c in CONFIGS if (not wanted or c.name in wanted or c.name == "plain")
               and (args.draft or args.head or not c.needs_draft)
               and (c.name in wanted or c.drafter not in ("model", "mtp") or c.drafter in engine_for(c).drafters)]

    plain = next(c for c in CONFIGS if c.name == "plain")
    cells: dict[tuple[str, str, str], Cell] = {}
    for rep in range(args.warmup + args.runs):
        for pname, prompt in prompts.items():
            for temp in temps:
                for cfg in configs:
                    if cfg.temps and temp not in cfg.temps:
                        continue
                    # num_ctx: the whole cache, as before options had a 4096 default.
                    base = dict(TEMPERATURES[temp], num_predict=args.tokens, seed=1000 + rep,
                                num_ctx=engine.cache.capacity)
                    before = run_once(engine, prompt, dict(base, **plain.options), args.keep_outputs) \
                        if args.paired and cfg.name != "plain" else None
                    sample = run_once(engine_for(cfg), prompt, dict(base, **cfg.options), args.keep_outputs)
                    if before is not None and before.tok_s > 0:
                        sample.adjacent_ratio = sample.tok_s / before.tok_s
                    if rep >= args.warmup:
                        for name, s in (("plain", before), (cfg.name, sample)):
                            if s is not None:
                                cells.setdefault((pname, temp, name), Cell(pname, temp, name)).samples.append(s)
                print(f"rep {rep + 1}/{args.warmup + args.runs} {pname} done", file=sys.stderr, flush=True)

    rows = [c.summary() for c in cells.values()]
    plain_rows = {(r["prompt"], r["temperature"]): r for r in rows if r["config"] == "plain"}
    for r in rows:
        p = plain_rows.get((r["prompt"], r["temperature"]))
        r["ratio"] = round(r["tok_s"] / p["tok_s"], 3) if p and p["tok_s"] else float("nan")
        r["explain"] = explain(r, p)
    ids = engine.tokenize(next(iter(prompts.values())))
    widths = width_costs(engine.target, ids)
    draft_widths = width_costs(engine.drafters["model"].model, ids, (1, 2, 4)) if "model" in engine.drafters else None
    report = {
        "model": args.model, "draft": args.draft, "head": args.head, "tokens": args.tokens, "runs": args.runs,
        "warmup": args.warmup, "device": engine.facts.device, "weight_format": engine.facts.weight_format,
        "draft_weight_format": engine.facts.draft_weight_format, "draft_vocab": args.draft_vocab, "threads": torch.get_num_threads(),
        "load_seconds": round(load_s, 2), "target_width_ms": widths, "draft_width_ms": draft_widths,
        "adaptive_state": {k: c.snapshot() for k, c in engine.controllers.items()},
        "head_adaptive_state": {k: c.snapshot() for k, c in head_engine.controllers.items()} if head_engine else None,
        "match_vs_strict": match_vs_strict(rows), "results": rows,
    }
    table = markdown(rows, widths, draft_widths)
    mvs = report["match_vs_strict"]
    if mvs:
        table += "\n\nAcceptance, exact-match (llama.cpp) vs strict rejection sampling, n_max 4 (realised: " \
            "each rule's own runs; paired: both rules' acceptance probability on the strict runs' drafts, " \
            "per evaluated position):\n\n" + \
            "| prompt | temp | match | strict | paired match | paired strict | positions |\n" \
            "|---|---|---:|---:|---:|---:|---:|\n" + \
            "\n".join(f"| {m['prompt']} | {m['temperature']} | {m['match']} | {m['strict']} | "
                      f"{m['paired_match']} | {m['paired_strict']} | {m['paired_positions']} |" for m in mvs)
    # The host and the command head the written table: a ratio means little without them.
    header = (f"# Speculation, one interleaved run\n\n{host_line(torch.get_num_threads())}\n\n"
              f"`python -m benchmarks.speculation {' '.join(argv if argv is not None else sys.argv[1:])}`, "
              f"started {started}\n\n")
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(header + table + "\n")
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
