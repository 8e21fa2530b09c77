"""Native CPU kernels, compiled on first use with torch's C++ extension builder.

One library holds them all: ``qdot.cpp`` (the quantized matmul, ``torch.ops.tandem.qdot_linear``),
``blockops.cpp`` (a decoder block's small ops fused: RMSNorm, RoPE, attention, SiLU x up), ``decoder.cpp``
(a stack of decoder blocks run by one call, ``torch.classes.tandem.DecoderStack``), ``gguf_rows.cpp``
(GGUF rows dequantized for embedding lookups), ``logits.cpp`` (a row of logits' argmax and top probability,
for sampling) and ``probe.cpp`` (the read-bandwidth probe); each file's header says what it computes. ``load_qdot()``, ``load_block_ops()``
and ``decoder_stack_class()`` hand them out. The build takes
20-60 s once and is cached under torch's extensions directory (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``), keyed by the sources and this machine's CPU features because it is
compiled with ``-march=native``. Other builds of the same sources (:data:`VARIANTS`) live under their
own op namespaces so that the tests can run each vector path this CPU can execute against the
portable one.

Concurrent engine processes build under one ``fcntl`` lock on the build directory. Torch's own lock
file outlives a builder that was killed (every later build then waits on it forever); under our lock no
live tandem build holds it, so a leftover one is removed.

No compiler, no ninja, or a failing build is not an error for the engine: ``load_qdot()`` returns
``None``, :func:`qdot_status` says why, and the engine keeps to torch's own kernels.
Set ``TANDEM_NATIVE_KERNELS=0`` to never build or load them; ``TANDEM_KERNEL_VARIANT=avx2`` (or ``portable``) runs
the engine on that build instead of the native one, to time the AVX2 path on an AVX-512 host.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

_SOURCES = [Path(__file__).with_name(n) for n in ("qdot.cpp", "blockops.cpp", "decoder.cpp", "gguf_rows.cpp",
                                                  "logits.cpp", "probe.cpp")]
_HEADERS = [Path(__file__).with_name(n) for n in ("native.h", "vec.h", "parallel.h")]  # part of the build's key, not compiled on their own


@dataclass(frozen=True)
class KernelVariant:
    """One build of the kernel library: its compiler target and the op namespace it registers."""

    namespace: str
    march: str
    cpu_flags: tuple[str, ...] = ()  # /proc/cpuinfo flags the build's code needs at run time
    defines: tuple[str, ...] = ()  # extra -D flags
    header: str = ""  # a system header the build needs; without it the variant is unavailable


# "native" is what the engine runs; "avx2" is x86-64-v3 (the AVX2 path, also built on AVX-512 hosts
# so their tests cover it); "portable" is the plain C++ loop; "avx512-emulated" is the AVX-512 path
# over SIMDe's portable intrinsics (Debian's libsimde-dev), slow, so that an AVX2 host's tests check
# that path against the AVX2 one too.
VARIANTS = {
    "native": KernelVariant("tandem", "-march=native"),
    "avx2": KernelVariant("tandem_avx2", "-march=x86-64-v3", ("avx2", "fma", "f16c")),
    "portable": KernelVariant("tandem_portable", "-march=x86-64-v2"),
    "avx512-emulated": KernelVariant("tandem_avx512emu", "-march=x86-64-v3", ("avx2", "fma", "f16c"),
                                     ("-DQDOT_EMULATE_AVX512",), "simde/x86/avx512.h"),
}


def _have_header(name: str) -> bool:
    """Whether a system header is where the compiler looks by default (or on CPATH)."""
    dirs = ["/usr/include", "/usr/local/include", *filter(None, os.environ.get("CPATH", "").split(os.pathsep))]
    return any((Path(d) / name).is_file() for d in dirs)


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    isa: str  # the vector path compiled in: "avx512vnni", "avx2" or "scalar"; "" when not available
    detail: str  # the library name when available, else why not
    namespace: str = "tandem"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


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


def build_directory(name: str) -> Path:
    """Where torch builds extension ``name`` by default (the same rule as torch's private
    ``_get_build_directory``, so builds made before are reused), given to ``load`` explicitly so that
    the lock below guards the directory the build uses."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root) / name
    if torch.version.hip is not None:
        accelerator = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        accelerator = "cu" + torch.version.cuda.replace(".", "")
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(cpp_extension.get_default_build_root()) / f"{python}_{accelerator}" / name


