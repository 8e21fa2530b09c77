"""What speculation costs a hybrid recurrent model's cache (qwen35: Gated DeltaNet + gated attention): the
snapshot memory a verification holds, and the time of a restore.

    python -m benchmarks.hybrid_cache [--embd 4096] [--k-heads 16] [--v-heads 32] [--head-k 128] [--head-v 128]
        [--layers 4] [--full-recurrent 24] [--ff 1024] [--type Q8_0] [--widths 1,2,3,5,9] [--reps 20]
        [--threads 2] [--markdown PATH]

A random qwen35 GGUF with the recurrent geometry of a real checkpoint (the defaults are Qwen3.5's default
text config: 4096 wide, 16 key and 32 value heads of 128) but only ``--layers`` layers (the last one full
attention) and a narrow FFN, so it loads in seconds; memory per recurrent layer is exact and is scaled to
``--full-recurrent`` layers (Qwen3.5's 32 layers hold 24 recurrent ones).

Per verification width w (a round of k drafts is w = k + 1), after a 64-token prompt, repeated ``--reps``
times: one forward of w tokens, the cache's bytes beyond its committed state (the per-position records a
rejection may restore), then ``truncate`` back to a random accepted length (the restore: a swap of
references, no copy) and, for scale, the forward itself. Medians are reported.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from benchmarks.output import emit, host_line
from engine.cache.recurrent import HybridCache
from engine.models.loader import load_model

VOCAB = 1024
PROMPT = 64


def _write(path: Path, args) -> None:
    rng = np.random.default_rng(0)
    D, H, Hkv, hd = args.embd, 16, 4, 256
    nk, nv, dk, dv = args.k_heads, args.v_heads, args.head_k, args.head_v
    qtype = gguf.GGMLQuantizationType[args.type]
    w = gguf.GGUFWriter(str(path), "qwen35")
    for key, value in {"block_count": args.layers, "context_length": 1024, "embedding_length": D,
                       "feed_forward_length": args.ff, "attention.head_count": H, "attention.head_count_kv": Hkv,
                       "attention.key_length": hd, "attention.value_length": hd, "vocab_size": VOCAB,
                       "rope.dimension_count": hd // 4, "full_attention_interval": args.layers,
                       "ssm.conv_kernel": 4, "ssm.state_size": dk, "ssm.group_count": nk,
                       "ssm.time_step_rank": nv, "ssm.inner_size": nv * dv}.items():
        w.add_uint32(f"qwen35.{key}", value)
    w.add_float32("qwen35.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("qwen35.rope.freq_base", 1e7)

    def mat(*shape: int, scale: float = 0.03) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name: str, a: np.ndarray) -> None:
        if a.ndim >= 2 and a.shape[-1] % 32 == 0 and not name.endswith("ssm_conv1d.weight"):
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", mat(VOCAB, D, scale=0.5))
    conv = 2 * nk * dk + nv * dv
    for i in range(args.layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", np.ones(D, np.float32))
        add(p + "post_attention_norm.weight", np.ones(D, np.float32))
        add(p + "ffn_gate.weight", mat(args.ff, D))
        add(p + "ffn_up.weight", mat(args.ff, D))
        add(p + "ffn_down.weight", mat(D, args.ff))
        if i < args.layers - 1:
            add(p + "attn_qkv.weight", mat(conv, D))
            add(p + "attn_gate.weight", mat(nv * dv, D))
            add(p + "ssm_beta.weight", mat(nv, D))
            add(p + "ssm_alpha.weight", mat(nv, D))
            add(p + "ssm_conv1d.weight", mat(conv, 4, scale=0.3))
            add(p + "ssm_a", -np.exp(rng.uniform(-1, 1, nv)).astype(np.float32))
            add(p + "ssm_dt.bias", mat(nv, scale=0.5))
            add(p + "ssm_norm.weight", np.ones(dv, np.float32))
            add(p + "ssm_out.weight", mat(D, nv * dv))
        else:
            add(p + "attn_q.weight", mat(2 * H * hd, D))
            add(p + "attn_k.weight", mat(Hkv * hd, D))
            add(p + "attn_v.weight", mat(Hkv * hd, D))
            add(p + "attn_output.weight", mat(D, H * hd))
            add(p + "attn_q_norm.weight", np.ones(hd, np.float32))
            add(p + "attn_k_norm.weight", np.ones(hd, np.float32))
    add("output_norm.weight", np.ones(D, np.float32))
    add("output.weight", mat(VOCAB, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _committed_bytes(cache: HybridCache) -> int:
    """Bytes of the recurrent states a cache holds at its length alone (no records)."""
    return sum(t.numel() * t.element_size() for pair in cache.states for t in pair)


def measure(model, widths: list[int], reps: int) -> list[dict]:
    """Per width: median forward time, restore time and held bytes per recurrent layer."""
    rng = random.Random(0)
    cache = model.new_cache(PROMPT + max(widths) + 8)
    prompt = [rng.randrange(VOCAB) for _ in range(PROMPT)]
    model(prompt, cache)
    n_rec = cache.n_recurrent
    rows = []
    for w in widths:
        fwd, restore, held = [], [], []
        for _ in range(reps):
            tokens = [rng.randrange(VOCAB) for _ in range(w)]
            t0 = time.perf_counter()
            model(tokens, cache)
            t1 = time.perf_counter()
            held.append(cache.nbytes() - cache.k.numel() * cache.k.element_size() * 2 - _committed_bytes(cache))
            keep = rng.randint(1, w)
            t2 = time.perf_counter()
            cache.truncate(PROMPT + keep)
            t3 = time.perf_counter()
            cache.truncate(PROMPT)  # back to the prompt for the next rep (also a restore)
            fwd.append(t1 - t0)
            restore.append(t3 - t2)
        rows.append({"width": w, "forward_ms": 1e3 * statistics.median(fwd),
                     "restore_us": 1e6 * statistics.median(restore),
                     "held_bytes_per_layer": statistics.median(held) / n_rec})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--k-heads", type=int, default=16)
    ap.add_argument("--v-heads", type=int, default=32)
    ap.add_argument("--head-k", type=int, default=128)
    ap.add_argument("--head-v", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--full-recurrent", type=int, default=24)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("--widths", default="1,2,3,5,9")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "hybrid.gguf"
        _write(path, args)
        model = load_model(path)
        rows = measure(model, [int(x) for x in args.widths.split(",")], args.reps)
    state = args.v_heads * args.head_k * args.head_v * 4
    lines = ["# Hybrid cache: snapshot memory and restore cost", "", host_line(args.threads), "",
             f"`python -m benchmarks.hybrid_cache {' '.join(sys.argv[1:] if argv is None else argv)}`", "",
             f"Recurrent geometry: {args.k_heads} key / {args.v_heads} value heads of {args.head_k}/{args.head_v}, "
             f"{args.embd} wide; one delta-rule state is {state / 2**20:.2f} MiB (f32). Held = the states kept "
             "beyond the committed one: the prompt's two checkpoints (P-1 and P, for the next request's prefix "
             "reuse) and the w-1 states inside the verification that a rejection may restore (references the "
             f"forward made anyway, not copies); x{args.full_recurrent} = scaled to {args.full_recurrent} "
             "recurrent layers.", "",
             "| width | forward (ms, this model) | restore (µs) | held per recurrent layer | held x"
             f"{args.full_recurrent} |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['width']} | {r['forward_ms']:.1f} | {r['restore_us']:.0f} | "
                     f"{r['held_bytes_per_layer'] / 2**20:.2f} MiB | "
                     f"{r['held_bytes_per_layer'] * args.full_recurrent / 2**20:.0f} MiB |")
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
