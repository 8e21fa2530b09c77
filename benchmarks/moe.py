"""The cost of the sparse MoE path against a dense model of the same active size, by forward width.

    python -m benchmarks.moe [--layers 4] [--embd 1024] [--experts 32] [--used 8] [--expert-ff 384]
        [--type Q8_0] [--format qdot] [--widths 1,2,4,8] [--reps 30] [--threads 1] [--markdown PATH]

Two random GGUFs are written (in a temporary directory) with identical attention, embeddings and head:
a ``qwen3moe`` whose every layer has ``--experts`` experts of width ``--expert-ff``, ``--used`` per token,
and a dense ``qwen3`` whose FFN width is ``--used x --expert-ff``: the FFN weights one token runs through
are the same size in both. Weights are stored as ``--type`` and loaded with ``--format`` (qdot: each
stored code read as is by the native kernel).

Per width w (the decode step is w = 1; a speculative verification of k drafts is w = k + 1), after a
64-token prompt: ONE forward over w new tokens with logits for every position, the cache truncated back
after each, repeated ``--reps`` times with the two models interleaved; the median and the minimum are
reported. Weight bytes read per forward count every linear's ``weight_nbytes()`` that the forward runs:
for the MoE, attention, the routers and the distinct experts the batch's tokens were routed to (each
runs once per forward on all of its tokens), counted by forward hooks on the experts; per token is that
over w. The embedding reads one row per token and is left out of both.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from engine.models.loader import load_model
from engine.models.moe import SparseMoE
from engine.ops.linear import Linear

VOCAB = 2048
PROMPT = 64


def _write(path: Path, arch: str, args, *, n_ff: int, moe: bool, seed: int = 0) -> None:
    """A random model in llama.cpp's layout. The shared parts use the same seed, so both models hold the same
    attention, embeddings and head."""
    rng = np.random.default_rng(seed)
    D, H, Hkv, hd = args.embd, args.heads, args.heads // 2, args.head_dim
    qtype = gguf.GGMLQuantizationType[args.type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(args.layers)
    w.add_context_length(1024)
    w.add_embedding_length(D)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(VOCAB)
    if moe:
        w.add_expert_count(args.experts)
        w.add_expert_used_count(args.used)
        w.add_expert_feed_forward_length(args.expert_ff)

    def mat(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name: str, a: np.ndarray, quantize: bool = True) -> None:
        if a.ndim >= 2 and quantize:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", mat(VOCAB, D, scale=0.5))
    ffn_rng = np.random.default_rng(seed + 1)
    for i in range(args.layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", np.ones(D, np.float32))
        add(p + "attn_q.weight", mat(H * hd, D))
        add(p + "attn_k.weight", mat(Hkv * hd, D))
        add(p + "attn_v.weight", mat(Hkv * hd, D))
        add(p + "attn_output.weight", mat(D, H * hd))
        add(p + "attn_q_norm.weight", np.ones(hd, np.float32))
        add(p + "attn_k_norm.weight", np.ones(hd, np.float32))
        add(p + "ffn_norm.weight", np.ones(D, np.float32))
        f = lambda *s: (ffn_rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
        if moe:
            E, F = args.experts, args.expert_ff
            add(p + "ffn_gate_inp.weight", f(E, D), quantize=False)  # llama.cpp keeps routers F32
            add(p + "ffn_gate_exps.weight", f(E, F, D))
            add(p + "ffn_up_exps.weight", f(E, F, D))
            add(p + "ffn_down_exps.weight", f(E, D, F))
        else:
            add(p + "ffn_gate.weight", f(n_ff, D))
            add(p + "ffn_up.weight", f(n_ff, D))
            add(p + "ffn_down.weight", f(D, n_ff))
    add("output_norm.weight", np.ones(D, np.float32))
    add("output.weight", mat(VOCAB, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _linear_bytes(module: torch.nn.Module) -> int:
    """Weight bytes of the linears under ``module`` (leaves only: a split linear holds its parts)."""
    return sum(m.weight_nbytes() for m in module.modules()
               if isinstance(m, Linear) and not any(isinstance(c, Linear) for c in m.children()))


class ByteCounter:
    """Weight bytes one forward reads: every linear outside the experts, plus each expert that ran."""

    def __init__(self, model):
        self.experts_total = 0
        for layer in model.layers:
            if isinstance(layer.ffn, SparseMoE):
                for ex in layer.ffn.experts:
                    nbytes = _linear_bytes(ex)
                    self.experts_total += nbytes
                    ex.register_forward_hook(lambda m, i, o, n=nbytes: self._ran(n))
        self.fixed = _linear_bytes(model) - self.experts_total
        self.last = 0
        self._expert_bytes = 0

    def _ran(self, nbytes: int) -> None:
        self._expert_bytes += nbytes

    def start(self) -> None:
        self._expert_bytes = 0

    def stop(self) -> int:
        self.last = self.fixed + self._expert_bytes
        return self.last


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--expert-ff", type=int, default=384)
    ap.add_argument("--type", default="Q8_0", choices=["Q8_0", "Q4_0", "F32"])
    ap.add_argument("--format", default="qdot")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    widths = [int(x) for x in args.widths.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        paths = {"moe": Path(tmp) / "moe.gguf", "dense": Path(tmp) / "dense.gguf"}
        _write(paths["moe"], "qwen3moe", args, n_ff=args.used * args.expert_ff, moe=True)
        _write(paths["dense"], "qwen3", args, n_ff=args.used * args.expert_ff, moe=False)
        models = {k: load_model(p, fmt=args.format) for k, p in paths.items()}
        counters = {k: ByteCounter(m) for k, m in models.items()}
        rng = np.random.default_rng(1)
        prompt = rng.integers(0, VOCAB, PROMPT).tolist()
        caches = {}
        for k, m in models.items():
            caches[k] = m.new_cache(PROMPT + max(widths) + 1)
            m(prompt, caches[k], logits_for="last")
        times = {(k, w): [] for k in models for w in widths}
        nbytes = {(k, w): [] for k in models for w in widths}
        for rep in range(args.reps + 2):  # two warm-up rounds, dropped
            for w in widths:
                toks = rng.integers(0, VOCAB, w).tolist()
                for k in (("moe", "dense") if rep % 2 else ("dense", "moe")):
                    m, cache, counter = models[k], caches[k], counters[k]
                    counter.start()
                    t0 = time.perf_counter()
                    m(toks, cache, logits_for="all")
                    dt = time.perf_counter() - t0
                    counter.stop()
                    cache.truncate(PROMPT)
                    if rep >= 2:
                        times[(k, w)].append(dt)
                        nbytes[(k, w)].append(counter.last)

    cpu = _cpu_model()
    lines = [
        f"Command: `{' '.join(['python -m benchmarks.moe', *(sys.argv[1:] if argv is None else argv)])}`",
        "",
        f"CPU: {cpu}; torch threads: {args.threads}; weights {args.type} loaded as `{args.format}`; "
        f"{args.layers} layers, n_embd {args.embd}, {args.heads} heads of {args.head_dim}; "
        f"MoE: {args.experts} experts of width {args.expert_ff}, {args.used} per token; dense: n_ff "
        f"{args.used * args.expert_ff}. Expert weights in all (MoE): "
        f"{counters['moe'].experts_total / 2**20:.1f} MiB; the rest (each model): "
        f"{counters['moe'].fixed / 2**20:.2f} MiB (MoE, incl. routers) / {counters['dense'].fixed / 2**20:.2f} MiB "
        "(dense, incl. its FFN).",
        "",
        "| width | dense ms (median / min) | MoE ms (median / min) | MoE / dense | dense MiB read per token "
        "| MoE MiB read per token | MoE / dense bytes |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in widths:
        d, e = times[("dense", w)], times[("moe", w)]
        db = statistics.mean(nbytes[("dense", w)]) / w
        eb = statistics.mean(nbytes[("moe", w)]) / w
        lines.append(f"| {w} | {statistics.median(d) * 1e3:.2f} / {min(d) * 1e3:.2f} | "
                     f"{statistics.median(e) * 1e3:.2f} / {min(e) * 1e3:.2f} | "
                     f"{statistics.median(e) / statistics.median(d):.2f} | {db / 2**20:.2f} | {eb / 2**20:.2f} | "
                     f"{eb / db:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