def engine_variant() -> str:
    """The build the engine runs: ``native``, unless ``TANDEM_KERNEL_VARIANT`` names another of :data:`VARIANTS`
    (``avx2`` on an AVX-512 host measures the AVX2 path's speed there; an unknown name keeps ``native``)."""
    wanted = os.environ.get("TANDEM_KERNEL_VARIANT", "native")
    return wanted if wanted in VARIANTS else "native"


@functools.lru_cache(maxsize=None)
def qdot_status(variant: str = "native") -> KernelStatus:
    """Build (once per process) and load one variant of the kernel library; never raises.

    ``"native"`` is the engine's (``TANDEM_KERNEL_VARIANT`` may name another build for it: ``engine_variant``); the
    others (:data:`VARIANTS`) register under their own namespaces for the tests to compare, and are reported
    unavailable on a CPU that cannot run them."""
    if variant == "native" and engine_variant() != "native":
        return qdot_status(engine_variant())
    spec = VARIANTS[variant]
    namespace = spec.namespace
    if os.environ.get("TANDEM_NATIVE_KERNELS", "1") == "0":
        return KernelStatus(False, "", "disabled by TANDEM_NATIVE_KERNELS=0", namespace)
    if platform.machine() not in ("x86_64", "AMD64"):
        return KernelStatus(False, "", f"no native kernel for {platform.machine()}", namespace)
    missing = sorted(set(spec.cpu_flags) - cpu_flags())
    if missing:
        return KernelStatus(False, "", f"this CPU lacks {', '.join(missing)}", namespace)
    if spec.header and not _have_header(spec.header):
        return KernelStatus(False, "", f"no {spec.header} (install libsimde-dev)", namespace)
    # The sources' text and place: the build records the source paths, so two checkouts sharing one
    # build directory would rebuild it whenever the other one loaded last.
    source_key = hashlib.sha256(b"".join(p.read_bytes() + str(p.resolve()).encode()
                                         for p in _SOURCES + _HEADERS)).hexdigest()[:8]
    target = _cpu_key() if spec.march == "-march=native" else spec.march.removeprefix("-march=")
    name = f"{namespace}_qdot_{target}_{source_key}".replace("-", "_")
    try:
        from torch.utils import cpp_extension

        build_dir = build_directory(name)
        build_dir.mkdir(parents=True, exist_ok=True)
        with open(build_dir / "tandem.flock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # released by the kernel if this process dies
            (build_dir / "lock").unlink(missing_ok=True)  # torch's baton, left by a killed builder
            cpp_extension.load(
                name=name,
                sources=[str(p) for p in _SOURCES],
                extra_cflags=["-O3", spec.march, "-fopenmp", f"-DQDOT_NAMESPACE={namespace}", *spec.defines],
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        isa = str(getattr(torch.ops, namespace).qdot_isa())
    except Exception as e:  # no compiler / ninja / headers: the engine runs without the kernel
        lines = str(e).strip().splitlines()
        return KernelStatus(False, "", f"build failed: {lines[-1] if lines else type(e).__name__}", namespace)
    return KernelStatus(True, isa, name, namespace)


def load_qdot(variant: str = "native"):
    """The ``qdot_linear`` op when the kernel is available, else ``None``."""
    status = qdot_status(variant)
    return getattr(torch.ops, status.namespace).qdot_linear if status.available else None


def load_block_ops(variant: str = "native"):
    """The op namespace holding ``block_rms_norm`` and ``block_rope`` when the library is available,
    else ``None``."""
    status = qdot_status(variant)
    return getattr(torch.ops, status.namespace) if status.available else None


def decoder_stack_class(variant: str = "native"):
    """The native ``DecoderStack`` class (``decoder.cpp``) when the library is available, else ``None``."""
    status = qdot_status(variant)
    return getattr(torch.classes, status.namespace).DecoderStack if status.available else None


def qdot_fast() -> bool:
    """Whether the vector path is available: only then is qdot worth choosing by default."""
    status = qdot_status()
    return status.available and status.isa in ("avx512vnni", "avx2")
