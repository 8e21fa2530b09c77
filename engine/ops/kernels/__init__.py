"""Native CPU kernels, compiled on first use with torch's C++ extension builder.

One library holds them all: ``qdot.cpp`` (the quantized matmul, ``torch.ops.tandem.qdot_linear``)
and ``blockops.cpp`` (a decoder block's small ops fused: RMSNorm and RoPE); each file's header
says what it computes. ``load_qdot()`` and ``load_block_ops()`` hand them out. The build takes
20-60 s once and is cached under torch's extensions directory (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``), keyed by the sources and this machine's CPU features because it is
compiled with ``-march=native``.

No compiler, no ninja, or a failing build is not an error for the engine: ``load_qdot()`` returns
``None``, :func:`qdot_status` says why, and the engine keeps to torch's own kernels.
Set ``TANDEM_NATIVE_KERNELS=0`` to never build or load them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

_SOURCES = [Path(__file__).with_name(n) for n in ("qdot.cpp", "blockops.cpp")]


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    isa: str  # "avx512vnni" (the vector path was compiled in), "scalar", or "" when not available
    detail: str  # the library name when available, else why not
    namespace: str = "tandem"


def _cpu_key() -> str:
    """A short hash of the CPU model and flags: a build made with -march=native is only valid there."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += line
                    if line.startswith(("flags", "Features")):
                        break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@functools.lru_cache(maxsize=None)
def qdot_status(portable: bool = False) -> KernelStatus:
    """Build (once per process) and load the qdot kernel; never raises.

    ``portable=True`` builds the plain-C++ path (no AVX-512) under the op namespace
    ``tandem_portable``: the tests compare it with the vector path."""
    namespace = "tandem_portable" if portable else "tandem"
    if os.environ.get("TANDEM_NATIVE_KERNELS", "1") == "0":
        return KernelStatus(False, "", "disabled by TANDEM_NATIVE_KERNELS=0", namespace)
    if platform.machine() not in ("x86_64", "AMD64"):
        return KernelStatus(False, "", f"no native kernel for {platform.machine()}", namespace)
    arch = "-march=x86-64-v2" if portable else "-march=native"
    source_key = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES)).hexdigest()[:8]
    name = f"{namespace}_qdot_{'generic' if portable else _cpu_key()}_{source_key}"
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(
            name=name,
            sources=[str(p) for p in _SOURCES],
            extra_cflags=["-O3", arch, "-fopenmp", f"-DQDOT_NAMESPACE={namespace}"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
        isa = str(getattr(torch.ops, namespace).qdot_isa())
    except Exception as e:  # no compiler / ninja / headers: the engine runs without the kernel
        lines = str(e).strip().splitlines()
        return KernelStatus(False, "", f"build failed: {lines[-1] if lines else type(e).__name__}", namespace)
    return KernelStatus(True, isa, name, namespace)


def load_qdot(portable: bool = False):
    """The ``qdot_linear`` op when the kernel is available, else ``None``."""
    status = qdot_status(portable)
    return getattr(torch.ops, status.namespace).qdot_linear if status.available else None


def load_block_ops(portable: bool = False):
    """The op namespace holding ``block_rms_norm`` and ``block_rope`` when the library is available,
    else ``None``."""
    status = qdot_status(portable)
    return getattr(torch.ops, status.namespace) if status.available else None


def qdot_fast() -> bool:
    """Whether the vector path is available: only then is qdot worth choosing by default."""
    status = qdot_status()
    return status.available and status.isa == "avx512vnni"
