"""Prefill and decode speed of one GGUF, per weight format, beside llama.cpp and the memory-bandwidth bound.

    python -m benchmarks.decode MODEL.gguf [--formats auto,bf16-packed,int8] [--prefill 128] [--tokens 64]
        [--reps 3] [--warmup 1] [--widths 1,2,4,8,16] [--threads N] [--no-llama] [--json PATH] [--markdown PATH]

What is measured, per "subject" (tandem with one weight format, and llama.cpp through llama-cpp-python
when it can be imported), in ONE process and ONE run:

* load: wall time of ``ModelRuntime.load`` (tandem: GGUF parse, tokenizer, weight conversion) or of
  ``llama_cpp.Llama(...)``. One load each, after the file has been read once so the page cache is warm.
* prefill: one forward over a ``--prefill``-token prompt on an empty cache (logits for the last position
  only; llama.cpp: ``Llama.eval`` after ``reset``). Rate = prompt tokens / wall seconds.
* decode, end to end: greedy generation of ``--tokens`` tokens through the real request path
  (tandem: ``ModelRuntime.generate`` with sampling, stop handling and detokenisation; llama.cpp:
  ``Llama.create_completion``), the prompt already in the cache. Both produce the first token from the
  prompt's logits, so the timed part holds ``tokens - 1`` forwards: rate = (tokens - 1) / seconds.
* decode, forward only: ``--tokens`` single-token forwards after the prompt (tandem: ``Model.forward``
  with the last position's logits; llama.cpp: ``Llama.eval``), no sampling. Rate = tokens / seconds.
* width cost: ONE forward over w = 1, 2, 4, 8, 16 new tokens right after the prompt, with logits for
  every position (what speculative verification needs), the cache truncated back after each, so the
  position stays fixed. Reported as ms and as the ratio to w = 1 (ratio of medians; of minima in JSON).
* linears only (tandem): one pass over every linear layer of the model at width 1 with compute-dtype
  input; the gap to the forward-only step is the cost outside the matmuls (attention, norms, RoPE,
  dtype casts, Python).
* read bandwidth: three probes over a ``--bw-mib`` buffer with the same threads, best of 5 passes each,
  once per repetition: ``torch.mv`` (f32 GEMV), ``torch.sum``, and a native streaming read (64-byte loads
  from every thread, ``engine/ops/kernels/probe.cpp``: what the decode kernels do, without the
  arithmetic). The bound uses the fastest probe (median over repetitions): PyTorch's reductions alone
  read 25-50 % slower than the engines do, so a bound from them was exceeded. A subject above 100 % of
  the bound is flagged as a probe error. The bound is bytes read per token / bandwidth:
  tandem reads the ``weight_nbytes()`` of every linear plus one embedding row; llama.cpp reads the
  GGUF's 2-D tensors as stored (the embedding table as one row, unless it doubles as the output).
  The KV cache is left out (a few MB at these positions).

llama.cpp is first run once in a child process on the model (load + 17 tokens): a llama-cpp-python build
made for another CPU dies with SIGILL, and that must not take the benchmark down with it. ``RSS +MB`` is
the growth of the process's resident memory over each load (anonymous memory in brackets; the rest is
mapped GGUF pages).

Every repetition runs every measurement for every subject, interleaved (and the subject order rotates
each repetition), so machine drift hits them all alike; ``--warmup`` repetitions are run first and
dropped. Tables show the median and the best (min time) with the spread (max - min) / median of the
times; the JSON holds every sample. During each sample the CPU time of OTHER processes (from
``/proc/stat`` minus our own) is recorded, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from benchmarks.llama_load import extra_buffer_types

TANDEM_FORMATS = ("auto", "f32", "bf16", "bf16-packed", "int8", "int4", "auto-int4", "qdot")
DEFAULT_FORMATS = ("auto", "bf16-packed", "int8")
DEFAULT_WIDTHS = (1, 2, 4, 8, 16)

# A code-review request: realistic text for a coder model; repeated when a longer prompt is asked for.
PROMPT_BODY = '''Review the following Python module. Rewrite it with type hints, docstrings and clear error
handling, then add unit tests with pytest. Explain each change briefly.

```python
import json, os

def load(path):
    if not os.path.exists(path):
        return None
    f = open(path)
    data = json.load(f)
    f.close()
    return data

def merge(a, b):
    out = {}
    for k in a: out[k] = a[k]
    for k in b:
        if k in out and type(out[k]) == dict and type(b[k]) == dict:
            out[k] = merge(out[k], b[k])
        else:
            out[k] = b[k]
    return out

def save(path, data):
    f = open(path, "w")
    f.write(json.dumps(data, indent=2))
    f.close()
```
'''


# ================================================================================================
# small measurement helpers
# ================================================================================================
def _clock() -> float:
    return time.perf_counter()


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float
    busy: float  # CPU-seconds spent by everything on the machine (user+nice+system+irq+softirq)
    steal: float  # CPU-seconds stolen by the hypervisor
    own: float  # CPU-seconds of this process (all threads, llama.cpp's included)

    @staticmethod
    def take() -> "CpuSnapshot":
        busy = steal = 0.0
        try:
            with open("/proc/stat") as fh:
                parts = fh.readline().split()
            hz = os.sysconf("SC_CLK_TCK")
            v = [int(x) for x in parts[1:]]
            busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz
            steal = (v[7] if len(v) > 7 else 0) / hz
        except (OSError, ValueError, IndexError):
            pass
        t = os.times()
        return CpuSnapshot(_clock(), busy, steal, t.user + t.system)

    def foreign_since(self, start: "CpuSnapshot") -> tuple[float, float]:
        """(cores used by other processes, cores stolen) between ``start`` and this snapshot."""
        dt = self.wall - start.wall
        if dt <= 0:
            return 0.0, 0.0
        foreign = max(0.0, (self.busy - start.busy) - (self.own - start.own)) / dt
        return foreign, max(0.0, self.steal - start.steal) / dt


def _median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


@dataclass
class Sample:
    """One timed measurement: ``seconds`` for ``count`` units (tokens or forwards)."""

    seconds: float
    count: int
    rep: int
    foreign_cores: float = 0.0
    steal_cores: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.count / self.seconds if self.seconds > 0 and self.count > 0 else None


@dataclass
class Series:
    """Samples of one measurement of one subject, with rates (count/second) and times summarised."""

    unit: str  # what count counts: 'tokens' | 'forwards' | 'passes'
    samples: list[Sample] = field(default_factory=list)

    def rates(self) -> list[float]:
        return [r for r in (s.rate for s in self.samples) if r is not None]

    def times(self) -> list[float]:
        return [s.seconds for s in self.samples]

    def summary(self) -> dict[str, Any]:
        rates, times = self.rates(), self.times()
        med_t = _median(times)
        return {
            "n": len(self.samples),
            "rate_median": _median(rates),
            "rate_best": max(rates) if rates else None,
            "rate_worst": min(rates) if rates else None,
            "seconds_median": med_t,
            "seconds_min": min(times) if times else None,
            "spread": _div(max(times) - min(times), med_t) if times else None,
            "foreign_cores_median": _median([s.foreign_cores for s in self.samples]),
        }


@dataclass
class Bandwidth:
    """Read bandwidth in GB/s (1e9 bytes), per repetition: best of a few passes each."""

    buffer_bytes: int
    mv_gbs: list[float] = field(default_factory=list)
    sum_gbs: list[float] = field(default_factory=list)
    stream_gbs: list[float] = field(default_factory=list)  # empty where the native probe did not build

    @property
    def gbs(self) -> float | None:
        """The bandwidth the bound uses: median over repetitions of the fastest probe's best pass."""
        return _median([max(x) for x in zip(*(s for s in (self.mv_gbs, self.sum_gbs, self.stream_gbs) if s))])


