"""Where a model's weights and caches live in memory: their resident size, and 2 MB pages for them.

Decoding one token streams every weight once, so its speed is the memory bus's. Weights a load builds
(repacked codes, dequantized floats) are ordinary anonymous allocations in 4 kB pages: a 1 GB model
spans 250,000 of them, and each page walk and each stop of the hardware prefetcher at a page boundary
costs read bandwidth. The kernel backs a range with 2 MB pages when it is asked to (``madvise
(MADV_HUGEPAGE)``; Linux's default transparent-huge-page mode is ``madvise``), which a plain
allocation never is. :func:`place_on_huge_pages` copies such weights into one mapping so advised.
Weights mapped from a file (the pack cache) are not copied: a file's mapping takes 2 MB pages where the
page cache holds the file in 2 MB folios, which a buffered write does not leave behind but a read through
a mapping advised for huge pages does. :func:`recache_in_huge_folios` puts a freshly written file there, and
:func:`advise_file_mappings` asks for it on every later load (pages read back after an eviction).

A KV cache is read the same way at every step, one (layer, head) run of positions after another, and under
batching eight sequences' caches are eight more such streams: :func:`empty_on_huge_pages` allocates one in a
mapping advised for 2 MB pages from the start.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import math
import mmap
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = 64 << 10  # smaller storages (norms, biases) are not worth a place in the mapping
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def model_bytes(module: torch.nn.Module) -> int:
    """Resident size of a module's weights, counting storage shared between tensors once."""
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # mkldnn tensors have no storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


def huge_pages_available() -> bool:
    """Whether this kernel backs an advised range with 2 MB pages (THP mode ``always`` or ``madvise``)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        mode = THP_MODE.read_text()
    except OSError:
        return False
    return "[never]" not in mode


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    path: str  # the file, "[heap]", "[anon:...]", or "" for an unnamed anonymous mapping
    anonymous: bool  # no file behind it (the heap, malloc's large chunks, anonymous mmaps)
    huge_advised: bool  # VmFlags has ``hg``: madvise(MADV_HUGEPAGE) was applied to it
    sizes: dict[str, int] = field(default_factory=dict)  # smaps' sizes in bytes: Rss, AnonHugePages, ...

    @property
    def heap(self) -> bool:
        """Part of the brk heap."""
        return self.path == "[heap]"


def process_mappings(smaps: str | None = None) -> list[Mapping]:
    """This process's mappings from ``/proc/self/smaps`` (or the given text), sorted by address."""
    if smaps is None:
        smaps = Path("/proc/self/smaps").read_text()
    out: list[Mapping] = []
    start = end = 0
    path, anonymous, sizes = "", False, {}
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            span = head[0].split("-")
            try:
                start, end = int(span[0], 16), int(span[1], 16)
            except ValueError:
                continue
            path = head[5].strip() if len(head) > 5 else ""
            anonymous = head[4] == "0" and (path == "" or path == "[heap]" or path.startswith("[anon"))
            sizes = {}
        elif line.startswith("VmFlags:"):
            out.append(Mapping(start, end, path, anonymous, "hg" in line[len("VmFlags:"):].split(), sizes))
        elif len(head) == 3 and head[0].endswith(":") and head[2] == "kB":
            sizes[head[0][:-1]] = int(head[1]) << 10
    out.sort(key=lambda m: m.start)
    return out


def _containing(mappings: list[Mapping], starts: list[int], address: int) -> Mapping | None:
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and mappings[i].start <= address < mappings[i].end:
        return mappings[i]
    return None


