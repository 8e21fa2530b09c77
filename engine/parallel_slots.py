"""How many sequences a load serves at once when ``num_parallel`` is 0 (auto): Ollama's default of 4 slots where
their caches fit in a share of the memory free at load, else fewer. One rule for the native engine (engine.load)
and llama-server's ``-np`` (engine.llamacpp.runtime); torch-free, as the llamacpp engine process needs no torch."""

from __future__ import annotations

import os

#: ``num_parallel`` 0 (auto) serves at most this many sequences at once, as Ollama's default of 4 slots...
AUTO_PARALLEL = 4
#: ... when their caches fit in this share of the memory available at load (else fewer, down to 1).
AUTO_PARALLEL_MEMORY_SHARE = 0.25


def resolve_num_parallel(asked: int, slot_bytes: int, available_bytes: int | None) -> int:
    """The slots a load builds: ``asked`` when > 0; for 0, the most of AUTO_PARALLEL, 2 and 1 whose extra
    slots' caches fit in AUTO_PARALLEL_MEMORY_SHARE of the available memory (1 when it is unknown)."""
    if asked > 0:
        return asked
    if not available_bytes or slot_bytes <= 0:
        return 1
    for n in (AUTO_PARALLEL, 2):
        if (n - 1) * slot_bytes <= AUTO_PARALLEL_MEMORY_SHARE * available_bytes:
            return n
    return 1


def available_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
