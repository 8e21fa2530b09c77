"""Acceptance of a model drafting for itself, per kind of text: what a speculation default costs.

    python -m benchmarks.self_draft --model model.gguf [--tokens 64] [--draft-vocab 16384,0]
        [--configs defaults,fixed-n4,fixed-n4-no-copy] [--markdown out.md]

The draft is a byte-different copy of the target (the same weights behind another file), so it proposes
exactly the target's greedy tokens: at temperature 0 every draft should be accepted, and each one that is
not was lost to a default (a pruned head that cannot propose the token, a context copy that drafts what
the model would not write). Prompts: the text kinds set (``server.cli.bench.prompt_sets.TEXT_KINDS``) in the
model's chat template, and two raw continuations (prose, a counting list). Acceptance is counted, not
timed, so one run is the measurement.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.output import emit, host_line
from benchmarks.speculation import render_prompt, run_once
from engine.contract.protocol import LoadSpec
from engine.runtime import ModelRuntime
from server.cli.bench.prompt_sets import TEXT_KINDS

RAW_PROMPTS = {
    "raw-prose": "The three most important ideas in thermodynamics are",
    "raw-count": "List the numbers from 1 to 40 separated by commas: 1, 2, 3,",
}

CONFIGS = {
    "defaults": {},
    "fixed-n4": {"draft_num_predict": 4, "draft_schedule": "fixed"},
    "fixed-n4-no-copy": {"draft_num_predict": 4, "draft_schedule": "fixed", "draft_copy": False},
}


def byte_different_copy(model: Path, folder: Path) -> Path:
    """The same GGUF with one padding byte appended (tensor data is read at its offsets, so trailing bytes
    change nothing the engine reads): a draft with the target's weights behind another file."""
    copy = folder / f"self-{model.name}"
    shutil.copyfile(model, copy)
    with copy.open("ab") as fh:
        fh.write(b"\0")
    return copy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.self_draft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft-vocab", default="16384", help="comma-separated draft_vocab values, one engine each")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    lines = ["# A model drafting for itself: drafts accepted per kind of text", "",
             host_line(torch.get_num_threads()), "",
             f"`python -m benchmarks.self_draft --model {Path(args.model).name} --tokens {args.tokens} "
             f"--draft-vocab {args.draft_vocab} --configs {args.configs}`", "",
             "| draft_vocab | config | " + " | ".join(list(TEXT_KINDS) + list(RAW_PROMPTS)) + " | all |",
             "|---|---|" + "---:|" * (len(TEXT_KINDS) + len(RAW_PROMPTS) + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        draft = byte_different_copy(Path(args.model), Path(tmp))
        for vocab in (int(v) for v in args.draft_vocab.split(",")):
            engine = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=str(draft), num_ctx=2048,
                                                draft_vocab=vocab))
            prompts = {k: render_prompt(engine.tokenizer, t, False) for k, t in TEXT_KINDS.items()} | RAW_PROMPTS
            for name in configs:
                cells, drafted, accepted = [], 0, 0
                for text in prompts.values():
                    s = run_once(engine, text, dict(CONFIGS[name], temperature=0, num_predict=args.tokens))
                    cells.append(f"{s.draft_n_accepted}/{s.draft_n}")
                    drafted += s.draft_n
                    accepted += s.draft_n_accepted
                rate = f"{accepted / drafted:.3f}" if drafted else "-"
                lines.append(f"| {vocab or 'full'} | {name} | " + " | ".join(cells) + f" | {rate} |")
            engine.close()
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
