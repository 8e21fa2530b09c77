"""Schema-constrained decoding with and without speculation, in ONE interleaved run.

    python -m benchmarks.constrained [--model target.gguf --draft draft.gguf] [--tokens 256 --runs 3 --warmup 1]
        [--temps 0,0.6] [--configs plain,model,ngram] [--json out.json] [--markdown out.md]

Defaults to Qwen2.5-Coder 1.5B with the 0.5B drafter (the packaged GGUFs `tests/realmodels.qwen_gguf`
assembles). Every request carries the same pydantic schema as ``format`` (nested models, an optional
field, a bounded list, an enum, bounded integers, string lengths: what `with_structured_output` sends);
the configurations differ only in speculation: ``plain`` is ``draft_num_predict: 0`` (constrained
decoding alone), ``model`` the draft model (adaptive depth), ``ngram`` the n-gram drafter. Each
repetition runs every (temperature, configuration) once in the same order, so a slow patch of the
machine hits all alike; the first ``--warmup`` repetitions are dropped and the table shows medians.
Reported: tok/s, its ratio to ``plain`` at the same temperature, acceptance (accepted / drafted, after
the constraint's cut), tokens per target forward, and how many outputs validate against the model (a
run cut by ``--tokens`` cannot).
"""

from __future__ import annotations

import argparse
import enum
import json
import statistics
import sys
import time
from typing import Literal, Optional

import torch
from pydantic import BaseModel, Field, ValidationError

from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
from engine.runtime import ModelRuntime


class Currency(str, enum.Enum):
    eur = "EUR"
    usd = "USD"
    gbp = "GBP"


class Line(BaseModel):
    description: str = Field(min_length=2, max_length=40)
    quantity: int = Field(ge=1, le=1000)
    unit_price: float = Field(ge=0)


class Party(BaseModel):
    name: str = Field(min_length=2, max_length=40)
    city: Optional[str] = None


class Invoice(BaseModel):
    number: str = Field(max_length=20)
    status: Literal["draft", "sent", "paid"]
    currency: Currency
    seller: Party
    buyer: Party
    lines: list[Line] = Field(min_length=1, max_length=5)
    notes: Optional[str] = Field(default=None, max_length=80)


PROMPT = ("Extract the invoice as JSON. Invoice INV-2024-0042, sent, in euros, from Acme Tools GmbH (Berlin) "
          "to Blue Harbor Ltd (Dublin): 12 steel hammers at 9.50 each, 3 ladders at 74.00 each, 40 boxes of "
          "screws at 3.25 each. Payment within 30 days.")

CONFIGS = {
    "plain": dict(draft_num_predict=0),
    "model": dict(drafter="model"),
    "ngram": dict(drafter="ngram", draft_num_predict=8),
}
TEMPERATURES = {"0": dict(temperature=0), "0.6": dict(temperature=0.6, min_p=0.01)}


def default_models() -> tuple[str | None, str | None]:
    from importer.packaged import QWEN_CODER_0_5B, QWEN_CODER_1_5B, assemble

    target, draft = assemble(QWEN_CODER_1_5B), assemble(QWEN_CODER_0_5B)
    return (str(target) if target else None), (str(draft) if draft else None)


def render(engine: ModelRuntime, text: str) -> str:
    if engine.tokenizer.token_id("<|im_start|>") is None:
        return text
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def run_once(engine: ModelRuntime, prompt: str, schema: dict, options: dict) -> dict:
    parts, result = [], None
    req = GenerateRequest(prompt=prompt, options=Options.from_map(options), format=schema)
    for item in engine.generate(req):
        if isinstance(item, GenerateResult):
            result = item
        else:
            parts.append(item.text)
    assert result is not None
    try:
        Invoice.model_validate_json("".join(parts))
        valid = True
    except ValidationError:
        valid = False
    secs = result.eval_duration_ns / 1e9
    st = result.speculation
    return {"tok_s": result.eval_count / secs if secs > 0 else 0.0, "tokens": result.eval_count,
            "forwards": st.target_forwards, "draft_n": st.draft_n, "accepted": st.draft_n_accepted, "valid": valid}


def summarise(samples: list[dict]) -> dict:
    drafted = sum(s["draft_n"] for s in samples)
    forwards = sum(s["forwards"] for s in samples)
    return {
        "tok_s": round(statistics.median(s["tok_s"] for s in samples), 3),
        "all_tok_s": [round(s["tok_s"], 3) for s in samples],
        "acceptance_rate": round(sum(s["accepted"] for s in samples) / drafted, 4) if drafted else None,
        "tokens_per_forward": round(sum(s["tokens"] for s in samples) / forwards, 3) if forwards else None,
        "valid": f"{sum(s['valid'] for s in samples)}/{len(samples)}",
    }


def markdown(rows: list[dict]) -> str:
    out = ["| temp | config | tok/s | vs plain | acceptance | tokens/forward | valid |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        tpf = "-" if r["tokens_per_forward"] is None else f"{r['tokens_per_forward']:.2f}"
        out.append(f"| {r['temperature']} | {r['config']} | {r['tok_s']:.2f} | {r['ratio']:.2f}x | {acc} | {tpf} | "
                   f"{r['valid']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.constrained", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target GGUF (default: the packaged Qwen2.5-Coder 1.5B)")
    ap.add_argument("--draft", help="draft GGUF (default: the packaged Qwen2.5-Coder 0.5B)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--temps", default=",".join(TEMPERATURES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="write the results as JSON to this path")
    ap.add_argument("--markdown", help="also write the markdown table to this path")
    args = ap.parse_args(argv)

    model, draft = args.model, args.draft
    if model is None:
        model, packaged_draft = default_models()
        draft = draft or packaged_draft
        if model is None:
            print("no --model and the packaged Qwen2.5-Coder 1.5B is not installed", file=sys.stderr)
            return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    engine = ModelRuntime.load(LoadSpec(model_path=model, draft_path=draft, num_ctx=args.num_ctx))
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {sorted(CONFIGS)}")
    if "plain" not in configs:
        configs.insert(0, "plain")
    if draft is None and "model" in configs:
        configs.remove("model")
    temps = [t for t in args.temps.split(",") if t]
    schema = Invoice.model_json_schema()
    prompt = render(engine, PROMPT)

    cells: dict[tuple[str, str], list[dict]] = {}
    t0 = time.perf_counter()
    for rep in range(args.warmup + args.runs):
        for temp in temps:
            for cfg in configs:
                opts = dict(TEMPERATURES[temp], num_predict=args.tokens, seed=2000 + rep, **CONFIGS[cfg])
                sample = run_once(engine, prompt, schema, opts)
                if rep >= args.warmup:
                    cells.setdefault((temp, cfg), []).append(sample)
        print(f"rep {rep + 1}/{args.warmup + args.runs} done ({time.perf_counter() - t0:.0f}s)", file=sys.stderr,
              flush=True)

    rows = [{"temperature": t, "config": c, **summarise(s)} for (t, c), s in cells.items()]
    plain = {r["temperature"]: r["tok_s"] for r in rows if r["config"] == "plain"}
    for r in rows:
        p = plain.get(r["temperature"])
        r["ratio"] = round(r["tok_s"] / p, 3) if p else float("nan")
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n")
    if args.json:
        report = {"model": model, "draft": draft, "tokens": args.tokens, "runs": args.runs, "warmup": args.warmup,
                  "threads": torch.get_num_threads(), "device": engine.facts.device, "results": rows}
        with open(args.json, "w") as fh:
            fh.write(json.dumps(report, indent=1) + "\n")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
