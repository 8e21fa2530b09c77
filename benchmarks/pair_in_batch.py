"""A DRAFT pair against plain decoding on a runtime that serves several sequences, in process.

    python -m benchmarks.pair_in_batch TARGET.gguf DRAFT.gguf [--slots 8] [--clients 1,2,4,8] [--reps 3] [--warmup 1]
        [--tokens 64] [--requests 1] [--threads 2] [--prompts all|code] [--depths 1,2]

Each rep runs, for each client count C, C concurrent clients, each sending ``--requests`` greedy requests one after
another (benchmarks.serving's prompts, client i starting at the i-th, in its chat template; the pair without suffix
drafting, as there), plain (``drafter none``) and then with the draft model, on one runtime of ``--slots`` slots: the
aggregate generated tokens over the wall time, and the pair's ratio to plain in the same rep. One request a client
is a burst, timed to its last answer (a request that finishes early leaves its slot idle); several keep the load
up, as a busy server's clients do. What it isolates from benchmarks.serving: the step loop (engine.batching), without
the server, the pipe or a second engine process.

``--prompts code`` sends only the code prompts (where the draft model is accepted most: what the pair can gain at
best beside other sequences of its kind), and ``--depths`` adds the pair at fixed depths (``draft_schedule fixed``,
every round drafting that many) beside the adaptive default: what drafting would serve if the controller always
drafted, against what it chose.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.output import emit, host_line
from benchmarks.serving import CHATML, CODE_PROMPTS, PROMPTS, timed_clients


def configurations(depths: list[int]) -> dict[str, dict]:
    """Label -> the requests' speculation options: plain, the pair as a client that sets nothing gets it, and the
    pair at each fixed depth."""
    return {"plain": {"drafter": "none"}, "pair": {"drafter": "model"},
            **{f"pair n={n}": {"drafter": "model", "draft_schedule": "fixed", "draft_num_predict": n} for n in depths}}


def aggregate(runtime, clients: int, options: dict, tokens: int, requests: int = 1,
              prompts: list[str] = PROMPTS) -> tuple[float, int]:
    """(generated tokens a second over the wall time, tokens drafted) for ``clients`` concurrent clients sending
    ``requests`` requests each with speculation ``options``."""
    from engine.contract.options import Options
    from engine.contract.protocol import GenerateRequest, GenerateResult

    results: list = []

    def run(i: int) -> None:
        for k in range(requests):
            req = GenerateRequest(prompt=CHATML.format(prompts[(i + k) % len(prompts)]), options=Options(
                temperature=0.0, num_predict=tokens, draft_suffix=False, **options))
            for item in runtime.generate(req):
                if isinstance(item, GenerateResult):
                    results.append(item)

    wall = timed_clients(run, clients)
    if len(results) != clients * requests:
        raise RuntimeError(f"{clients * requests - len(results)} of {clients * requests} requests failed")
    return sum(r.eval_count for r in results) / wall, sum(r.speculation.draft_n for r in results)


def main(argv: list[str] | None = None) -> str:
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("draft")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="reps run first and not reported: the first requests after a load meet its page faults "
                         "(plain ran 2.3-2.7x slower than the pair in a first rep at one client)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1, help="requests each client sends, one after another")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--prompts", choices=("all", "code"), default="all")
    ap.add_argument("--depths", default="", help="fixed draft depths measured beside the adaptive pair, e.g. 1,2")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    configs = configurations([int(n) for n in args.depths.split(",") if n])
    prompts = CODE_PROMPTS if args.prompts == "code" else PROMPTS
    runtime = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.draft, num_ctx=args.num_ctx,
                                         num_thread=args.threads, device="cpu", num_parallel=args.slots))
    # (clients, label) -> per rep: (tok/s, tokens drafted)
    runs: dict[tuple[int, str], list[tuple[float, int]]] = {}
    for rep in range(-args.warmup, args.reps):
        for c in levels:
            # every other rep in reverse order: the configuration run right after another does not always find the
            # host (and the slots' caches) as that one left them
            for label, options in (list(configs.items()) if rep % 2 == 0 else list(configs.items())[::-1]):
                measured = aggregate(runtime, c, options, args.tokens, args.requests, prompts)
                if rep >= 0:
                    runs.setdefault((c, label), []).append(measured)
    lines = [host_line(args.threads), "", f"`python -m benchmarks.pair_in_batch {' '.join(argv or [])}`".rstrip(), "",
             f"{args.slots} slots, {args.tokens} greedy tokens a request, {args.requests} a client, "
             f"{'the code prompts' if args.prompts == 'code' else 'code, prose and list prompts'}; each rep runs every "
             f"configuration in turn (every other rep in reverse), after {args.warmup} warm-up rep(s) not reported. "
             "× plain: the median over reps of its tok/s over plain's in the same rep.", "",
             "| clients | configuration | tok/s (median) | × plain per rep | × plain | drafted per rep |",
             "|---:|---|---:|---|---:|---|"]
    for c in levels:
        plain = runs[(c, "plain")]
        for label in configs:
            mine = runs[(c, label)]
            ratios = [r / p for (r, _), (p, _) in zip(mine, plain)]
            lines.append(f"| {c} | {label} | {statistics.median(r for r, _ in mine):.1f} | "
                         f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} | "
                         f"{', '.join(str(d) for _, d in mine)} |")
    return emit(lines, args.markdown)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
