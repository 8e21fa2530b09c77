"""Fitting a NextN head to a frozen target by self-distillation, resumable from a checkpoint.

Each step takes one window of the training tokens, runs the target over it once (teacher forcing: a prefill, not a
decode), and trains the head on its pairs: pair j = (h_j, t_{j+1}) must predict the target's own distribution for
t_{j+2}, which the target's logits at position j + 1 are (the labels are the target's, so the head learns what the
target would say, not what the text says). The loss is the cross-entropy of the head's distribution against the
target's, over the full vocabulary, which is what acceptance is judged on.

The window order is a function of the step alone (a seeded permutation per pass over the data), and a checkpoint
holds the weights, the optimizer, the step and the curve, so a run stopped and resumed takes the same steps as one
that ran through. Validation acceptance is the share of held-out pairs whose greedy draft is the target's greedy
token: the first draft position's acceptance at temperature 0.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from engine.models.transformer import Model
from engine.training.nextn_head import TrainableNextN, initial_weights


@dataclass(frozen=True)
class FitConfig:
    tokens: int = 100_000  # training pairs to see in all (passes over the data repeat it as needed)
    # Tokens per training sequence (bounds the memory of a step). Narrower windows are more optimizer steps over the
    # same tokens. SmolLM2-135M, 100k tokens (AMD EPYC Zen 3), first-position acceptance on its own answers
    # (benchmarks.head_acceptance, mean of six kinds) and the whole run's time: 256 0.228 in 8 min 27 s, 128 0.239
    # in 8 min 4 s, 64 0.246 in 8 min 41 s, 32 0.266 in 10 min 53 s. Qwen2.5-Coder-1.5B, 2,560 tokens: validation
    # 0.343 at 32 against 0.196 at 256, for 1.5x the time a token (docs/bench/train-drafter-smollm2-epyc-zen3-dec05.md).
    window: int = 32
    lr: float = 0.0  # 0: by the target's width (width_lr)
    warmup_steps: int = 20
    validation_tokens: int = 1024  # held out from the end of the data
    validate_every: int = 0  # steps between validation points of the curve (0: about every 12,800 tokens)
    checkpoint_every_s: float = 60.0
    seed: int = 0

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.window - 1)))

    @property
    def validation_interval(self) -> int:
        """Steps between validations: a validation reads every held-out token through the head and the output
        projection, so it is spaced by tokens, not steps (a narrower window must not validate more often)."""
        return self.validate_every or max(1, round(12_800 / (self.window - 1)))


@dataclass
class FitProgress:
    step: int
    steps: int
    tokens_seen: int
    loss: float
    elapsed_s: float
    eta_s: float
    validation_acceptance: float | None


@dataclass
class FitResult:
    head: TrainableNextN
    steps: int
    tokens_seen: int
    validation_acceptance: float
    curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens seen, validation acceptance)
    stopped: bool = False  # True: stopped early by the caller; the checkpoint holds where it was


class TooLittleData(ValueError):
    """Not enough tokens for one training window and the held-out validation."""


def split_tokens(tokens: Sequence[int], cfg: FitConfig) -> tuple[list[list[int]], list[list[int]]]:
    """Training windows and validation windows (the last ``validation_tokens``), each ``window`` tokens long."""
    held = min(cfg.validation_tokens, len(tokens) // 5)
    train, valid = list(tokens[:len(tokens) - held]), list(tokens[len(tokens) - held:])

    def windows(ids: list[int]) -> list[list[int]]:
        return [ids[i:i + cfg.window] for i in range(0, len(ids) - cfg.window + 1, cfg.window)]

    train_w = windows(train)
    valid_w = windows(valid) or ([valid] if len(valid) >= 3 else [])
    if not train_w or not valid_w:
        raise TooLittleData(f"{len(tokens)} tokens of data are too few: training needs at least "
                            f"{cfg.window} for one window plus a held-out fifth for validation")
    return train_w, valid_w


@torch.no_grad()
def target_pass(target: Model, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's pre-norm hidden states [T, D] and its logits [T, V] over ``ids`` from position 0."""
    cache = target.new_cache(len(ids))
    out = target.forward(list(ids), cache, logits_for="all", return_hidden=True)
    return out.prenorm_hidden.float(), out.logits.float()


def hidden_scale(target: Model, ids: Sequence[int]) -> float:
    """The RMS of the target's pre-norm hidden states over ``ids`` (what ``initial_weights`` restores)."""
    hidden, _ = target_pass(target, ids)
    return float(hidden.pow(2).mean().sqrt())