class BandwidthProbe:
    """Holds one large f32 buffer and measures how fast the current threads can stream it."""

    def __init__(self, nbytes: int, passes: int = 5):
        cols = 4096
        rows = max(1, nbytes // (4 * cols))
        self.a = torch.empty(rows, cols, dtype=torch.float32)
        self.a.fill_(1.0)  # touch every page now
        self.x = torch.ones(cols, dtype=torch.float32)
        self.passes = passes
        self.nbytes = self.a.numel() * 4
        from engine.ops.kernels import load_block_ops

        ops = load_block_ops()
        self._stream = getattr(ops, "read_stream", None) if ops is not None else None

    def _best(self, fn) -> float:
        best = math.inf
        for _ in range(self.passes):
            t0 = _clock()
            fn()
            best = min(best, _clock() - t0)
        return self.nbytes / best / 1e9

    def measure(self) -> tuple[float, float, float | None]:
        """(GEMV, sum, native stream) GB/s, each the best of ``passes``; stream None without the kernel."""
        mv = self._best(lambda: torch.mv(self.a, self.x))
        sm = self._best(lambda: self.a.sum())
        raw = self.a.view(-1).view(torch.uint8)
        st = self._best(lambda: self._stream(raw)) if self._stream is not None else None
        return mv, sm, st


# ================================================================================================
# subjects: what is measured
# ================================================================================================
@dataclass
class DecodeOutput:
    tokens: list[int]  # generated ids that are known (llama.cpp: all but the last)
    count: int  # tokens generated
    seconds: float  # time of the decode part (after the first token)
    extra: dict[str, Any] = field(default_factory=dict)


class Subject(Protocol):
    """One engine as loaded for the benchmark (tandem in one weight format, or llama.cpp)."""

    label: str
    kind: str  # 'tandem' | 'llama.cpp'
    format: str
    load_seconds: float
    bytes_per_token: int  # weight bytes a decode step reads (the bandwidth bound's numerator)
    bytes_detail: dict[str, int]

    def prefill(self, ids: list[int]) -> float: ...

    def decode_e2e(self, ids: list[int], n: int) -> DecodeOutput: ...

    def decode_forward(self, ids: list[int], feed: list[int]) -> float: ...

    def width_forward(self, ids: list[int], feed: list[int]) -> float: ...

    def linears_only(self) -> float | None: ...

    def close(self) -> None: ...


def top_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every engine Linear of a model that is not part of another one, in registration (= call) order."""
    from engine.ops.linear import Linear

    out: list[torch.nn.Module] = []
    inside: set[str] = set()
    for name, mod in model.named_modules():
        if isinstance(mod, Linear):
            if any(name.startswith(p + ".") for p in inside):
                continue
            inside.add(name)
            out.append(mod)
    return out


def tandem_bytes_per_token(model) -> tuple[int, int]:
    """(weight bytes of every linear, bytes of one embedding row as stored) for one decode step."""
    from engine.ops import dequant as dq

    lin = sum(m.weight_nbytes() for m in top_linears(model))
    emb = model.embed
    return lin, dq.row_bytes(emb.ggml_type, emb.embedding_dim)


def gguf_bytes_per_token(path: str) -> tuple[int, int]:
    """(bytes of the GGUF's 2-D tensors a decode step reads as stored, one embedding row)."""
    from engine.contract.gguf import GGUFFile

    with GGUFFile(path) as f:
        tied = "output.weight" not in f.tensors
        total = row = 0
        for name, t in f.tensors.items():
            if len(t.dims) != 2:
                continue
            if name == "token_embd.weight":
                row = t.n_bytes // t.dims[1]
                if not tied:
                    continue
            total += t.n_bytes
        return total, row


class TandemSubject:
    kind = "tandem"

    def __init__(self, path: str, fmt: str, n_ctx: int, threads: int):
        from engine.contract.protocol import LoadSpec
        from engine.runtime import ModelRuntime

        self.requested = fmt
        t0 = _clock()
        self.engine = ModelRuntime.load(LoadSpec(model_path=path, num_ctx=n_ctx, num_thread=threads, device="cpu",
                                           weight_format=fmt))
        self.load_seconds = _clock() - t0
        self.model = self.engine.target
        self.format = self.model.fmt
        self.label = f"tandem {self.format}"
        self.cache = self.model.new_cache(n_ctx)  # the bench's own cache; the engine keeps its own
        self.linears = top_linears(self.model)
        self._lin_inputs = [torch.randn(1, m.in_features).to(m.compute_dtype) for m in self.linears]
        lin, row = tandem_bytes_per_token(self.model)
        self.bytes_per_token = lin + row
        self.bytes_detail = {"linear_weights": lin, "embedding_row": row}

    def prefill(self, ids: list[int]) -> float:
        self.cache.truncate(0)
        t0 = _clock()
        self.model.forward(ids, self.cache, logits_for="last")
        return _clock() - t0

    def decode_e2e(self, ids: list[int], n: int) -> DecodeOutput:
        from engine.contract.options import Options
        from engine.contract.protocol import GenerateRequest, GenerateResult

        # num_ctx: the whole cache, as before options had a 4096 default.
        req = GenerateRequest(prompt="", raw_tokens=list(ids), add_bos=False,
                              options=Options(temperature=0.0, num_predict=n, seed=0, drafter="none",
                                              num_ctx=self.engine.cache.capacity))
        result = None
        for item in self.engine.generate(req):
            if isinstance(item, GenerateResult):
                result = item
        assert result is not None
        toks = result.context[len(ids):]
        secs = result.eval_duration_ns / 1e9
        b = self.engine.last_breakdown
        steps = max(1, len(toks) - 1)
        extra = {"eval_count": result.eval_count, "done_reason": result.done_reason}
        if b is not None:
            other = max(0.0, secs - b.verify - b.accept - b.drafting)
            extra["ms_per_token"] = {"forward": b.verify * 1e3 / steps, "sampling": b.accept * 1e3 / steps,
                                     "other": other * 1e3 / steps}
        return DecodeOutput(toks, len(toks), secs, extra)

    def decode_forward(self, ids: list[int], feed: list[int]) -> float:
        self.cache.truncate(len(ids))
        t0 = _clock()
        for t in feed:
            self.model.forward([t], self.cache, logits_for="last")
        dt = _clock() - t0
        self.cache.truncate(len(ids))
        return dt

    def width_forward(self, ids: list[int], feed: list[int]) -> float:
        self.cache.truncate(len(ids))
        t0 = _clock()
        self.model.forward(feed, self.cache, logits_for="all")
        dt = _clock() - t0
        self.cache.truncate(len(ids))
        return dt

    @torch.no_grad()
    def linears_only(self) -> float:
        t0 = _clock()
        for m, x in zip(self.linears, self._lin_inputs):
            m(x)
        return _clock() - t0

    def close(self) -> None:
        self.engine.close()


class LlamaCppSubject:
    kind = "llama.cpp"
    requested = format = "gguf"

    def __init__(self, llama_cpp_module, path: str, n_ctx: int, threads: int, n_batch: int, extra_bufts: bool = True):
        self.lc = llama_cpp_module
        t0 = _clock()
        with extra_buffer_types(llama_cpp_module, extra_bufts):
            self.llm = llama_cpp_module.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                                              n_threads_batch=threads, n_batch=n_batch, seed=0, verbose=False)
        self.load_seconds = _clock() - t0
        self.label = "llama.cpp"
        lin, row = gguf_bytes_per_token(path)
        self.bytes_per_token = lin + row
        self.bytes_detail = {"gguf_2d_tensors": lin, "embedding_row": row}

    def _sync(self) -> None:
        sync = getattr(self.lc, "llama_synchronize", None)
        if sync is not None:
            sync(self.llm._ctx.ctx)

    def _truncate(self, n: int) -> None:
        self.llm.n_tokens = n
        self.llm._ctx.kv_cache_seq_rm(-1, n, -1)

    def prefill(self, ids: list[int]) -> float:
        self.llm.reset()
        t0 = _clock()
        self.llm.eval(ids)
        self._sync()
        return _clock() - t0

    def _perf(self) -> dict[str, float] | None:
        fn = getattr(self.lc, "llama_perf_context", None)
        if fn is None:
            return None
        d = fn(self.llm._ctx.ctx)
        return {"t_eval_ms": d.t_eval_ms, "n_eval": d.n_eval, "t_p_eval_ms": d.t_p_eval_ms, "n_p_eval": d.n_p_eval}

    def decode_e2e(self, ids: list[int], n: int) -> DecodeOutput:
        llm = self.llm
        # The prompt must already be evaluated (as the engine's prefix cache has it for tandem):
        # create_completion then samples the first token from the live logits without a forward.
        if llm.n_tokens != len(ids) or list(llm.input_ids[:len(ids)]) != list(ids) or llm._requires_eval:
            llm.reset()
            llm.eval(ids)
        reset = getattr(self.lc, "llama_perf_context_reset", None)
        if reset is not None:
            reset(llm._ctx.ctx)
        t0 = _clock()
        out = llm.create_completion(prompt=list(ids), max_tokens=n, temperature=0.0, top_k=40, top_p=1.0,
                                    min_p=0.0, repeat_penalty=1.0, seed=0, stream=False)
        dt = _clock() - t0
        count = int(out["usage"]["completion_tokens"])
        toks = [int(t) for t in llm.input_ids[len(ids):llm.n_tokens]]
        # The last generated token is sampled but never evaluated, so it is not in input_ids.
        extra: dict[str, Any] = {"eval_count": count, "done_reason": out["choices"][0].get("finish_reason")}
        perf = self._perf()
        if perf and perf["n_eval"] > 0:
            extra["perf_eval_tok_s"] = perf["n_eval"] / (perf["t_eval_ms"] / 1e3) if perf["t_eval_ms"] > 0 else None
            extra["perf"] = perf
        return DecodeOutput(toks[:count], count, dt, extra)

    def decode_forward(self, ids: list[int], feed: list[int]) -> float:
        self._truncate(len(ids))
        t0 = _clock()
        for t in feed:
            self.llm.eval([t])
        self._sync()
        dt = _clock() - t0
        self._truncate(len(ids))
        return dt

    def width_forward(self, ids: list[int], feed: list[int]) -> float:
        self._truncate(len(ids))
        self.llm._batch.set_batch(feed, n_past=len(ids), logits_all=True)
        t0 = _clock()
        self.llm._ctx.decode(self.llm._batch)
        self._sync()
        dt = _clock() - t0
        self._truncate(len(ids))
        return dt

    def linears_only(self) -> None:
        return None

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()


_LLAMA_PROBE = """
import sys
import llama_cpp
from benchmarks.llama_load import extra_buffer_types
with extra_buffer_types(llama_cpp, sys.argv[3] == "1"):
    llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]),
                          n_threads_batch=int(sys.argv[2]), verbose=False)
ids = [i % llm.n_vocab() for i in range(1, 17)]
llm.eval(ids)       # a batch (prefill / verification kernels)
llm.eval(ids[:1])   # one token (decode kernels)
print("ok")
"""


def probe_llama_cpp(path: str, threads: int, timeout: float = 600.0, extra_bufts: bool = True) -> str | None:
    """Run llama.cpp on the model in a child process first: a build that uses instructions this CPU lacks
    dies with SIGILL, which would take the whole benchmark down. None if it works, else why not."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        cp = subprocess.run([sys.executable, "-c", _LLAMA_PROBE, path, str(threads), "1" if extra_bufts else "0"],
                            env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"a probe run (load + 17 tokens) took over {timeout:.0f} s"
    if cp.returncode == 0 and "ok" in cp.stdout:
        return None
    if cp.returncode < 0:
        sig = signal.Signals(-cp.returncode).name
        hint = " (the llama.cpp build uses CPU instructions this machine lacks)" if sig == "SIGILL" else ""
        return f"a probe run on this model was killed by {sig}{hint}"
    tail = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or ["?"]
    return f"a probe run on this model failed (exit {cp.returncode}: {tail[0][:200]})"


# ================================================================================================
# results
# ================================================================================================
@dataclass
class SubjectResult:
    label: str
    kind: str
    requested_format: str
    format: str
    load_seconds: float
    rss_delta_mb: dict[str, float]  # growth of VmRSS / RssAnon / RssFile over the load, MB
    bytes_per_token: int
    bytes_detail: dict[str, int]
    prefill: Series = field(default_factory=lambda: Series("tokens"))
    decode_e2e: Series = field(default_factory=lambda: Series("tokens"))
    decode_forward: Series = field(default_factory=lambda: Series("forwards"))
    width: dict[int, Series] = field(default_factory=dict)
    linears_w1: Series = field(default_factory=lambda: Series("passes"))
    e2e_extra: list[dict[str, Any]] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)

    def width_ms(self) -> dict[int, dict[str, float | None]]:
        out = {}
        for w, s in self.width.items():
            t = s.times()
            out[w] = {"median": _median(t) * 1e3 if t else None, "min": min(t) * 1e3 if t else None}
        return out

    def width_ratios(self) -> dict[int, dict[str, float | None]]:
        """Cost of one forward of width w relative to width 1: ratio of the medians and of the minima."""
        ms = self.width_ms()
        base = ms.get(1)
        if not base:
            return {}
        return {w: {"median": _div(v["median"], base["median"]), "min": _div(v["min"], base["min"])}
                for w, v in ms.items()}


@dataclass
class Report:
    started: str
    finished: str
    command: str
    model: str
    model_bytes: int
    settings: dict[str, Any]
    environment: dict[str, Any]
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float]
    bandwidth: Bandwidth
    prompt_tokens: int
    results: list[SubjectResult]
    llama_cpp: dict[str, Any]
    repetitions: list[dict[str, Any]] = field(default_factory=list)

    def bound(self, r: SubjectResult) -> dict[str, Any]:
        bw = self.bandwidth.gbs
        ceiling = _div(bw * 1e9 if bw else None, r.bytes_per_token)
        fwd = r.decode_forward.summary()["rate_median"]
        e2e = r.decode_e2e.summary()["rate_median"]
        return {"bandwidth_gbs": bw, "bytes_per_token": r.bytes_per_token, "ceiling_tok_s": ceiling,
                "fraction_forward": _div(fwd, ceiling), "fraction_e2e": _div(e2e, ceiling)}

    def overhead(self, r: SubjectResult) -> dict[str, Any] | None:
        """Forward-only step time vs the linears alone at width 1 (medians, ms)."""
        step = _median([x.seconds / x.count for x in r.decode_forward.samples if x.count])
        lin = r.linears_w1.summary()["seconds_median"]
        if step is None or lin is None:
            return None
        e2e = r.decode_e2e.summary()["rate_median"]
        return {"step_ms": step * 1e3, "linears_ms": lin * 1e3, "outside_linears_ms": (step - lin) * 1e3,
                "e2e_step_ms": 1e3 / e2e if e2e else None,
                "request_path_ms": (1e3 / e2e - step * 1e3) if e2e else None}

    def vs_llama(self) -> dict[str, dict[str, Any]]:
        """tandem / llama.cpp per format: ratio of medians, and the median of same-repetition ratios."""
        ref = next((r for r in self.results if r.kind == "llama.cpp"), None)
        if ref is None:
            return {}
        out = {}
        for r in self.results:
            if r.kind != "tandem":
                continue
            row = {}
            for name in ("prefill", "decode_e2e", "decode_forward"):
                mine, theirs = getattr(r, name), getattr(ref, name)
                per_rep = []
                for rep in sorted({s.rep for s in mine.samples}):
                    a = _median([s.rate for s in mine.samples if s.rep == rep and s.rate])
                    b = _median([s.rate for s in theirs.samples if s.rep == rep and s.rate])
                    if _div(a, b) is not None:
                        per_rep.append(a / b)
                row[name] = {"ratio": _div(mine.summary()["rate_median"], theirs.summary()["rate_median"]),
                             "same_rep_median": _median(per_rep),
                             "same_rep_min": min(per_rep) if per_rep else None,
                             "same_rep_max": max(per_rep) if per_rep else None}
            n = min(len(r.generated), len(ref.generated))
            agree = next((i for i in range(n) if r.generated[i] != ref.generated[i]), n)
            row["greedy_tokens_agree"] = {"common_prefix": agree, "of": n}
            out[r.label] = row
        return out

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.results:
            d = {k: v for k, v in asdict(r).items() if k not in ("prefill", "decode_e2e", "decode_forward",
                                                                  "width", "linears_w1")}
            for name in ("prefill", "decode_e2e", "decode_forward", "linears_w1"):
                s: Series = getattr(r, name)
                d[name] = {"unit": s.unit, "summary": s.summary(), "samples": [asdict(x) for x in s.samples]}
            d["width"] = {str(w): {"samples": [asdict(x) for x in s.samples]} for w, s in r.width.items()}
            d["width_ms"] = {str(w): v for w, v in r.width_ms().items()}
            d["width_ratio"] = {str(w): v for w, v in r.width_ratios().items()}
            d["bound"] = self.bound(r)
            d["overhead"] = self.overhead(r)
            rows.append(d)
        return {
            "started": self.started, "finished": self.finished, "command": self.command, "model": self.model,
            "model_bytes": self.model_bytes, "settings": self.settings, "environment": self.environment,
            "loadavg_start": list(self.loadavg_start), "loadavg_end": list(self.loadavg_end),
            "bandwidth": {"buffer_bytes": self.bandwidth.buffer_bytes, "gemv_gbs": self.bandwidth.mv_gbs,
                          "sum_gbs": self.bandwidth.sum_gbs, "stream_gbs": self.bandwidth.stream_gbs,
                          "used_gbs": self.bandwidth.gbs},
            "prompt_tokens": self.prompt_tokens, "llama_cpp": self.llama_cpp,
            "repetitions": self.repetitions, "results": rows, "vs_llama_cpp": self.vs_llama(),
        }

    # ------------------------------------------------------------------------------------------
    def markdown(self) -> str:
        def f(x, fmt="{:.2f}"):
            return "–" if x is None else fmt.format(x)

        env = self.environment
        s = self.settings
        bw = self.bandwidth
        lines = [
            f"# tandem engine benchmark: {os.path.basename(self.model)}",
            "",
            f"- command: `{self.command}`",
            f"- started {self.started}, finished {self.finished}; load average (1/5/15 min) at start "
            f"{'/'.join(f'{x:.2f}' for x in self.loadavg_start)}, at end {'/'.join(f'{x:.2f}' for x in self.loadavg_end)}",
            f"- CPU: {env['cpu_model']} ({env['logical_cpus']} logical); AVX2 {env['avx2']}, qdot path "
            f"{env['qdot_isa'] or 'not built'}, AVX-512 {env['avx512']}, VNNI "
            f"{env['avx512_vnni']}, AVX512_BF16 {env['avx512_bf16']}, AMX {env['amx']}; torch {env['torch']} "
            f"({env['torch_cpu_capability']}), {s['threads']} threads",
            f"- llama.cpp: {self.llama_cpp.get('status')}",
            f"- prompt {self.prompt_tokens} tokens, decode {s['tokens']} tokens greedy; {s['reps']} repetitions after "
            f"{s['warmup']} warm-up, subjects interleaved; width forwards x{s['width_inner']} per repetition",
            f"- read bandwidth ({bw.buffer_bytes / 2**20:.0f} MiB buffer, best of 5 per repetition): GEMV "
            f"{', '.join(f'{x:.1f}' for x in bw.mv_gbs)} GB/s, sum {', '.join(f'{x:.1f}' for x in bw.sum_gbs)} GB/s, "
            f"native stream {', '.join(f'{x:.1f}' for x in bw.stream_gbs) or 'not built'} GB/s; "
            f"the bound uses the fastest probe's median {f(bw.gbs, '{:.1f}')} GB/s (a subject above 100 % of it "
            "is flagged: the probe, not the subject, is wrong then)",
            "",
            "## Speed",
            "",
            "Rates are median (best) tokens/s; spread = (max - min) / median of the times; "
            "bound = read bandwidth / bytes per token. Load: tandem packs its kernel layout from the GGUF here "
            "(no pack cache, which lives beside a server's store; `python -m benchmarks.load` measures the "
            "server's warm load from it), llama.cpp maps the file.",
            "",
            "| subject | load s | MB/token | prefill tok/s | decode tok/s (end to end) | decode tok/s (forward only) "
            "| spread e2e / fwd | bound tok/s | % of bound (fwd) | RSS +MB (anon) | other procs / steal (cores) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.results:
            p, e, d = r.prefill.summary(), r.decode_e2e.summary(), r.decode_forward.summary()
            b = self.bound(r)
            timed = [x for ser in (r.prefill, r.decode_e2e, r.decode_forward) for x in ser.samples]
            foreign = _median([x.foreign_cores for x in timed])
            steal = _median([x.steal_cores for x in timed])
            rss = r.rss_delta_mb
            lines.append(
                f"| {r.label} | {r.load_seconds:.1f} | {r.bytes_per_token / 1e6:.1f} | "
                f"{f(p['rate_median'], '{:.1f}')} ({f(p['rate_best'], '{:.1f}')}) | "
                f"{f(e['rate_median'])} ({f(e['rate_best'])}) | {f(d['rate_median'])} ({f(d['rate_best'])}) | "
                f"{f(e['spread'], '{:.0%}')} / {f(d['spread'], '{:.0%}')} | {f(b['ceiling_tok_s'], '{:.1f}')} | "
                f"{f(b['fraction_forward'], '{:.0%}')}{' (above the bound: probe error)' if (b['fraction_forward'] or 0) > 1 else ''} | {f(rss.get('VmRSS'), '{:.0f}')} "
                f"({f(rss.get('RssAnon'), '{:.0f}')}) | {f(foreign)} / {f(steal)} |")
        widths = sorted({w for r in self.results for w in r.width})
        lines += ["", "## Cost of one forward by width (after the prompt, logits for every position)", "",
                  "| subject | w=1 ms (median / min) | " + " | ".join(f"w={w} / w=1" for w in widths[1:]) + " |",
                  "|---|---:|" + "---:|" * (len(widths) - 1)]
        for r in self.results:
            ms, ratio = r.width_ms(), r.width_ratios()
            if not ms:
                continue
            cells = [f"{f(ratio.get(w, {}).get('median'))} ({f(ratio.get(w, {}).get('min'))})" for w in widths[1:]]
            lines.append(f"| {r.label} | {f(ms[1]['median'], '{:.1f}')} / {f(ms[1]['min'], '{:.1f}')} | "
                         + " | ".join(cells) + " |")
        lines += ["", "Ratios: median time at width w / median at width 1 (in brackets: min / min)."]
        overheads = [(r, self.overhead(r)) for r in self.results]
        overheads = [(r, o) for r, o in overheads if o]
        if overheads:
            lines += ["", "## Where a tandem decode step goes (medians, ms per token)", "",
                      "| subject | forward step | linears only (w=1) | outside the linears | end-to-end step "
                      "| request path (sampling, text, bookkeeping) | e2e split: forward / sampling / other |",
                      "|---|---:|---:|---:|---:|---:|---|"]
            for r, o in overheads:
                split = [x.get("ms_per_token") for x in r.e2e_extra if x.get("ms_per_token")]
                sp = "–"
                if split:
                    sp = " / ".join(f"{_median([x[k] for x in split]):.1f}" for k in ("forward", "sampling", "other"))
                lines.append(f"| {r.label} | {o['step_ms']:.1f} | {o['linears_ms']:.1f} | "
                             f"{o['outside_linears_ms']:.1f} | {f(o['e2e_step_ms'], '{:.1f}')} | "
                             f"{f(o['request_path_ms'], '{:.1f}')} | {sp} |")
        vs = self.vs_llama()
        if vs:
            lines += ["", "## tandem / llama.cpp (same run)", "",
                      "| tandem format | prefill | decode (end to end) | decode (forward only) | greedy tokens equal |",
                      "|---|---:|---:|---:|---:|"]
            for label, row in vs.items():
                def cell(k):
                    c = row[k]
                    rng = ""
                    if c["same_rep_min"] is not None:
                        rng = f" ({c['same_rep_min']:.2f}–{c['same_rep_max']:.2f})"
                    return f"{f(c['ratio'])}x{rng}"
                g = row["greedy_tokens_agree"]
                lines.append(f"| {label} | {cell('prefill')} | {cell('decode_e2e')} | {cell('decode_forward')} | "
                             f"{g['common_prefix']}/{g['of']} |")
            lines += ["", "Ratio of the median rates; in brackets the range of the same-repetition ratios. "
                          "'greedy tokens equal': length of the common prefix of the two greedy outputs."]
        return "\n".join(lines)


# ================================================================================================
# the run
# ================================================================================================
def cpu_info() -> dict[str, Any]:
    from engine.ops.kernels import cpu_flags, qdot_status
    from engine.ops.linear import cpu_has_amx

    flags = cpu_flags()
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    model = model or platform.processor() or "?"

    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": any(x.startswith("amx") for x in flags),
        "amx_flags": sorted(x for x in flags if x.startswith("amx")),
        "oneDNN_amx_usable": cpu_has_amx(),
        "qdot_isa": qdot_status().isa,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _rss_mb() -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of this process in MB (empty where /proc is missing)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def _rss_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if k in before}


def _warm_page_cache(path: str) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def build_prompt(tokenizer, n: int) -> list[int]:
    """Exactly ``n`` prompt ids: a ChatML user turn around the code-review text when the vocabulary has
    ChatML, else the bare text (with BOS when the model wants one). Repeats the text if needed."""
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    if tokenizer.token_id("<|im_start|>") is not None and tokenizer.token_id("<|im_end|>") is not None:
        head = tokenizer.encode("<|im_start|>user\n", add_bos=False)
        tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_bos=False)
    else:
        head, tail = [], []
    room = n - len(bos) - len(head) - len(tail)
    if room < 1:
        raise ValueError(f"--prefill {n} is too short for the prompt frame ({n - room} tokens)")
    body: list[int] = []
    while len(body) < room:
        body += tokenizer.encode(PROMPT_BODY, add_bos=False)
    return bos + head + body[:room] + tail


def _rotate(xs: list, k: int) -> list:
    k %= max(1, len(xs))
    return xs[k:] + xs[:k]


@dataclass(frozen=True)
class Settings:
    model: str
    formats: tuple[str, ...]
    prefill: int
    tokens: int
    reps: int
    warmup: int
    widths: tuple[int, ...]
    width_inner: int
    threads: int
    bw_mib: int
    llama: bool
    settle_s: float
    quiet_wait_s: float = 0.0
    quiet_threshold: float = 0.25
    skipped_formats: dict[str, str] = field(default_factory=dict)  # asked for, but this CPU cannot run them


def wait_quiet(max_wait: float, threshold: float, window: float = 0.25) -> tuple[float, float]:
    """Wait (up to ``max_wait`` s) until other processes use less than ``threshold`` cores over a window.
    Returns (seconds waited, foreign cores in the last window)."""
    t0 = _clock()
    foreign = 0.0
    while True:
        a = CpuSnapshot.take()
        time.sleep(window)
        foreign, _ = CpuSnapshot.take().foreign_since(a)
        if foreign < threshold or _clock() - t0 >= max_wait:
            return _clock() - t0, foreign


def _feed(prompt: list[int], generated: Sequence[int], n: int) -> list[int]:
    """n token ids to feed after the prompt: the greedy output where known, else prompt ids."""
    src = list(generated) + prompt
    return (src * (n // max(1, len(src)) + 1))[:n]


def run(settings: Settings, command: str, log: Callable[[str], None]) -> Report:
    """The whole measurement on the process's compute thread (engine.batching.compute), where the engine runs its
    forwards: tandem's and llama.cpp's parallel work then share one OpenMP team, as each would alone."""
    from engine.batching.compute import ComputeThread

    return ComputeThread.shared().run(lambda: _run(settings, command, log))


def _run(settings: Settings, command: str, log: Callable[[str], None]) -> Report:
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    torch.set_num_threads(settings.threads)
    path = settings.model
    n_ctx = settings.prefill + max(settings.tokens, max(settings.widths)) + 64

    # --- llama.cpp availability
    llama_info: dict[str, Any]
    llama_mod = None
    if not settings.llama:
        llama_info = {"status": "skipped (--no-llama)"}
    else:
        try:
            import llama_cpp as llama_mod  # noqa: F811
            llama_info = {"status": f"llama-cpp-python {getattr(llama_mod, '__version__', '?')}, "
                                    f"n_threads={settings.threads}",
                          "version": getattr(llama_mod, "__version__", None)}
            try:
                llama_info["system_info"] = llama_mod.llama_print_system_info().decode(errors="replace").strip()
            except Exception:  # noqa: BLE001 - informational only
                pass
        except Exception as e:  # noqa: BLE001 - any import failure means: no comparison
            llama_mod = None
            llama_info = {"status": f"not importable ({type(e).__name__}: {e}); comparison skipped"}
        if llama_mod is not None:
            llama_info["module"] = getattr(llama_mod, "__file__", None)
            problem = probe_llama_cpp(path, settings.threads)
            if problem is not None and probe_llama_cpp(path, settings.threads, extra_bufts=False) is None:
                # llama-cpp-python 0.3.36 built natively on an AMX host repacks the weights for AMX at load
                # and dies with SIGSEGV at the first evaluation; without the extra buffer types it runs its
                # AVX-512 kernels, which is what such a user can run.
                llama_info["extra_bufts"] = False
                llama_info["status"] += (f"; extra buffer types (AMX / CPU repacking) off: with them {problem}")
                problem = None
            if problem is not None:
                llama_mod = None
                llama_info["status"] = (f"llama-cpp-python {llama_info.get('version')} is importable, but {problem}; "
                                        "comparison skipped")
    log(f"llama.cpp: {llama_info['status']}")

    # --- formats: resolve 'auto' and drop duplicates
    from engine.contract.gguf import GGUFFile
    from engine.models.loader import default_format

    with GGUFFile(path) as f:
        resolved = []
        for fmt in settings.formats:
            r = default_format(f, torch.device("cpu"), "target") if fmt == "auto" else fmt
            if r in [x for _, x in resolved]:
                log(f"format {fmt} resolves to {r}, already measured: skipped")
                continue
            resolved.append((fmt, r))

    _warm_page_cache(path)
    subjects: list[Subject] = []
    tokenizer = None
    results: dict[str, SubjectResult] = {}
    try:
        for fmt, r in resolved:
            gc.collect()
            before = _rss_mb()
            log(f"loading tandem {fmt} ({r}) ...")
            s = TandemSubject(path, fmt, n_ctx, settings.threads)
            after = _rss_mb()
            tokenizer = tokenizer or s.engine.tokenizer
            subjects.append(s)
            log(f"  {s.label}: {s.load_seconds:.1f} s, {s.bytes_per_token / 1e6:.0f} MB read per token")
            results[s.label] = SubjectResult(s.label, s.kind, fmt, s.format, s.load_seconds,
                                             _rss_delta(before, after),
                                             s.bytes_per_token, s.bytes_detail)
        if llama_mod is not None:
            before = _rss_mb()
            log("loading llama.cpp ...")
            s = LlamaCppSubject(llama_mod, path, n_ctx, settings.threads, max(512, settings.prefill),
                                llama_info.get("extra_bufts", True))
            after = _rss_mb()
            subjects.append(s)
            log(f"  llama.cpp: {s.load_seconds:.1f} s")
            results[s.label] = SubjectResult(s.label, s.kind, "gguf", "gguf (as stored)", s.load_seconds,
                                             _rss_delta(before, after),
                                             s.bytes_per_token, s.bytes_detail)
        if not subjects:
            raise ValueError("nothing to measure")

        prompt = build_prompt(tokenizer, settings.prefill)
        probe = BandwidthProbe(settings.bw_mib << 20)
        bandwidth = Bandwidth(probe.nbytes)

        def timed(fn: Callable[[], Any]) -> tuple[Any, float, float, float]:
            time.sleep(settings.settle_s)  # let the other thread pool's spinning workers go idle
            a = CpuSnapshot.take()
            out = fn()
            b = CpuSnapshot.take()
            foreign, steal = b.foreign_since(a)
            return out, b.wall - a.wall, foreign, steal

        total = settings.warmup + settings.reps
        rep_log: list[dict[str, Any]] = []
        for rep in range(total):
            keep = rep >= settings.warmup
            tag = f"rep {rep + 1 - settings.warmup}/{settings.reps}" if keep else f"warm-up {rep + 1}/{settings.warmup}"
            order = _rotate(subjects, rep)
            waited, quiet = (wait_quiet(settings.quiet_wait_s, settings.quiet_threshold)
                             if settings.quiet_wait_s > 0 else (0.0, None))
            mv, sm, st = probe.measure()
            rep_log.append({"rep": rep, "measured": keep, "order": [s.label for s in order],
                            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "loadavg": list(os.getloadavg()), "quiet_wait_s": waited,
                            "foreign_cores_before": quiet, "gemv_gbs": mv, "sum_gbs": sm, "stream_gbs": st})
            if keep:
                bandwidth.mv_gbs.append(mv)
                bandwidth.sum_gbs.append(sm)
                if st is not None:
                    bandwidth.stream_gbs.append(st)

            for s in order:  # prefill
                secs, _, fo, st = timed(lambda: s.prefill(prompt))
                if keep:
                    results[s.label].prefill.samples.append(Sample(secs, len(prompt), rep, fo, st))
            for s in order:  # end-to-end decode
                out, _, fo, st = timed(lambda: s.decode_e2e(prompt, settings.tokens))
                res = results[s.label]
                res.generated = out.tokens
                if keep:
                    res.decode_e2e.samples.append(Sample(out.seconds, max(0, out.count - 1), rep, fo, st))
                    res.e2e_extra.append(out.extra)
            for s in order:  # forward-only decode
                feed = _feed(prompt, results[s.label].generated, settings.tokens)
                secs, _, fo, st = timed(lambda: s.decode_forward(prompt, feed))
                if keep:
                    results[s.label].decode_forward.samples.append(Sample(secs, len(feed), rep, fo, st))
            for _ in range(settings.width_inner):  # width costs, widths and subjects interleaved
                for w in settings.widths:
                    for s in order:
                        feed = _feed(prompt, results[s.label].generated, w)
                        secs, _, fo, st = timed(lambda: s.width_forward(prompt, feed))
                        if keep:
                            results[s.label].width.setdefault(w, Series("forwards")).samples.append(
                                Sample(secs, 1, rep, fo, st))
            for s in order:  # linears only
                if s.kind != "tandem":
                    continue
                secs, _, fo, st = timed(s.linears_only)
                if keep:
                    results[s.label].linears_w1.samples.append(Sample(secs, 1, rep, fo, st))
            summary = ", ".join(
                f"{s.label}: {results[s.label].decode_e2e.samples[-1].rate or 0:.2f} tok/s" for s in subjects
            ) if keep else "dropped"
            log(f"{tag}: bandwidth {mv:.1f} GB/s; decode {summary}; load {os.getloadavg()[0]:.2f}"
                + (f"; waited {waited:.1f} s for a quiet machine" if waited > 0.3 else ""))
        del probe
    finally:
        for s in subjects:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    env = cpu_info()
    env["threads"] = torch.get_num_threads()
    env["interop_threads"] = torch.get_num_interop_threads()
    return Report(
        started=started,
        finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command,
        model=os.path.abspath(path),
        model_bytes=os.path.getsize(path),
        settings={**asdict(settings), "n_ctx": n_ctx},
        environment=env,
        loadavg_start=load_start,
        loadavg_end=os.getloadavg(),
        bandwidth=bandwidth,
        prompt_tokens=len(prompt),
        results=list(results.values()),
        llama_cpp=llama_info,
        repetitions=rep_log,
    )


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__.split("\n\n")[0],
                                 epilog="Measurements: see the module docstring (python -m pydoc benchmarks.decode).")
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                    help=f"comma-separated tandem weight formats, of {', '.join(TANDEM_FORMATS)} "
                         f"(default: {','.join(DEFAULT_FORMATS)}; 'auto' = the engine's default for the file)")
    ap.add_argument("--prefill", type=int, default=128, help="prompt length in tokens (default 128)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to decode (default 64)")
    ap.add_argument("--reps", type=int, default=3, help="measured repetitions (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="dropped warm-up repetitions (default 1)")
    ap.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="forward widths (default 1,2,4,8,16)")
    ap.add_argument("--width-inner", type=int, default=3, help="forwards per width per repetition (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both engines (default: all cores)")
    ap.add_argument("--bw-mib", type=int, default=1024, help="bandwidth probe buffer in MiB (default 1024)")
    ap.add_argument("--no-llama", action="store_true", help="do not measure llama.cpp even if it is installed")
    ap.add_argument("--settle", type=float, default=0.02, help="pause before each timed section, s (default 0.02)")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each repetition, wait up to this many seconds until other processes use less "
                         "than --quiet-threshold cores (default 0: do not wait)")
    ap.add_argument("--quiet-threshold", type=float, default=0.25, help="cores (default 0.25)")
    ap.add_argument("--json", help="write every number as JSON to this path")
    ap.add_argument("--markdown", help="also write the tables to this path")
    a = ap.parse_args(argv)
    formats = tuple(x.strip() for x in a.formats.split(",") if x.strip())
    bad = [x for x in formats if x not in TANDEM_FORMATS]
    if bad or not formats:
        ap.error(f"unknown format(s) {bad}; expected some of {', '.join(TANDEM_FORMATS)}")
    from engine.ops.linear import format_problem

    skipped = {x: problem for x in formats if x != "auto" and (problem := format_problem(x)) is not None}
    for x, problem in skipped.items():
        print(f"skipping format {x}: {problem}", file=sys.stderr)
    formats = tuple(x for x in formats if x not in skipped)
    if not formats:
        ap.error("none of the formats asked for runs on this CPU")
    widths = tuple(sorted({int(x) for x in a.widths.split(",") if x.strip()}))
    if not widths or widths[0] != 1:
        ap.error("--widths must include 1 (ratios are relative to width 1)")
    if a.tokens < 2 or a.prefill < 8 or a.reps < 1 or a.warmup < 0 or a.width_inner < 1:
        ap.error("need --tokens >= 2, --prefill >= 8, --reps >= 1, --warmup >= 0, --width-inner >= 1")
    s = Settings(model=a.model, formats=formats, prefill=a.prefill, tokens=a.tokens, reps=a.reps, warmup=a.warmup,
                 widths=widths, width_inner=a.width_inner, threads=a.threads or _default_threads(),
                 bw_mib=max(1, a.bw_mib), llama=not a.no_llama, settle_s=max(0.0, a.settle),
                 quiet_wait_s=max(0.0, a.quiet_wait), quiet_threshold=a.quiet_threshold, skipped_formats=skipped)
    return s, a


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    settings, a = parse_args(args_list)
    command = "python -m benchmarks.decode " + " ".join(shlex.quote(x) for x in args_list)
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr, flush=True)
    report = run(settings, command, lambda m: print(m, file=sys.stderr, flush=True))
    table = report.markdown()
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(table + "\n")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(_json_safe(report.to_json()), fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
