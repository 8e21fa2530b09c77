"""Concurrent clients against a real server: aggregate and per-stream tokens/s, inter-token latency.

    python -m benchmarks.serving --model target.gguf [--draft draft.gguf] [--levels 1,2,4,8] [--tokens 64]
        [--rounds 2] [--parallel 8] [--widths 1,2,4,8] [--prefill-tokens 1700] [--no-anchor] [--llama-server PATH]
        [--vllm-url http://127.0.0.1:8000 --vllm-model NAME] [--markdown out.md]

Starts ``tandem serve`` on a free loopback port with a fresh store, creates the plain model (``FROM``, no
speculation: ``drafter none``) and, with ``--draft``, the speculative pair (``FROM`` + ``DRAFT``, without suffix
drafting: each round repeats the prompts, which the earlier rounds' outputs would draft whole), which is also
asked with ``drafter none`` (the same engine process, not drafting: the pair's cost or gain told apart from two
engine processes' drift), then for each round and each concurrency level C runs C clients at once, each
streaming one greedy completion of ``--tokens``
tokens through ``/v1/completions`` (a different prompt each: code, prose, lists). With ``--vllm-url`` the same requests go
to that server too, in the same round, right after tandem's (vLLM's CPU build runs in its own virtualenv:
start it yourself). Reported per (server, model, C), medians over rounds: aggregate tokens/s (all clients'
tokens, as the servers' usage counts them, over the level's wall time), the median stream's tokens/s (first
to last chunk), p50/p95 over the streams of their mean inter-token latency, and the p95 gap between two
chunks of a stream (a speculative round streams several tokens in one chunk: what a reader sees as a stall).

tandem's models are asked through ``/api/generate`` in raw mode, so they get the very text a server's own
``/v1/completions`` gets. Beside them, unless ``--no-anchor``: llama-server on the same GGUF with ``-np
--parallel`` (the binary the llamacpp engine uses, or ``--llama-server PATH``), started by tandem as the ``anchor``
model and asked directly at its own ``/v1/completions``. Before the server starts, ``benchmarks.decode`` measures
the native engine's forward at each width (``--widths``, default the levels) in the same run: a level of C clients
can at best reach C / (forward time at width C) tokens/s, printed as the ceiling with the share reached; the server
runs with ``TANDEM_STEP_TRACE``, and each tandem level also reports the share of its wall time the engine spent in
forwards and the mean rows of a target step, from the engine's own trace (``traced_level``). With
``--prefill-tokens N`` (default 1700) every round also times one request with an N-token prompt (a fresh one each
time, so no cache holds it) and one generated token per target: prompt tokens / seconds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

from benchmarks.output import emit, host_line
from engine.batching.step_trace import read_steps, summarise, trace_path

#: The pair's model asked not to draft (options drafter none): a target of its own beside "plain" and "draft".
DRAFTING_OFF = "draft, drafting off"

CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [
    "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals.",
    "Write a short paragraph about the history of the printing press in Europe.",
    "List twelve kitchen utensils, one per line, each with a short note on what it is for.",
    "Write a bash script that backs up a directory to a dated tar.gz and keeps the last seven backups.",
    "Explain the difference between a process and a thread, with an example in C.",
    "Write a Python class implementing an LRU cache with get and put.",
    "Describe how a city changes over four seasons, for a travel magazine.",
    "Write a SQL query that finds the three best-selling products per month.",
]
#: The code prompts among them (the draft model's best case: benchmarks.pair_in_batch --prompts code).
CODE_PROMPTS = [PROMPTS[i] for i in (0, 3, 4, 5, 7)]


def stream_completion(url: str, model: str, prompt: str, tokens: int) -> tuple[list[float], int, tuple[int, int]]:
    """The arrival time of every streamed chunk with text, the completion's token count (the usage the
    server reports: a speculative round streams several tokens in one chunk), and the tokens tandem drafted
    and accepted for it (its ``speculative_decoding`` statistics; 0, 0 from another server)."""
    body = json.dumps({"model": model, "prompt": CHATML.format(prompt), "max_tokens": tokens, "temperature": 0,
                       "stream": True, "seed": 1, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    times, count, drafted = [], 0, (0, 0)
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                count = int(event["usage"].get("completion_tokens") or 0)
            spec = event.get("speculative_decoding")
            if spec:
                drafted = (int(spec.get("draft_n") or 0), int(spec.get("draft_n_accepted") or 0))
            choice = (event.get("choices") or [{}])[0]
            if choice.get("text"):
                times.append(time.perf_counter())
    return times, count or len(times), drafted


def stream_raw(url: str, model: str, prompt: str, tokens: int,
               options: dict | None = None) -> tuple[list[float], int, tuple[int, int]]:
    """One greedy generation streamed from tandem's /api/generate in raw mode: the very text a server's own
    /v1/completions gets (tandem's /v1/completions applies the model's template, as Ollama's does). ``options``:
    more of the request's options (``{"drafter": "none"}``: the same engine, not drafting)."""
    body = json.dumps({"model": model, "prompt": CHATML.format(prompt), "raw": True, "stream": True,
                       "options": {"temperature": 0, "num_predict": tokens, "seed": 1, **(options or {})}}).encode()
    req = urllib.request.Request(url + "/api/generate", data=body, headers={"Content-Type": "application/json"})
    times, count, drafted = [], 0, (0, 0)
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            event = json.loads(raw)
            if event.get("response"):
                times.append(time.perf_counter())
            if event.get("done"):
                count = int(event.get("eval_count") or 0)
                drafted = (int(event.get("draft_n") or 0), int(event.get("draft_n_accepted") or 0))
    return times, count or len(times), drafted


def engine_of(url: str, model: str) -> dict:
    """What runs ``model`` now: its ``/api/ps`` entry's ``engine`` object (pid, backend, endpoint...)."""
    with urllib.request.urlopen(url + "/api/ps", timeout=30) as r:
        models = json.load(r)["models"]
    return next(m["engine"] for m in models if m["name"].split(":")[0] == model)


def endpoint_of(url: str, model: str) -> str:
    return engine_of(url, model)["endpoint"]


def traced_level(url: str, model: str, traces: Path, level: Callable[[], dict]) -> dict:
    """``level()``'s result with what ``model``'s engine process traced meanwhile (TANDEM_STEP_TRACE into
    ``traces``): ``in_forwards``, the share of the level's wall time its step loop spent in forwards, and
    ``rows_per_step``, the mean rows of its target steps."""
    start = time.time()
    result = level()
    end = time.time()
    path = trace_path(traces, int(engine_of(url, model)["pid"]))
    if path.exists():
        steps = summarise(read_steps(path), start, end)
        result = {**result, "in_forwards": steps.forward_share, "rows_per_step": steps.rows_per_step}
    return result


def timed_clients(client: Callable[[int], None], clients: int) -> float:
    """Seconds from starting ``clients`` threads, thread i running ``client(i)``, until the last has returned."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def run_level(url: str, model: str, clients: int, tokens: int, stream=stream_completion) -> dict:
    """``clients`` clients at once, each streaming one completion with ``stream`` (stream_completion's signature)."""
    arrivals: list[list[float]] = [[] for _ in range(clients)]
    counts = [0] * clients
    drafted = [(0, 0)] * clients

    def client(i: int) -> None:
        arrivals[i], counts[i], drafted[i] = stream(url, model, PROMPTS[i % len(PROMPTS)], tokens)

    started = time.perf_counter()
    wall = timed_clients(client, clients)
    total = sum(counts)
    # a stream's tokens after its first, over the time from its first chunk to its last
    rates = [(n - 1) / (a[-1] - a[0]) for a, n in zip(arrivals, counts) if len(a) > 1 and a[-1] > a[0] and n > 1]
    itl = sorted(1e3 / r for r in rates)  # each stream's mean inter-token latency, ms
    gaps = sorted(b - a for s in arrivals for a, b in zip(s, s[1:]))
    firsts = sorted(a[0] - started for a in arrivals if a)  # each client's time to its first chunk with text
    pick = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")  # noqa: E731
    return {"aggregate": total / wall, "stream": statistics.median(rates) if rates else 0.0,
            "itl_p50_ms": pick(itl, 0.5), "itl_p95_ms": pick(itl, 0.95), "gap_p95_ms": pick(gaps, 0.95) * 1e3,
            "ttft_p50": statistics.median(firsts) if firsts else float("nan"),
            "ttft_max": firsts[-1] if firsts else float("nan"),
            "tokens": total, "drafted": sum(d for d, _ in drafted), "accepted": sum(a for _, a in drafted)}


Target = tuple  # (label, url, model, stream function)


def interleaved_rounds(targets: list[Target], levels: list[int], rounds: int, tokens: int) -> dict[tuple[str, int], list[dict]]:
    """Every level runs every target in turn, each round; every other round in reverse order, so that the target
    run right after another does not always find the host (and a backend's caches) as that one left them."""
    cells: dict[tuple[str, int], list[dict]] = {}
    for rnd in range(rounds):
        for c in levels:
            for label, u, name, stream in (targets if rnd % 2 == 0 else targets[::-1]):
                cells.setdefault((label, c), []).append(run_level(u, name, c, tokens, stream))
                print(f"round {rnd + 1} C={c} {label} done", file=sys.stderr, flush=True)
    return cells


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except Exception:  # noqa: BLE001 - a benchmark's cleanup
        proc.kill()


def drafted_cell(runs: list[dict]) -> str:
    """The tokens drafted (accepted) for all of a level's streams, per round."""
    return (f"{sum(r['drafted'] for r in runs) / len(runs):.0f} "
            f"({sum(r['accepted'] for r in runs) / len(runs):.0f})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path, parallel: int, extra_env: dict[str, str] | None = None,
                 tree: Path | None = None) -> tuple[subprocess.Popen, str]:
    """``tandem serve`` with a store in ``home``, from the checkout ``tree`` (default: the working directory's)."""
    port = free_port()
    env = dict(os.environ, TANDEM_HOST=f"127.0.0.1:{port}", TANDEM_MODELS=str(home / "models"),
               TANDEM_NUM_PARALLEL=str(parallel), TANDEM_KEEP_ALIVE="-1", TANDEM_CREATE_PATHS=str(home),
               **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(home / "serve.log", "w"), cwd=tree)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/api/version", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"tandem serve did not start (see {home / 'serve.log'})")


def create(url: str, name: str, modelfile: str) -> None:
    body = json.dumps({"model": name, "modelfile": modelfile, "stream": False}).encode()
    req = urllib.request.Request(url + "/api/create", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        r.read()


PREFILL_TEXT = ("The committee met on a grey morning to review the harbour's accounts, the state of the old pier, the "
                "ferry timetable for the winter and a letter from the school asking for a crossing guard. ")


def prefill_rate(url: str, model: str, tokens: int, raw: bool) -> dict:
    """One request whose prompt is about ``tokens`` tokens (fresh text: no cache holds it) and one generated token:
    the prompt tokens the server counted over the request's wall time. ``raw``: tandem's /api/generate in raw
    mode, else a server's own /v1/completions."""
    text = CHATML.format(f"Request {uuid.uuid4().hex}. Summarise the minutes below.\n\n"
                         + PREFILL_TEXT * max(1, tokens // 40))
    if raw:
        path, body = "/api/generate", {"model": model, "prompt": text, "raw": True, "stream": False,
                                        "options": {"temperature": 0, "num_predict": 1}}
    else:
        path, body = "/v1/completions", {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        answer = json.load(r)
    seconds = time.perf_counter() - t0
    count = int(answer.get("prompt_eval_count") or 0) if raw else int((answer.get("usage") or {}).get("prompt_tokens") or 0)
    return {"tokens": count, "seconds": seconds, "rate": count / seconds}


def width_costs(model: str, widths: list[int], home: Path) -> dict[int, float]:
    """The native engine's forward at each width, ms (median), measured by benchmarks.decode in a child process."""
    out = home / "widths.json"
    cmd = [sys.executable, "-m", "benchmarks.decode", model, "--formats", "auto", "--no-llama", "--reps", "2",
           "--warmup", "1", "--tokens", "8", "--prefill", "64", "--bw-mib", "64",
           "--widths", ",".join(str(w) for w in sorted({1, *widths})), "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=open(home / "widths.log", "w"))
    result = json.loads(out.read_text())["results"][0]
    return {int(w): v["median"] for w, v in result["width_ms"].items() if v.get("median")}


#: Options the report's command line always shows (what every level measured), beside any other not at its default.
_ALWAYS_SHOWN = ("levels", "tokens", "rounds", "parallel")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="TANDEM_NUM_PARALLEL for the server")
    ap.add_argument("--widths", help="forward widths the ceiling comes from (default: the levels); 'none' skips")
    ap.add_argument("--prefill-tokens", type=int, default=1700, help="a long prompt's length (0: not measured)")
    ap.add_argument("--no-anchor", action="store_true", help="do not measure llama-server beside tandem")
    ap.add_argument("--llama-server", help="the llama-server binary (default: the one the llamacpp engine uses)")
    ap.add_argument("--vllm-url")
    ap.add_argument("--vllm-model")
    ap.add_argument("--markdown")
    return ap


def command_line(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command the report was measured with: the levels, tokens, rounds and parallel slots, and every other
    option given a value other than its default (widths, prefill length, no anchor...); files as their names (a path
    says where, not what), a vLLM address as ``...``, and not ``--markdown`` (where the report itself went)."""
    words = [ap.prog]
    for action in ap._actions:
        if not action.option_strings or action.dest in ("help", "markdown"):
            continue
        value = getattr(args, action.dest)
        if value == action.default and action.dest not in _ALWAYS_SHOWN and not action.required:
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:  # a switch
            words.append(flag)
        elif action.dest in ("model", "draft", "llama_server"):
            words += [flag, Path(value).name]
        elif action.dest == "vllm_url":
            words += [flag, "..."]
        else:
            words += [flag, str(value)]
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    home = Path(tempfile.mkdtemp(prefix="tandem-serving-"))
    for src in filter(None, (args.model, args.draft)):
        shutil.copy(src, home / Path(src).name) if not (home / Path(src).name).exists() else None
    widths = [] if args.widths == "none" else [int(x) for x in (args.widths or args.levels).split(",") if x]
    costs = width_costs(str(home / Path(args.model).name), widths, home) if widths else {}
    traces = home / "steps"  # the engines' step traces: where each level's time went (traced_level)
    proc, url = start_server(home, args.parallel, {"TANDEM_STEP_TRACE": str(traces),
                                                   **({"TANDEM_LLAMA_SERVER": args.llama_server} if args.llama_server else {})})
    cells: dict[tuple[str, str, int], list[dict]] = {}
    prefill: dict[tuple[str, str], list[dict]] = {}
    try:
        # Every round asks the same prompts again: the suffix drafter (on by default) would draft them whole from
        # the earlier rounds' outputs, which measures the store, not batching (benchmarks.agent_replay does that).
        # So plain is no speculation at all, and the pair drafts from its draft model and the request alone.
        base = f"FROM {home / Path(args.model).name}\nPARAMETER engine native\n"
        models = {"plain": base + "PARAMETER drafter none\n"}
        if args.draft:
            models["draft"] = base + f"DRAFT {home / Path(args.draft).name}\nPARAMETER draft_suffix false\n"
        for name, mf in models.items():
            create(url, name, mf)
        # (server, label, url, model, stream): the pair is also asked not to draft, in the same engine process, so
        # that its cost against plain decoding is told apart from two engine processes' drift on a shared host
        targets = [("tandem", name, url, name, stream_raw) for name in models]
        if args.draft:
            targets.append(("tandem", DRAFTING_OFF, url, "draft", functools.partial(stream_raw, options={"drafter": "none"})))
        if not args.no_anchor:
            create(url, "anchor", f"FROM {home / Path(args.model).name}\nPARAMETER engine llamacpp\n"
                                  "PARAMETER drafter none\n")
            run_level(url, "anchor", 1, 8, stream_raw)  # loads llama-server; asked directly from here on
            targets.append(("llama-server", "plain", endpoint_of(url, "anchor"), "plain", stream_completion))
        if args.vllm_url:
            targets.append(("vllm", "plain", args.vllm_url, args.vllm_model or "model", stream_completion))
        for _, _, u, model, stream in targets:  # warm: load, compile kernel shapes
            run_level(u, model, 1, 8, stream)
            # ... and every level's prompts read once by every engine: else the first target of a round to reach a new
            # prompt evaluates it and the next one asking the same engine (the pair not drafting) reuses its cache,
            # which made the pair drafting nothing measure 0.84-0.93x itself not drafting (docs/bench/
            # serving-traced-zen3-avx2-dec07.md); the levels measure decoding, the prefill row prompts
            run_level(u, model, max(levels), 2, stream)
        for rnd in range(args.rounds):
            for c in levels:
                # every other round in reverse order, as interleaved_rounds does: the target asked right after
                # another (the pair after its own engine's drafting-off run) does not always find the host as
                # that one left it
                for server, label, u, model, stream in (targets if rnd % 2 == 0 else targets[::-1]):
                    level = functools.partial(run_level, u, model, c, args.tokens, stream)
                    cells.setdefault((server, label, c), []).append(
                        traced_level(url, model, traces, level) if server == "tandem" else level())
                    print(f"round {rnd + 1} C={c} {server}/{label} done", file=sys.stderr, flush=True)
            if args.prefill_tokens > 0:
                for server, label, u, model, stream in targets:
                    if label != DRAFTING_OFF:  # one token: nothing to draft
                        prefill.setdefault((server, label), []).append(
                            prefill_rate(u, model, args.prefill_tokens, raw=stream is stream_raw))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(home, ignore_errors=True)  # the model copies and the store: gigabytes per run
    lines = ["# Concurrent clients through the server", "", host_line(int(os.environ.get("OMP_NUM_THREADS", 0))
                                                                       or os.cpu_count() or 1), "",
             f"`{command_line(ap, args)}`", "",
             "× plain: the median over rounds of this model's aggregate over the plain model's in the same round "
             "(the host drifts between rounds). × drafting off: the pair's over its own engine's when the requests "
             f"ask it not to draft (`{DRAFTING_OFF}`, options drafter none), same round: what drafting costs or "
             "gains with no second engine process in the comparison. drafted (accepted): tokens drafted for all "
             "the level's streams, per round. in forwards: the share of the level's wall time tandem's engine spent "
             "in its step loop's forwards (draft models' included), rows/step: the mean rows of its target forwards, "
             "both from its step trace (TANDEM_STEP_TRACE): a level below its ceiling with the forwards near 100 % "
             "of the time is bound by what its forwards cost, not by the loop around them.", "",
             "| server | model | clients | aggregate tok/s | × 1 client | × plain | × drafting off | × llama-server "
             "| ceiling tok/s | share | in forwards | rows/step | stream tok/s (median) | inter-token ms p50 | p95 "
             "| chunk gap p95 ms | drafted (accepted) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (server, name, c), runs in cells.items():
        agg = statistics.median(r["aggregate"] for r in runs)
        one = statistics.median(r["aggregate"] for r in cells.get((server, name, levels[0]), runs))
        plain = cells.get((server, "plain", c)) if server == "tandem" and name != "plain" else None
        off = cells.get((server, DRAFTING_OFF, c)) if server == "tandem" and name == "draft" else None
        anchor = cells.get(("llama-server", "plain", c)) if server == "tandem" else None

        def paired(other: list[dict] | None) -> str:
            return f"{statistics.median(r['aggregate'] / p['aggregate'] for r, p in zip(runs, other)):.2f}" \
                if other else ""

        # the native engine's C-row forward bounds C clients' plain decoding (not a speculative pair's)
        ceiling = c * 1e3 / costs[c] if server == "tandem" and name == "plain" and c in costs else None
        traced = [r for r in runs if "in_forwards" in r]
        lines.append(f"| {server} | {name} | {c} | {agg:.1f} | {agg / one:.2f} | {paired(plain)} | {paired(off)} | "
                     f"{paired(anchor)} | "
                     + (f"{ceiling:.1f} | {agg / ceiling:.0%} | " if ceiling else " |  | ")
                     + (f"{statistics.median(r['in_forwards'] for r in traced):.0%} | "
                        f"{statistics.median(r['rows_per_step'] for r in traced):.1f} | " if traced else " |  | ")
                     + f"{statistics.median(r['stream'] for r in runs):.1f} | "
                     f"{statistics.median(r['itl_p50_ms'] for r in runs):.0f} | "
                     f"{statistics.median(r['itl_p95_ms'] for r in runs):.0f} | "
                     f"{statistics.median(r['gap_p95_ms'] for r in runs):.0f} | {drafted_cell(runs)} |")
    if costs:
        lines += ["", "Forward of the native engine by width (benchmarks.decode, same run, median ms; ceiling at C "
                  "clients = C / the width-C forward): " + ", ".join(
                      f"w{w} {ms:.1f} ms (x{ms / costs[1]:.2f})" for w, ms in sorted(costs.items()) if 1 in costs)]
    if prefill:
        lines += ["", f"Prefill of a {args.prefill_tokens}-token prompt (a fresh one each round; one request alone; "
                  "prompt tokens / seconds, median over rounds):", "",
                  "| server | model | prompt tokens | tok/s | × llama-server |", "|---|---|---:|---:|---:|"]
        anchor_rate = statistics.median(r["rate"] for r in prefill.get(("llama-server", "plain"), [{"rate": 0}]))
        for (server, name), runs in prefill.items():
            rate = statistics.median(r["rate"] for r in runs)
            lines.append(f"| {server} | {name} | {runs[0]['tokens']} | {rate:.1f} | "
                         + (f"{rate / anchor_rate:.2f} |" if anchor_rate else " |"))
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
