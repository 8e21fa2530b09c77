"""What every benchmark table starts and ends with: the host it ran on (CPU model and the ISA that picks the
kernels), and the table printed and optionally written as markdown."""

from __future__ import annotations

from pathlib import Path

from benchmarks.decode import cpu_info


def host_line(threads: int) -> str:
    cpu = cpu_info()
    isa = ", ".join(k for k in ("avx512_vnni", "avx512_bf16", "amx") if cpu[k]) or \
        ("AVX2, no AVX-512" if cpu["avx2"] else "no AVX2")
    isa += f"; qdot {cpu['qdot_isa'] or 'not built'}"
    return f"{cpu['cpu_model']} ({isa}), {threads} threads, torch {cpu['torch']}."


def emit(lines: list[str], markdown: str | None) -> str:
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown:
        Path(markdown).write_text(text)
    return text