def place_on_huge_pages(module: torch.nn.Module, *, min_bytes: int = MIN_BYTES) -> int:
    """Copy ``module``'s weight storages that sit in anonymous 4 kB memory into one mapping advised for
    2 MB pages; returns the bytes moved (0 where the kernel has no huge pages or nothing qualifies).

    Every tensor keeps its identity (``Tensor.set_``), so modules, the pack cache's entries and views
    sharing a storage all see the new place; each storage stays a storage of its own size (a pack-cache
    save writes each once, as before). Call it before anything copies raw pointers out of the tensors
    and before a background pack-cache save of them starts."""
    if not huge_pages_available():
        return 0
    groups: dict[int, list[torch.Tensor]] = {}
    sizes: dict[int, int] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if t.device.type != "cpu" or t.is_sparse or t.layout != torch.strided:
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        if storage.nbytes() < min_bytes:
            continue
        groups.setdefault(storage.data_ptr(), []).append(t)
        sizes[storage.data_ptr()] = storage.nbytes()
    if not groups:
        return 0
    mappings = process_mappings()
    starts = [m.start for m in mappings]
    chosen = []
    for ptr in groups:
        where = _containing(mappings, starts, ptr)
        # Advised memory outside the heap is a mapping of ours (or a numpy array's own); inside the heap the
        # advice may be numpy's (it advises its arrays of 4 MB and more, wherever malloc put them) over
        # pages faulted in 4 kB before, which malloc then hands to anything: such storages move too.
        if where is not None and where.anonymous and (where.heap or not where.huge_advised):
            chosen.append(ptr)
    if not chosen:
        return 0
    slots = [(sizes[p] + 63) // 64 * 64 for p in chosen]
    area = _huge_page_area(sum(slots))
    offset = 0
    with torch.no_grad():
        for ptr, slot in zip(chosen, slots):
            tensors = groups[ptr]
            old = tensors[0].untyped_storage()
            # a storage of its own over this slot; its numpy base keeps the mapping alive
            new = torch.from_numpy(area[offset:offset + old.nbytes()]).untyped_storage()
            new.copy_(old)
            for t in tensors:
                t.set_(new, t.storage_offset(), t.size(), t.stride())
            offset += slot
    _return_freed_memory()
    return offset


def _huge_page_area(nbytes: int) -> np.ndarray:
    """``nbytes`` bytes of a new anonymous mapping advised for 2 MB pages, starting on a 2 MB boundary; the array
    (and any view of it) holds the mapping open, which is unmapped once the last is gone."""
    length = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to start on a 2 MB boundary
    area = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(area, dtype=np.uint8)  # holds ``area`` open while any view of it lives
    skip = (-whole.ctypes.data) % HUGE_PAGE
    area.madvise(mmap.MADV_HUGEPAGE, skip, length - skip)
    return whole[skip:skip + nbytes]


MADV_POPULATE_READ = 22  # Linux 5.14: fault a range in with one call
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a range in writable, as a write would, without writing it


def prefault_writable(tensors: Iterable[torch.Tensor]) -> int:
    """Fault in the pages under ``tensors`` as a first write would, without writing them
    (``madvise(MADV_POPULATE_WRITE)``); the bytes of the pages populated, 0 where the kernel lacks the call (before
    5.14). A tensor is a CPU tensor whose last two dimensions are contiguous rows (``cache.k[..., :n, :]`` of a
    contiguous cache): each run of them is populated, with the pages it shares at its ends.

    Why: a sequence slot's KV cache is allocated at load but left untouched (engine.cache.kv), and a slot's first
    token makes the first 2 MB page of each of its (layer, head) runs resident. The kernel zeroes those pages in the
    faulting thread, on a 2-core Zen 4 VM at 0.5-1 GB/s: the first burst of eight clients after a load waited 3.5 s
    inside one forward (the 1.5B's f32 caches of 4,096 positions, 235 MB a slot; docs/bench/kv-prefault-zen4-dec07.md).
    Nothing is written, so it is safe beside a forward that writes the same cache: a page already resident is left
    as it is. The call drops the GIL (ctypes)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    done = 0
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0 or t.dim() < 2 or t.stride(-1) != 1 or t.stride(-2) != t.size(-1):
            continue
        size = t.element_size()
        if t.is_contiguous():
            runs = [(t.data_ptr(), t.numel() * size)]
        else:
            run = t.size(-2) * t.size(-1) * size
            runs = [(t.data_ptr() + sum(i * st for i, st in zip(index, t.stride())) * size, run)
                    for index in itertools.product(*(range(n) for n in t.shape[:-2]))]
        for begin, length in runs:
            # the pages the run touches: a partial page at either end lies in the same mapping (mappings are whole
            # pages), and populating it writes nothing
            start, end = begin // page * page, -(-(begin + length) // page) * page
            if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_POPULATE_WRITE) != 0:
                return done  # EINVAL: an older kernel: the first write faults the pages in, as before
            done += end - start
    return done


def first_page_positions(buffer: torch.Tensor) -> torch.Tensor:
    """The positions of a cache buffer ``[..., positions, dim]`` up to the end of each run's first 2 MB page: what a
    first write at position 0 makes resident in memory advised for huge pages (every position for runs of 2 MB or
    less: f32 at head_dim 128 up to 4,096 positions)."""
    per_page = max(1, HUGE_PAGE // (buffer.size(-1) * buffer.element_size()))
    return buffer[..., :per_page, :]


def recache_in_huge_folios(path: str | os.PathLike) -> bool:
    """Drop ``path``'s pages from the page cache and read it back through a mapping advised for huge pages,
    so that every later mapping of it is served in 2 MB pages; True when that was done.

    For a file just written (its pages clean after fsync): a buffered write leaves it cached in small
    folios, which a later mapping can only map 4 kB at a time. The read back costs one read of the file
    from disk, done where nobody waits on it (the pack cache's background writer)."""
    if not huge_pages_available():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < HUGE_PAGE:
            return False
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
            m.madvise(mmap.MADV_HUGEPAGE)
            try:
                m.madvise(MADV_POPULATE_READ)
            except OSError:  # an older kernel: touch a byte of every page
                pages = np.frombuffer(m, dtype=np.uint8)[::4096]
                int(pages.sum())
                del pages
    finally:
        os.close(fd)
    return True


def advise_file_mappings(path: str | os.PathLike) -> int:
    """Advise this process's mappings of ``path`` for huge pages (pages read in through them afterwards
    come as 2 MB folios); returns how many mappings were advised."""
    if not huge_pages_available():
        return 0
    target = os.path.realpath(path)
    libc = ctypes.CDLL(None, use_errno=True)
    done = 0
    for m in process_mappings():
        if m.path == target and libc.madvise(ctypes.c_void_p(m.start), ctypes.c_size_t(m.end - m.start),
                                             mmap.MADV_HUGEPAGE) == 0:
            done += 1
    return done


def empty_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape)``, in an anonymous mapping advised for 2 MB pages when it is on the CPU, spans at least
    one such page and the kernel has them (else ``torch.empty`` itself).

    Why: a decode step reads every cached position's keys and values. Measured on Zen 5 (2 cores, the 1.5B's
    f32 cache; docs/bench/kv-huge-pages-zen5.md): one sequence at 4,000 positions 32.6 -> 31.4 ms a token, eight
    sequences at 1,000 positions 59.4 -> 57.8 ms a step. Pages are still only faulted in when written, now 2 MB
    at a time (a (layer, head) run of a cache is 2 MB or less for contexts up to 4,096 at head_dim 128: the
    first token makes such a cache resident whole, as llama.cpp's is from its start; a loaded model's slots have
    that done ahead, ``prefault_writable``). The mapping is unmapped when the tensor and its views are gone."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes < HUGE_PAGE or not huge_pages_available():
        return torch.empty(shape, device=device, dtype=dtype)
    return torch.from_numpy(_huge_page_area(nbytes)).view(dtype).view(shape)


def _return_freed_memory() -> None:
    """Hand the old copies' pages back to the system: glibc keeps freed heap memory for reuse, so without
    this the process would hold both copies of every weight that came from its heap."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
