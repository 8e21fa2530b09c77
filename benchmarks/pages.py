"""One model's decode step with its weights in three places, side by side in one process.

    python -m benchmarks.pages MODEL.gguf [--rounds 30] [--tokens 16] [--threads 2] [--markdown PATH]

The same GGUF is loaded three times: ``placed`` as every load is now (the weights it builds moved onto memory
advised for 2 MB pages, ``engine.ops.memory.place_on_huge_pages``), ``4 kB`` with that move switched off (the
ordinary anonymous allocations the builders made), and ``pack cache`` mapped from a packed-weight cache file
(as a server's second load of a model; the file's pages are whatever folios the page cache holds). Each round
times ``--tokens`` one-token forwards of each after a 128-token prompt, in an order that rotates from round to
round, so the host's drift (a neighbour on the memory bus) hits all three alike. Reported: ms per token
(median and min over rounds), the per-round ratio of each to ``placed`` (median and range), and how much of
each copy the kernel maps with 2 MB pages (``/proc/self/smaps``: AnonHugePages, FilePmdMapped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.output import emit, host_line


def _huge_mapped(tensors) -> dict[str, int]:
    """Bytes of 2 MB mappings (anonymous and file) over the mappings that hold ``tensors``' storages."""
    from engine.ops.memory import process_mappings

    ptrs = {t.untyped_storage().data_ptr() for t in tensors}
    holding = [m for m in process_mappings() if any(m.start <= p < m.end for p in ptrs)]
    return {key: sum(m.sizes.get(key, 0) for m in holding) for key in ("AnonHugePages", "FilePmdMapped", "Rss")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pages", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)

    import torch

    from engine.models import loader

    torch.set_num_threads(args.threads)
    place = loader.place_on_huge_pages
    models = {"placed": loader.load_model(args.model)}
    loader.place_on_huge_pages = lambda module: 0
    try:
        models["4 kB"] = loader.load_model(args.model)
    finally:
        loader.place_on_huge_pages = place
    packs = tempfile.TemporaryDirectory(prefix="tandem-pages-")
    first = loader.load_model(args.model, pack_dir=packs.name)
    first.gguf.packs.wait()
    del first
    models["pack cache"] = loader.load_model(args.model, pack_dir=packs.name)

    vocab = models["placed"].config.vocab_size
    prompt = [(1000 + i) % vocab for i in range(128)]
    caches = {name: m.new_cache(len(prompt) + args.tokens + 1) for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    with torch.no_grad():
        for name, m in models.items():
            m.forward(prompt, caches[name], logits_for="last")
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                m, cache = models[name], caches[name]
                cache.truncate(len(prompt))
                t0 = time.perf_counter()
                for i in range(args.tokens):
                    m.forward([(2000 + i) % vocab], cache, logits_for="last")
                times[name].append((time.perf_counter() - t0) / args.tokens * 1e3)
    mapped = {name: _huge_mapped(list(m.buffers()) + list(m.parameters())) for name, m in models.items()}
    packs.cleanup()

    lines = [f"# Weights on 2 MB pages: {Path(args.model).name}", "",
             f"- command: `python -m benchmarks.pages {args.model} --rounds {args.rounds} --tokens {args.tokens}"
             f" --threads {args.threads}`",
             f"- host: {host_line(args.threads)}",
             f"- {time.strftime('%Y-%m-%dT%H:%M:%S%z')}", "",
             "| weights | ms/token (median / min) | / placed per round (median, range) | 2 MB-mapped of resident (the mappings holding its weights) |",
             "|---|---:|---:|---:|"]
    report = {"model": args.model, "rounds": args.rounds, "tokens": args.tokens, "results": {}}
    for name in names:
        ratios = [a / b for a, b in zip(times[name], times["placed"])]
        huge = mapped[name]["AnonHugePages"] + mapped[name]["FilePmdMapped"]
        lines.append(f"| {name} | {statistics.median(times[name]):.1f} / {min(times[name]):.1f} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
                     f"{huge >> 20} of {mapped[name]['Rss'] >> 20} MiB |")
        report["results"][name] = {"ms_per_token": times[name], "ratio_to_placed": ratios, **mapped[name]}
    emit(lines, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
