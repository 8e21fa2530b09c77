"""A DRAFT pair against plain decoding on a runtime that serves several sequences, in process.

    python -m benchmarks.pair_in_batch TARGET.gguf DRAFT.gguf [--slots 8] [--clients 1,2,4,8] [--reps 3]
        [--tokens 64] [--requests 1] [--threads 2]

Each rep runs, for each client count C, C concurrent clients, each sending ``--requests`` greedy requests one after
another (benchmarks.serving's prompts, client i starting at the i-th, in its chat template; the pair without suffix
drafting, as there), plain (``drafter none``) and then with the draft model, on one runtime of ``--slots`` slots: the
aggregate generated tokens over the wall time, and the pair's ratio to plain in the same rep. One request a client
is a burst, timed to its last answer (a request that finishes early leaves its slot idle); several keep the load
up, as a busy server's clients do. What it isolates from benchmarks.serving: the step loop (engine.batching), without
the server, the pipe or a second engine process.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.output import emit, host_line
from benchmarks.serving import CHATML, PROMPTS, timed_clients


def aggregate(runtime, clients: int, drafter: str, tokens: int, requests: int = 1) -> tuple[float, int]:
    """(generated tokens a second over the wall time, tokens drafted) for ``clients`` concurrent clients sending
    ``requests`` requests each."""
    from engine.contract.options import Options
    from engine.contract.protocol import GenerateRequest, GenerateResult

    results: list = []

    def run(i: int) -> None:
        for k in range(requests):
            req = GenerateRequest(prompt=CHATML.format(PROMPTS[(i + k) % len(PROMPTS)]), options=Options(
                temperature=0.0, num_predict=tokens, drafter=drafter, draft_suffix=False))
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
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1, help="requests each client sends, one after another")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    runtime = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.draft, num_ctx=args.num_ctx,
                                         num_thread=args.threads, device="cpu", num_parallel=args.slots))
    runs: dict[int, list[tuple[float, float, int]]] = {c: [] for c in levels}
    for _ in range(args.reps):
        for c in levels:
            plain, _ = aggregate(runtime, c, "none", args.tokens, args.requests)
            pair, drafted = aggregate(runtime, c, "model", args.tokens, args.requests)
            runs[c].append((plain, pair, drafted))
    lines = [host_line(args.threads), "", f"`python -m benchmarks.pair_in_batch {' '.join(argv or [])}`".rstrip(), "",
             f"{args.slots} slots, {args.tokens} greedy tokens a request, {args.requests} a client; per rep: plain, "
             "then the pair.", "",
             "| clients | plain tok/s (median) | pair tok/s (median) | pair / plain per rep | median | drafted per rep |",
             "|---:|---:|---:|---|---:|---|"]
    for c in levels:
        ratios = [pair / plain for plain, pair, _ in runs[c]]
        lines.append(f"| {c} | {statistics.median(p for p, _, _ in runs[c]):.1f} | "
                     f"{statistics.median(q for _, q, _ in runs[c]):.1f} | {', '.join(f'{r:.2f}' for r in ratios)} | "
                     f"{statistics.median(ratios):.2f} | {', '.join(str(d) for _, _, d in runs[c])} |")
    return emit(lines, args.markdown)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
