"""The adaptive depth controller against simulated texts and a host's measured costs, many seeds at once.

    python -m benchmarks.depth_sim [--host busy-avx2] [--seeds 80] [--order code,prose,rewrite]
        [--tokens 96] [--markdown out.md]

A real run of ``benchmarks.speculation`` moves by ±10 % between samples on a shared host, more than a rule
of the controller (``engine.speculative.depth.AdaptiveDepth``) changes; this drives the controller itself,
unmodified, through requests whose drafts are accepted at each position with a text's conditional
acceptance, timed by a host profile (verification cost by width, drafting cost by proposal length, a draft
model's catch-up per missed token, all measured by the traced real runs named in ``HOSTS``) with
multiplicative noise, 20 % of steps slowed 1.2-1.4x as a busy host does. Requests follow ``--order``
repeatedly (each text after the last, as the speculation benchmark runs them), and each request's rate is
divided by a plain request's under the same noise. Reported per text: the mean ratio over seeds and the
repetitions after the first, beside the best fixed depth's expected ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from benchmarks.output import emit
from engine.speculative.depth import AdaptiveDepth


@dataclass(frozen=True)
class Host:
    verify_ms: dict[int, float]  # a target step over w tokens
    first_draft_ms: float  # a proposal's first draft token (it carries the last round's two tokens)
    next_draft_ms: float  # each further draft token
    catchup_ms: float  # per token a draft model missed during plain steps
    source: str


HOSTS = {
    # traced 2026-12-03 (code then prose, adaptive, the controller's own estimates): AMD EPYC Zen 3, AVX2,
    # 2 threads, busy hour; 1.5B Q4_K_M target, 0.5B drafter with its head pruned to 32k tokens
    "busy-avx2": Host({1: 43.5, 2: 52.4, 3: 65.0, 4: 78.0, 5: 85.0, 9: 187.0}, 20.0, 16.5, 6.5,
                      "AMD EPYC Zen 3 (AVX2), busy, 2026-12-03"),
    # the same host quiet (docs/bench/engine-bench-qwen15b-epyc-avx2-*.md and docs/measurements.md)
    "quiet-avx2": Host({1: 26.0, 2: 29.0, 3: 37.0, 4: 52.0, 5: 55.0, 9: 110.0}, 10.0, 8.5, 3.3,
                       "AMD EPYC Zen 3 (AVX2), quiet, 2026-12-03"),
}

# P(draft position j accepted | positions < j accepted), as the 0.5B drafter measured on the speculation
# benchmark's prompts (its acceptance by position at temperature 0)
TEXTS = {
    "code": (0.93, 0.93, 0.95, 0.95),
    "prose": (0.60, 0.50, 0.45, 0.40),
    "rewrite": (0.99, 0.99, 0.99, 0.99),
    "useless": (0.0, 0.0, 0.0, 0.0),
}
MAX_DEPTH = 4  # the deepest simulated round (the acceptance profiles end there)


def _verify(host: Host, width: int) -> float:
    if width in host.verify_ms:
        return host.verify_ms[width]
    lo = max(w for w in host.verify_ms if w < width)
    hi = min(w for w in host.verify_ms if w > width)
    return host.verify_ms[lo] + (host.verify_ms[hi] - host.verify_ms[lo]) * (width - lo) / (hi - lo)


def _noisy(ms: float, rng: random.Random) -> float:
    factor = rng.lognormvariate(0.0, 0.06)
    if rng.random() < 0.2:
        factor *= rng.uniform(1.2, 1.4)
    return ms * factor


def request(ctl: AdaptiveDepth, host: Host, acceptance: tuple[float, ...], rng: random.Random,
            tokens: int) -> float:
    """One request of ``tokens`` through the controller, the loop's way: tokens a second."""
    ctl.begin_request()
    elapsed = 0.0
    done = behind = 0
    while done < tokens:
        k = min(ctl.choose(8), MAX_DEPTH)
        if k == 0:
            step = _noisy(_verify(host, 1), rng)
            elapsed, done, behind = elapsed + step, done + 1, behind + 1
            ctl.observe(0, 0, 0, step / 1e3)
            continue
        catchup = host.catchup_ms * behind if behind > 1 else 0.0
        if behind > 1:
            ctl.observe_catchup(behind, catchup / 1e3)
        behind = 0
        drafting = _noisy(host.first_draft_ms + host.next_draft_ms * (k - 1), rng) + catchup
        accepted = 0
        while accepted < k and rng.random() < acceptance[accepted]:
            accepted += 1
        step = _noisy(_verify(host, k + 1), rng) + drafting
        elapsed, done = elapsed + step, done + accepted + 1
        ctl.observe(k, k, accepted, step / 1e3, drafting / 1e3)
    return done / elapsed * 1e3


def plain_rate(host: Host, rng: random.Random, tokens: int) -> float:
    return tokens / sum(_noisy(_verify(host, 1), rng) for _ in range(tokens)) * 1e3


def best_fixed(host: Host, acceptance: tuple[float, ...]) -> tuple[int, float]:
    """The fixed depth with the highest expected rate, and that rate over plain decoding's (no noise)."""
    best = (0, 1.0)
    for k in range(1, MAX_DEPTH + 1):
        expected, run = 1.0, 1.0
        for a in acceptance[:k]:
            run *= a
            expected += run
        ratio = expected / (_verify(host, k + 1) + host.first_draft_ms + host.next_draft_ms * (k - 1)) * \
            _verify(host, 1)
        if ratio > best[1]:
            best = (k, ratio)
    return best


def simulate(host: Host, order: list[str], seeds: int, tokens: int, reps: int = 3) -> dict[str, float]:
    """Mean ratio to plain per text over seeds and the repetitions after the first."""
    ratios: dict[str, list[float]] = {name: [] for name in order}
    for seed in range(seeds):
        rng = random.Random(seed)
        ctl = AdaptiveDepth()
        for rep in range(reps):
            for name in order:
                rate = request(ctl, host, TEXTS[name], rng, tokens)
                if rep >= 1:
                    ratios[name].append(rate / plain_rate(host, rng, tokens))
    return {name: statistics.mean(v) for name, v in ratios.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.depth_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", choices=sorted(HOSTS), default="busy-avx2")
    ap.add_argument("--seeds", type=int, default=80)
    ap.add_argument("--order", default="code,prose,rewrite", help=f"texts, of {', '.join(TEXTS)}")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    order = [t for t in args.order.split(",") if t]
    unknown = [t for t in order if t not in TEXTS]
    if unknown:
        ap.error(f"unknown text(s): {', '.join(unknown)}")
    host = HOSTS[args.host]
    result = simulate(host, order, args.seeds, args.tokens)
    lines = ["# Adaptive depth, simulated", "",
             f"Host profile `{args.host}` ({host.source}); {args.seeds} seeds, {args.tokens}-token requests in the "
             f"order {', '.join(order)}, three times over, the last two measured.", "",
             "| text | adaptive × plain | best fixed depth | its × plain (expected) |", "|---|---:|---:|---:|"]
    for name in order:
        k, ratio = best_fixed(host, TEXTS[name])
        lines.append(f"| {name} | {result[name]:.3f} | {k} | {ratio:.3f} |")
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
