"""How far the qdot kernel (AVX2, AVX-512 VNNI) is from what its instructions allow on this core.

    python -m benchmarks.simd_floor [--model MODEL.gguf] [--widths 4,8,64] [--repeats 3] [--seconds 1.5]
        [--markdown out.md]

Builds and runs ``benchmarks/simd_floor.cpp`` (g++ -O2, one thread): the clock (a chain of dependent multiplies),
the throughput of the kernel's instructions on their own (vpmaddubsw, vpaddw, vpbroadcastd, and the pair a product
added into an int16 sum, which every 32 multiply-adds of an activation row cost at least once), and one weight
group of the kernel's 4-bit four-row pass written out in assembly. With ``--model``, the qdot kernel itself on that
GGUF's linears (each kind and type, one thread, ``--widths`` activation rows) in the same unit: cycles per 32
multiply-adds and activation row, at the clock measured here. The pair is the floor of this instruction mix (every
32 multiply-adds of a row cost one of each); the assembly group is what the mix costs with the nibble unpacking,
broadcasts and the group's scale step in, every byte in L1; the kernel's figure above that is what the rest of a
real pass adds (the scale codes' expansion, the super-block's float step, the weights' first read from memory:
the same group written in assembly inside the kernel measured as the compiled one on a Zen 3). Where the CPU has
AVX-512 VNNI (the native build then runs that path), the same for it: vpdpbusd on zmm registers (64 multiply-adds
of a row: half of one is its floor per 32), vpmulld (the K-quant scale step, once per group and row) and one 4-bit
group of eight rows in assembly. Each figure is the best over ``--repeats`` runs (a shared host is noisy).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.output import emit, host_line

SOURCE = Path(__file__).with_name("simd_floor.cpp")

#: What each probe line measures, in the report's words.
PROBES = {
    "vpmaddubsw": "vpmaddubsw alone (cycles per instruction)",
    "vpaddw": "vpaddw alone",
    "vpbroadcastd": "vpbroadcastd from memory alone",
    "pair": "vpmaddubsw + vpaddw into a sum: the floor per 32 multiply-adds x row",
    "group_asm": "one 4-bit group, four rows, in assembly, all in L1 (unpack, broadcasts, scale step in)",
    "vpdpbusd": "AVX-512 VNNI: vpdpbusd zmm alone, per 32 multiply-adds x row (half an instruction): the VNNI floor",
    "vpmulld": "AVX-512: vpmulld zmm alone (cycles per instruction; one per group and row: the K-quant scale step)",
    "vnni_group_asm": "AVX-512 VNNI: one 4-bit group, eight rows, in assembly, all in L1 (unpack, scale step in)",
}

#: The probes that only run on a CPU with AVX-512 VNNI.
VNNI_PROBES = ("vpdpbusd", "vpmulld", "vnni_group_asm")


def instruction_costs(repeats: int, vnni: bool = False) -> dict[str, float]:
    """The probe's figures, best over ``repeats`` (the clock: its highest); with ``vnni`` (the CPU has AVX-512
    VNNI: the probe's zmm instructions fault elsewhere) the AVX-512 VNNI path's figures too."""
    if shutil.which("g++") is None:
        raise SystemExit("g++ is needed to build the probe")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "simd_floor"
        subprocess.run(["g++", "-O2", "-o", str(exe), str(SOURCE)], check=True)
        cmd = [str(exe), str(repeats)] + (["vnni"] if vnni else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    best: dict[str, float] = {}
    for line in out.splitlines():
        name, value = line.split()
        v = float(value)
        best[name] = max(best.get(name, v), v) if name == "clock_ghz" else min(best.get(name, v), v)
    return best


@torch.no_grad()
def kernel_costs(model: str, widths: list[int], ghz: float, seconds: float = 1.5) -> list[tuple[str, list[float]]]:
    """Per linear kind and type of ``model``: the qdot kernel's cycles per 32 multiply-adds x row at each width,
    one thread, the best pass over ``seconds``."""
    from benchmarks.linears import kinds
    from engine.contract.gguf import GGUFFile
    from engine.ops.linear import load_linear

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        f = GGUFFile(model)
        rows = []
        for kind, names in kinds(f).items():
            names = names[:3]  # a few layers: enough for a steady figure, and quick
            lins = [load_linear(f, n, "qdot") for n in names]
            weights = sum(f.tensors[n].n_elements for n in names)
            cells = []
            for m in widths:
                x = torch.randn(m, lins[0].in_features)
                for lin in lins:
                    lin(x)
                best, end = float("inf"), time.perf_counter() + seconds
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    for lin in lins:
                        lin(x)
                    best = min(best, time.perf_counter() - t0)
                cells.append(best * ghz * 1e9 / (weights * m / 32))
            rows.append((kind, cells))
        return rows
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.simd_floor", description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--widths", default="4,8,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5, help="time per (linear, width): its best pass counts")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    from engine.ops.kernels import cpu_flags

    if "avx2" not in cpu_flags():
        raise SystemExit("this CPU has no AVX2: the probe's instructions do not run here")
    vnni = "avx512_vnni" in cpu_flags()
    costs = instruction_costs(args.repeats, vnni)
    ghz = costs.pop("clock_ghz")
    command = "python -m benchmarks.simd_floor" + (f" --model {Path(args.model).name}" if args.model else "") + \
        f" --widths {args.widths} --repeats {args.repeats}"
    # the path the native build runs here (engine.ops.kernels picks it by the same flags)
    floor, group = ("vpdpbusd", "vnni_group_asm") if vnni else ("pair", "group_asm")
    lines = ["# The qdot kernel against its instructions' floor", "", host_line(1), "", f"`{command}`", "",
             f"Clock measured: {ghz:.2f} GHz (a chain of dependent multiplies, 3 cycles each).", "",
             "| probe | cycles |", "|---|---:|"]
    lines += [f"| {PROBES.get(name, name)} | {value:.3f} |" for name, value in costs.items()]
    if args.model:
        widths = [int(w) for w in args.widths.split(",") if w]
        lines += ["", "The qdot kernel, one thread (cycles per 32 multiply-adds x activation row; "
                  f"this CPU runs the {'AVX-512 VNNI' if vnni else 'AVX2'} path; its floor above: {costs[floor]:.2f}, "
                  f"its assembly group: {costs[group]:.2f}):", "",
                  "| linear | " + " | ".join(f"m={m}" for m in widths) + " |", "|---|" + "---:|" * len(widths)]
        lines += [f"| {kind} | " + " | ".join(f"{c:.2f}" for c in cells) + " |"
                  for kind, cells in kernel_costs(args.model, widths, ghz, args.seconds)]
    emit(lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
