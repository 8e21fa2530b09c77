"""``tandem train-drafter MODEL --as NAME``: fit an MTP head to a stored model on this machine and store the pair.

The training runs in a child process (``python -m engine.training``, by module name: the command line never imports
torch), reading the model's GGUF from the local store; its progress lines come straight through. Then NAME is
created as ``FROM MODEL`` with the head as its ``DRAFT`` layer, through the server when one answers (as ``tandem
create`` does), so the new model keeps the target's template and parameters and drafts with ``drafter mtp``.

Ctrl-C stops the training at the end of a step with its checkpoint saved; the same command resumes it. The head and
its checkpoint live under ``TANDEM_TRAIN_DIR`` (default ``~/.cache/tandem/train-drafter``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from blobs import BlobStore
from blobs.model import load_stored_model

from .drafter_prompts import drafter_prompts

TRAINER_MODULE = "engine.training"
STOPPED = 130  # the trainer's exit status for a run stopped with its checkpoint saved


class TrainDrafterError(Exception):
    """A refusal or failure, with the text for the user."""


def train_dir() -> Path:
    return Path(os.environ.get("TANDEM_TRAIN_DIR") or Path.home() / ".cache" / "tandem" / "train-drafter")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the stored model to train a head for (its target)")
    p.add_argument("--as", dest="as_name", required=True, help="the name of the new model (target + trained head)")
    p.add_argument("--tokens", type=int, default=100_000, help="training tokens (default 100000)")
    p.add_argument("--data", nargs="+", help="text files or folders to train on (default: this machine's Python "
                                              "standard library sources and installed packages' descriptions)")
    p.add_argument("--window", type=int, default=32, help="tokens per training sequence (default 32)")
    p.add_argument("--self-share", type=float, default=0.5,
                   help="share of the training tokens the target writes itself, answering requests of every kind "
                        "(default 0.5; 0: only the --data text)")


def train(args: argparse.Namespace, store: BlobStore) -> Path:
    """Run the trainer for ``args.model``; the head-only GGUF it wrote."""
    try:
        stored = load_stored_model(store, args.model)
    except (OSError, ValueError) as e:
        raise TrainDrafterError(f"model '{args.model}' not found ({e})") from None
    if stored.model_path is None:
        raise TrainDrafterError(f"model '{args.model}' has no GGUF model layer to train a head for")
    if args.tokens <= 0:
        raise TrainDrafterError("--tokens must be positive")
    work = train_dir()
    work.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", args.as_name)
    head = work / f"{stem}.mtp.gguf"
    command = [sys.executable, "-m", TRAINER_MODULE, str(stored.model_path), "--out", str(head),
               "--tokens", str(args.tokens), "--window", str(args.window), "--name", f"{args.as_name} MTP head"]
    if args.data:
        command += ["--data", *[str(Path(d).resolve()) for d in args.data]]
    if args.self_share > 0:
        prompts = work / f"{stem}.prompts.json"
        prompts.write_text(json.dumps(rendered_prompts(stored, args.tokens)), encoding="utf-8")
        command += ["--prompts", str(prompts), "--self-share", str(args.self_share)]
    # Ctrl-C reaches the trainer too (same process group); it stops at a step's end and saves its checkpoint, so
    # this process waits for it instead of dying first.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = subprocess.call(command)
    finally:
        signal.signal(signal.SIGINT, previous)
    if status == STOPPED:
        raise TrainDrafterError("training stopped; its checkpoint is kept: run the same command again to resume")
    if status != 0:
        raise TrainDrafterError(f"training failed (exit status {status})")
    return head


def rendered_prompts(stored, n_tokens: int) -> list[str]:
    """The training requests, each rendered with the model's own chat template (enough for ``n_tokens`` of answers
    at a few dozen tokens each)."""
    from ..prompting import ModelPrompting
    from ..text.render import Message

    prompting = ModelPrompting(stored)
    return [prompting.chat_prompt([Message(role="user", content=text)])
            for text in drafter_prompts(max(16, n_tokens // 40))]


def modelfile_for(target: str, head: Path) -> str:
    """The Modelfile of the new model: the target, with the head as its DRAFT layer."""
    return f"FROM {target}\nDRAFT {head}\nPARAMETER drafter mtp\n"