def pair_loss(head: TrainableNextN, hidden: torch.Tensor, logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """Cross-entropy of the head's distribution for t_{j+2} against the target's, over the window's pairs."""
    next_tokens = torch.tensor(list(ids[1:]), dtype=torch.long)
    g = head(hidden[:-1], next_tokens)
    log_q = F.log_softmax(head.logits(g), dim=-1)
    p = F.softmax(logits[1:], dim=-1)
    return -(p * log_q).sum(-1).mean()


@dataclass(frozen=True)
class HeldOut:
    """Validation windows with the target's part computed once: its pre-norm states and its greedy tokens."""

    windows: list[tuple[list[int], torch.Tensor, torch.Tensor]]  # (ids, hidden [T, D], target argmax [T])

    @classmethod
    def of(cls, target: Model, windows: Sequence[Sequence[int]]) -> "HeldOut":
        held = []
        for ids in windows:
            hidden, logits = target_pass(target, ids)
            held.append((list(ids), hidden, logits.argmax(-1)))
        return cls(held)


@torch.no_grad()
def acceptance(head: TrainableNextN, held: HeldOut) -> float:
    """Share of the held-out pairs whose greedy draft is the target's greedy next-next token."""
    hits = total = 0
    for ids, hidden, greedy in held.windows:
        g = head(hidden[:-1], torch.tensor(ids[1:], dtype=torch.long))
        hits += int((head.logits(g).argmax(-1) == greedy[1:]).sum())
        total += len(ids) - 1
    return hits / max(total, 1)


def width_lr(n_embd: int) -> float:
    """The peak learning rate for a head of this width: 3e-3 at SmolLM2's 576, falling with the square of the width.
    Measured (AMD EPYC Zen 3): SmolLM2, 20k tokens, validation acceptance 0.156 at 3e-3 against 0.138 at 1e-3;
    Qwen2.5-Coder-1.5B (1,536 wide), 10k tokens, 0.459 at 5e-4, 0.349 at 1.1e-3, 0.02-0.03 at 3e-3 (a copied block
    that wide is undone by steps that large)."""
    return min(3e-3, 3e-3 * (576 / n_embd) ** 2)


def _lr(cfg: FitConfig, peak: float, step: int) -> float:
    """Linear warm-up, then a cosine down to a tenth."""
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _window_at(step: int, n: int, seed: int) -> int:
    """Which training window step ``step`` takes: a seeded permutation per pass over the data."""
    epoch, i = divmod(step, n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return int(order[i])


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def fit_head(target: Model, tokens: Sequence[int], cfg: FitConfig, checkpoint: str | os.PathLike | None = None,
             progress: Callable[[FitProgress], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> FitResult:
    """Train a NextN head for ``target`` on ``tokens``; resume from ``checkpoint`` when it holds a run of the same
    configuration, and write it there as the run goes (and when ``should_stop`` says so)."""
    train_w, valid_w = split_tokens(tokens, cfg)
    held = HeldOut.of(target, valid_w)  # the target's side of validation, once: a validation then costs the head only
    head = TrainableNextN(target, initial_weights(target, torch.Generator().manual_seed(cfg.seed),
                                                  hidden_scale(target, train_w[0])))
    peak = cfg.lr or width_lr(target.config.n_embd)
    opt = torch.optim.AdamW(head.parameters(), lr=peak, weight_decay=0.0)
    step, seen, curve = 0, 0, []
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state.get("config") != asdict(cfg):
            raise ValueError(f"checkpoint {ckpt} is of another run ({state.get('config')}); remove it to start over")
        head.weights.load_state_dict(state["weights"])
        opt.load_state_dict(state["optimizer"])
        step, seen, curve = state["step"], state["tokens_seen"], [tuple(c) for c in state["curve"]]

    def save() -> None:
        if ckpt is not None:
            _save(ckpt, {"config": asdict(cfg), "weights": head.weights.state_dict(), "optimizer": opt.state_dict(),
                         "step": step, "tokens_seen": seen, "curve": curve})

    started, first_step, last_save, loss_value = time.monotonic(), step, time.monotonic(), float("nan")
    stopped = False
    while step < cfg.steps:
        if should_stop is not None and should_stop():
            stopped = True
            break
        ids = train_w[_window_at(step, len(train_w), cfg.seed)]
        hidden, logits = target_pass(target, ids)
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, peak, step)
        loss = pair_loss(head, hidden, logits, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
        step += 1
        seen += len(ids) - 1
        val = None
        if step % cfg.validation_interval == 0 or step == cfg.steps:
            val = acceptance(head, held)
            curve.append((seen, val))
        if time.monotonic() - last_save >= cfg.checkpoint_every_s:
            save()
            last_save = time.monotonic()
        if progress is not None:
            elapsed = time.monotonic() - started
            per_step = elapsed / (step - first_step)
            progress(FitProgress(step, cfg.steps, seen, loss_value, elapsed, per_step * (cfg.steps - step), val))
    save()
    final = curve[-1][1] if curve and curve[-1][0] == seen else acceptance(head, held)
    return FitResult(head, step, seen, final, curve, stopped)
