"""Weights on 2 MB pages (engine.ops.memory): what a load builds is moved into memory advised for huge
pages, with every tensor keeping its identity, its values and its views; what is mapped from a file, what
is small and what was already moved stays where it is; a loaded model's logits do not change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.models import loader
from engine.ops import memory
from engine.ops.memory import huge_pages_available, place_on_huge_pages, process_mappings
from tests.tiny_gguf import TinySpec, write_tiny_gguf

needs_thp = pytest.mark.skipif(not huge_pages_available(), reason="this kernel has no transparent huge pages")

SMAPS = """\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
Size:               4096 kB
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me ac sd hg
7f0000400000-7f0000800000 r--s 00001000 fd:01 123456                     /store/packed-qdot.pt
Size:               4096 kB
VmFlags: rd mr me ms sd
"""


def _where(t: torch.Tensor) -> memory.Mapping:
    ptr = t.untyped_storage().data_ptr()
    found = [m for m in process_mappings() if m.start <= ptr < m.end]
    assert len(found) == 1
    return found[0]


def _placed(t: torch.Tensor) -> bool:
    """In a mapping advised for huge pages outside the heap: where placement puts a storage. (Part of the
    heap may be advised too: numpy advises its large arrays wherever malloc put them.)"""
    where = _where(t)
    return where.huge_advised and not where.heap


def test_mappings_are_read_with_their_kind_and_advice():
    heap, anon, file = process_mappings(SMAPS)
    assert (heap.start, heap.end) == (0x55d0c0000000, 0x55d0c0021000)
    assert heap.anonymous and heap.heap and not heap.huge_advised
    assert anon.anonymous and anon.huge_advised and not anon.heap
    assert not file.anonymous and not file.huge_advised and not file.heap
    assert file.path == "/store/packed-qdot.pt" and anon.sizes == {"Size": 4096 << 10, "AnonHugePages": 2048 << 10}


@needs_thp
def test_built_weights_move_onto_memory_advised_for_huge_pages():
    m = torch.nn.Module()
    m.register_buffer("codes", torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8))  # 1 MB
    m.register_buffer("rows", m.codes.view(1024, 1024)[10:20])  # a view of the same storage
    m.register_buffer("norm", torch.ones(16))  # small: stays
    m.weight = torch.nn.Parameter(torch.randn(512, 256), requires_grad=False)
    codes, weight, norm_ptr = m.codes.clone(), m.weight.clone(), m.norm.data_ptr()
    assert not _placed(m.codes) and not _placed(m.weight)

    moved = place_on_huge_pages(m)

    assert moved >= (1 << 20) + 512 * 256 * 4
    assert _placed(m.codes) and _placed(m.weight)
    assert torch.equal(m.codes, codes) and torch.equal(m.weight, weight)
    assert m.norm.data_ptr() == norm_ptr
    m.codes[10 * 1024 + 3] = 77  # the view still shares its storage
    assert m.rows[0, 3].item() == 77
    assert m.codes.untyped_storage().nbytes() == 1 << 20  # a storage of its own size, not the whole mapping
    assert place_on_huge_pages(m) == 0  # nothing left to move


@needs_thp
def test_weights_mapped_from_a_file_stay_there(tmp_path):
    torch.save({"w": torch.randn(256, 256)}, tmp_path / "packs.pt")
    m = torch.nn.Module()
    m.register_buffer("w", torch.load(tmp_path / "packs.pt", mmap=True, weights_only=True)["w"])
    ptr = m.w.data_ptr()
    assert place_on_huge_pages(m) == 0
    assert m.w.data_ptr() == ptr


@needs_thp
def test_a_loaded_model_has_its_weights_on_huge_pages_and_the_same_logits(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", n_embd=256, n_ff=512, seed=5))
    ids = [1, 5, 9, 2, 7]
    placed = loader.load_model(path, "f32")
    assert _placed(placed.layers[0].ffn.w2.weight)
    monkeypatch.setattr(loader, "place_on_huge_pages", lambda module: 0)
    plain = loader.load_model(path, "f32")
    assert not _placed(plain.layers[0].ffn.w2.weight)
    assert torch.equal(placed(ids, placed.new_cache(16)), plain(ids, plain.new_cache(16)))


@needs_thp
def test_storages_in_advised_heap_memory_still_move(monkeypatch):
    """numpy advises its arrays of 4 MB and more for huge pages wherever malloc put them, the brk heap
    included, and malloc later hands that advised heap memory (faulted in 4 kB pages) to other
    allocations: advice alone does not mean a storage was placed."""
    m = torch.nn.Module()
    m.register_buffer("codes", torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8))
    old = m.codes.data_ptr()
    real = memory.process_mappings

    def as_advised_heap(smaps=None):
        return [dataclasses.replace(x, path="[heap]", huge_advised=True) if x.start <= old < x.end else x
                for x in real(smaps)]

    monkeypatch.setattr(memory, "process_mappings", as_advised_heap)
    assert place_on_huge_pages(m) >= 1 << 20
    assert m.codes.data_ptr() != old and _placed(m.codes)


@needs_thp
def test_a_kv_cache_is_allocated_on_memory_advised_for_huge_pages_and_given_back():
    from engine.cache.kv import KVCache

    cache = KVCache(4, 2, 128, 2048)  # 8 MB for each of K and V
    for t in (cache.k, cache.v):
        assert _placed(t) and t.data_ptr() % memory.HUGE_PAGE == 0
        assert t.shape[2] == 2048 and t.dtype == torch.float32 and t.is_contiguous()
    cache.k[3, 1, 2047] = 2.5  # the last element is writable and reads back
    assert float(cache.k[3, 1, 2047, 127]) == 2.5
    start = cache.k.untyped_storage().data_ptr()
    del cache
    assert not any(m.start <= start < m.end for m in process_mappings())  # unmapped with the tensor


def test_a_small_or_non_cpu_cache_is_a_plain_allocation():
    small = memory.empty_on_huge_pages((2, 16, 64), torch.float32, torch.device("cpu"))
    assert small.shape == (2, 16, 64) and not _placed(small)
    meta = memory.empty_on_huge_pages((64, 1 << 16), torch.float32, torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == (64, 1 << 16)


def _resident_fraction(t: torch.Tensor) -> float:
    """The share of ``t``'s whole pages that are resident (mincore)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    vec = (ctypes.c_ubyte * ((end - start) // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec) / len(vec)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux")
