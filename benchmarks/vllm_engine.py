"""The vllm engine measured: what tandem adds in front of vLLM, and vLLM's speculation beside tandem's own engine.

    python -m benchmarks.vllm_engine --folder TARGET_DIR [--draft-folder DRAFT_DIR] --vllm-python PY
        [--native-model T.gguf [--native-draft D.gguf]] [--levels 1,8] [--tokens 64] [--rounds 2] [--parallel 8]
        [--drafter model|ngram] [--markdown out.md]

Starts ``tandem serve`` (``TANDEM_VLLM_PYTHON=PY``) on a fresh store and creates, from the same safetensors
folders: ``vllm`` (``PARAMETER engine vllm``) and, with a drafter, ``vllm-spec`` (``DRAFT`` the draft folder, or
``drafter ngram``), and the same two on tandem's own engine (``native``, ``native-spec``). The ``vllm`` model's own
vLLM server (its ``/api/ps`` endpoint) is also measured directly (``vllm-direct``): the same process with and
without tandem in front, so the ratio is tandem's overhead alone. ``--native-model``/``--native-draft``: the native
models from these GGUFs instead (the quantized files each engine runs best: vLLM's CPU build has no K-quant
kernels, tandem's engine is fastest on its own quantized codes). Every level runs every target in turn, each
round (the host drifts). Every client streams one greedy completion of the same chat-formatted text: from vLLM's
own ``/v1/completions``, and from tandem's ``/api/generate`` in raw mode (the same tokens; tandem's
``/v1/completions`` applies the model's template, as Ollama's does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.output import emit, host_line
from benchmarks.serving import (create, drafted_cell, endpoint_of, interleaved_rounds, run_level, start_server,
                               stop_server, stream_completion, stream_raw)

# vLLM's CPU build otherwise sizes its KV cache from the machine's memory; its other defaults stay (it keeps one
# core for its front end, where tandem's own work runs too). Set VLLM_CPU_* in the environment to override.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vllm_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--draft-folder")
    ap.add_argument("--drafter", choices=("model", "ngram"), default="model")
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--native-model")
    ap.add_argument("--native-draft")
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["TANDEM_VLLM_PYTHON"] = args.vllm_python
    home = Path(tempfile.mkdtemp(prefix="tandem-vllm-bench-"))
    target = home / "target"
    shutil.copytree(args.folder, target)
    spec = native_spec = ""
    native = f"FROM {target}\n"
    if args.native_model:
        shutil.copy(args.native_model, home / "native.gguf")
        native = f"FROM {home / 'native.gguf'}\n"
    if args.drafter == "ngram":
        spec = native_spec = "PARAMETER drafter ngram\nPARAMETER draft_num_predict 4\n"
    elif args.draft_folder:
        shutil.copytree(args.draft_folder, home / "draft")
        spec = native_spec = f"DRAFT {home / 'draft'}\nPARAMETER draft_num_predict 4\n"
        if args.native_draft:
            shutil.copy(args.native_draft, home / "native-draft.gguf")
            native_spec = f"DRAFT {home / 'native-draft.gguf'}\nPARAMETER draft_num_predict 4\n"
    proc, url = start_server(home, args.parallel)
    cells: dict[tuple[str, int], list[dict]] = {}
    try:
        models = {"vllm": f"FROM {target}\nPARAMETER engine vllm\n", "native": native}
        if spec:
            models["vllm-spec"] = models["vllm"] + spec
            # the native engine's defaults for the rest (adaptive depth); the same drafter and cap
            models["native-spec"] = native + native_spec
        for name, modelfile in models.items():
            create(url, name, modelfile)
        targets = [(name, url, name, stream_raw) for name in models]
        for _, u, name, stream in targets:  # load, and warm the kernels' shapes
            run_level(u, name, 1, 8, stream)
        targets.insert(1, ("vllm-direct", endpoint_of(url, "vllm"), "tandem", stream_completion))
        cells = interleaved_rounds(targets, levels, args.rounds, args.tokens)
    finally:
        stop_server(proc)
        shutil.rmtree(home, ignore_errors=True)
    lines = ["# The vllm engine: tandem in front of vLLM, and vLLM's speculation beside tandem's engine", "",
             host_line(int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count() or 1), "",
             "vLLM's CPU settings: " + ", ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ)
                                                 if k.startswith("VLLM_CPU")) + ".", "",
             f"`python -m benchmarks.vllm_engine --folder {Path(args.folder).name}"
             + (f" --draft-folder {Path(args.draft_folder).name}" if args.draft_folder else "")
             + (f" --native-model {Path(args.native_model).name}" if args.native_model else "")
             + (f" --native-draft {Path(args.native_draft).name}" if args.native_draft else "")
             + f" --drafter {args.drafter} --levels {args.levels} --tokens {args.tokens} --rounds {args.rounds}"
             + f" --parallel {args.parallel}`", "",
             "× direct: the median over rounds of this target's aggregate over vLLM's own server's in the same round "
             "(vllm and vllm-direct are one vLLM process). × plain: over the same engine without speculation.", "",
             "| target | clients | aggregate tok/s | × direct | × plain | stream tok/s (median) | inter-token ms p50 "
             "| drafted (accepted) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (label, c), runs in cells.items():
        agg = statistics.median(r["aggregate"] for r in runs)
        direct = cells.get(("vllm-direct", c))
        plain = cells.get((label.removesuffix("-spec"), c)) if label.endswith("-spec") else None

        def ratio(other):
            return f"{statistics.median(r['aggregate'] / o['aggregate'] for r, o in zip(runs, other)):.3f}" \
                if other else ""

        lines.append(f"| {label} | {c} | {agg:.2f} | {ratio(direct) if label.startswith('vllm') else ''} | "
                     f"{ratio(plain)} | {statistics.median(r['stream'] for r in runs):.2f} | "
                     f"{statistics.median(r['itl_p50_ms'] for r in runs):.0f} | {drafted_cell(runs)} |")
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
