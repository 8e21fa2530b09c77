"""``python -m engine.training TARGET.gguf --out HEAD.gguf``: fit a NextN head to a target and write it as a head-only
GGUF. ``tandem train-drafter`` runs this (the command line itself never imports torch) and then creates the model.

Progress goes to stdout a line at a time; Ctrl-C or SIGTERM stops at the end of the step, with the checkpoint
saved, and the same command resumes it. Exit status: 0 done, 2 refused before any work (the reason on stderr),
130 stopped (resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from engine.contract.gguf import GGUFFile
from engine.models.loader import load_model
from engine.text.tokenizer import Tokenizer
from engine.training.data import NoTrainingText, default_sources, files_under, gather_tokens
from engine.training.fit import FitConfig, FitProgress, TooLittleData, fit_head
from engine.training.head_gguf import write_head_gguf
from engine.training.nextn_head import UntrainableTarget, check_trainable
from engine.training.self_text import self_written_tokens


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _report(p: FitProgress) -> None:
    line = (f"step {p.step}/{p.steps}  tokens {p.tokens_seen}  loss {p.loss:.3f}  elapsed {_clock(p.elapsed_s)}  "
            f"eta {_clock(p.eta_s)}")
    if p.validation_acceptance is not None:
        line += f"  validation acceptance {p.validation_acceptance:.3f}"
    print(line, flush=True)


def _interleave(a: list[int], b: list[int], window: int) -> list[int]:
    """Windows of ``a`` and ``b`` alternating (the longer one's rest at the end)."""
    out: list[int] = []
    for i in range(0, max(len(a), len(b)), window):
        out.extend(a[i:i + window])
        out.extend(b[i:i + window])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.training")
    ap.add_argument("target", help="the target model's GGUF")
    ap.add_argument("--out", required=True, help="where the head-only GGUF goes")
    ap.add_argument("--checkpoint", help="resumable state (default: OUT.ckpt)")
    ap.add_argument("--tokens", type=int, default=100_000, help="training tokens (default 100000)")
    ap.add_argument("--window", type=int, default=FitConfig.window,
                    help=f"tokens per training sequence (default {FitConfig.window})")
    ap.add_argument("--lr", type=float, default=0.0, help="peak learning rate (default: by the model's width)")
    ap.add_argument("--data", nargs="*", default=[], help="text files or folders (default: the standard library's "
                                                          "sources and the installed packages' descriptions)")
    ap.add_argument("--prompts", help="a JSON list of rendered chat prompts the target answers; its answers become "
                                      "--self-share of the training text")
    ap.add_argument("--self-share", type=float, default=0.5, help="share of the tokens the target writes itself, "
                                                                  "with --prompts (default 0.5)")
    ap.add_argument("--max-new", type=int, default=192, help="tokens per self-written answer (default 192)")
    ap.add_argument("--name", default="mtp-head", help="general.name of the head")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: every core)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads or (os.cpu_count() or 1))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with GGUFFile(args.target) as f:
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
        target = load_model(args.target, fmt="auto")
        check_trainable(target.config)
        cfg = FitConfig(tokens=args.tokens, window=args.window, lr=args.lr,
                        validation_tokens=max(args.window, min(8192, args.tokens // 10)))
        files = files_under(args.data) if args.data else default_sources()
        prompts = json.loads(Path(args.prompts).read_text(encoding="utf-8")) if args.prompts else []
        total = cfg.tokens + cfg.validation_tokens
        own = int(total * min(max(args.self_share, 0.0), 1.0)) if prompts else 0
        read = gather_tokens(files, lambda text: tokenizer.encode(text, add_bos=False, parse_special=False),
                             total - own) if own < total else []
    except (UntrainableTarget, NoTrainingText, OSError, ValueError) as e:
        print(f"train-drafter: {e}", file=sys.stderr)
        return 2
    source = ", ".join(args.data) if args.data else "standard library sources and package descriptions"
    written: list[int] = []
    if own:
        print(f"the target writes {own} tokens of answers to {len(prompts)} requests", flush=True)
        t0 = time.monotonic()

        def wrote(done: int, budget: int) -> None:
            elapsed = time.monotonic() - t0
            print(f"written {done}/{budget} tokens  elapsed {_clock(elapsed)}  "
                  f"eta {_clock(elapsed / max(done, 1) * (budget - done))}", flush=True)

        stop_ids = frozenset(tokenizer.eot_ids | ({tokenizer.eos_id} if tokenizer.eos_id is not None else set()))
        written = self_written_tokens(target, [tokenizer.encode(p, parse_special=True) for p in prompts], own,
                                      args.max_new, stop_ids, wrote)
        source += f" and {len(written)} tokens of the target's own answers"
    # interleaved in windows, so that training and the held-out fifth both see read and written text
    tokens = _interleave(read, written, cfg.window)
    print(f"training an MTP head for {Path(args.target).name} on {len(tokens)} tokens of {source}; "
          f"{cfg.steps} steps of {cfg.window} tokens", flush=True)
    checkpoint = Path(args.checkpoint) if args.checkpoint else Path(args.out + ".ckpt")
    started = time.monotonic()
    try:
        result = fit_head(target, tokens, cfg, checkpoint=checkpoint, progress=_report, should_stop=stop.is_set)
    except TooLittleData as e:
        print(f"train-drafter: {e}", file=sys.stderr)
        return 2
    if result.stopped:
        print(f"stopped at step {result.steps} of {cfg.steps}; the checkpoint {checkpoint} resumes it", flush=True)
        return 130
    provenance = {"data": source, "tokens": result.tokens_seen, "steps": result.steps, "window": cfg.window,
                  "validation_acceptance": round(result.validation_acceptance, 4),
                  "curve": "; ".join(f"{t}:{a:.3f}" for t, a in result.curve),
                  "target": Path(args.target).name}
    write_head_gguf(args.out, args.target, result.head.tensors(target.config.n_layer), provenance, args.name)
    checkpoint.unlink(missing_ok=True)
    print(f"done in {_clock(time.monotonic() - started)}: validation acceptance {result.validation_acceptance:.3f} "
          f"(the target's greedy token at the first draft position), head written to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