def test_prefault_makes_what_a_first_token_touches_resident_and_writes_nothing():
    from engine.cache.kv import KVCache

    cache = KVCache(4, 2, 128, 4096)  # 16 MB for each of K and V (2 MB a run): untouched until written
    cache.k[0, 0, :3] = 1.5  # a forward's first positions, written before the prefault reaches them
    assert _resident_fraction(cache.v) < 0.5
    done = memory.prefault_writable(cache.first_write_views())
    if done == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    assert done == 2 * 16 << 20
    assert _resident_fraction(cache.k) == 1.0 and _resident_fraction(cache.v) == 1.0
    assert bool((cache.k[0, 0, :3] == 1.5).all())  # nothing written by it

    # A longer context: only each (layer, head) run's first 2 MB, as a first token would; the rest stays virtual.
    long = KVCache(2, 2, 128, 16384)  # 8 MB a run
    assert memory.prefault_writable(long.first_write_views()) == 2 * 2 * 2 * (2 << 20)
    assert _resident_fraction(long.k) == pytest.approx(0.25) and _resident_fraction(long.v) == pytest.approx(0.25)
    assert _resident_fraction(long.k[1, 1, :4096]) == 1.0 and _resident_fraction(long.k[1, 1, 4096:]) == 0.0


def test_a_loaded_runtime_prefaults_every_slot_cache(tmp_path):
    """A load with four slots makes all four caches resident (and the draft model's caches), off the compute
    thread: a slot's first token no longer faults its whole cache in inside a forward others wait on."""
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    target = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, seed=1))
    draft = write_tiny_gguf(tmp_path / "d.gguf", TinySpec(arch="llama", n_layer=1, seed=2))
    rt = ModelRuntime.load(LoadSpec(model_path=str(target), draft_path=str(draft), num_ctx=8192, num_parallel=4))
    try:
        rt.prefault.join(timeout=60)
        assert not rt.prefault.is_alive()
        buffers = rt._cache_buffers(rt.slots.slots)
        assert len(buffers) == 4 * 2 * 2  # four slots: the target's K and V, the draft model's K and V
        assert all(b.data_ptr() == b.untyped_storage().data_ptr() for b in buffers)
        if memory.prefault_writable(buffers[:1]) == 0:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
        assert all(_resident_fraction(b) == 1.0 for b in buffers)
    finally:
        rt.close()
