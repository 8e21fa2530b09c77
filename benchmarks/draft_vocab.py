"""A draft model's pruned head (``draft_vocab``) against its full head, in one interleaved run.

    python -m benchmarks.draft_vocab --model target.gguf --draft draft.gguf [--vocab 0,32768,16384]
        [--configs plain,strict-n4,adaptive] [--prompts code,prose,repetitive] [--tokens 96] [--rounds 3]
        [--json out.json] [--markdown out.md]

One engine per head size, all loaded in this process; each round runs every (prompt, configuration) on
every engine in turn, so the host's drift hits them alike. Reported per cell: tok/s (median over rounds)
and its ratio to the same engine's plain decoding in the same rounds, the drafts' acceptance, and the
draft model's forward cost at width 1 (median ms), which is what the pruned head cuts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.output import emit, host_line
from benchmarks.speculation import CONFIGS, render_prompt, run_once
from engine.contract.protocol import LoadSpec
from engine.runtime import ModelRuntime
from engine.speculative.draft_model import DraftModelDrafter
from server.cli.bench.prompt_sets import PROMPTS


@torch.no_grad()
def draft_forward_ms(engine: ModelRuntime, reps: int = 15) -> float:
    drafter = engine.drafters["model"]
    assert isinstance(drafter, DraftModelDrafter)
    model = drafter.model
    cache = model.new_cache(256)
    model.forward(list(range(100, 228)), cache, logits_for="none")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward([1000], cache, logits_for="all")
        times.append(time.perf_counter() - t0)
        cache.truncate(128)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--vocab", default="0,32768", help="comma-separated head sizes (0 = the full head)")
    ap.add_argument("--configs", default="plain,strict-n4,adaptive")
    ap.add_argument("--prompts", default="code,prose,repetitive")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    sizes = [int(v) for v in args.vocab.split(",")]
    configs = {c.name: c for c in CONFIGS if c.name in args.configs.split(",")}
    engines = {v: ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.draft, num_ctx=2048,
                                             device="cpu", draft_vocab=v)) for v in sizes}
    prompts = {k: render_prompt(engines[sizes[0]].tokenizer, PROMPTS[k], False) for k in args.prompts.split(",")}
    cells: dict[tuple, list] = {}
    fwd: dict[int, list[float]] = {v: [] for v in sizes}
    for r in range(args.rounds + 1):  # round 0 warms up
        order = sizes if r % 2 == 0 else sizes[::-1]
        for v in order:
            fwd[v].append(draft_forward_ms(engines[v]))
        for p, text in prompts.items():
            for name, cfg in configs.items():
                for v in order:
                    opts = dict(cfg.options, temperature=args.temp, num_predict=args.tokens, seed=0)
                    s = run_once(engines[v], text, opts)
                    if r:
                        cells.setdefault((p, name, v), []).append(s)
    rows = []
    for (p, name, v), samples in cells.items():
        plain = cells.get((p, "plain", v))
        ratios = [s.tok_s / q.tok_s for s, q in zip(samples, plain)] if plain else []
        drafted = sum(s.draft_n for s in samples)
        rows.append({"prompt": p, "config": name, "draft_vocab": v,
                     "tok_s": round(statistics.median(s.tok_s for s in samples), 2),
                     "x_plain": round(statistics.median(ratios), 3) if ratios else None,
                     "acceptance": round(sum(s.draft_n_accepted for s in samples) / drafted, 3) if drafted else None})
    draft_ms = {v: round(statistics.median(t[1:]), 2) for v, t in fwd.items()}
    lines = [f"# Draft head size: {', '.join(str(v or 'full') for v in sizes)}", "",
             host_line(torch.get_num_threads()), "",
             "Draft model forward at width 1 (median ms): "
             + ", ".join(f"{v or 'full'}: {ms}" for v, ms in draft_ms.items()), "",
             "| prompt | config | draft vocab | tok/s | × plain (same engine, same rounds) | acceptance |",
             "|---|---|---:|---:|---:|---:|"]
    for row in sorted(rows, key=lambda x: (x["prompt"], list(configs).index(x["config"]), sizes.index(x["draft_vocab"]))):
        lines.append(f"| {row['prompt']} | {row['config']} | {row['draft_vocab'] or 'full'} | {row['tok_s']} | "
                     f"{row['x_plain'] if row['x_plain'] is not None else '–'} | "
                     f"{row['acceptance'] if row['acceptance'] is not None else '–'} |")
    emit(lines, args.markdown)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "draft_forward_ms": draft_ms, "args": vars(args)}, fh, indent=1)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
