"""The packed-weight cache (engine.ops.pack_cache): a load that builds the qdot layout saves it beside the store,
the next load maps it instead of packing (same weights, same logits), and a cache that is stale, corrupt or
the wrong shape is ignored and rebuilt, never trusted; removing the model's blob removes its cache."""

from __future__ import annotations

import time

import pytest
import torch

from engine.ops import linear as L
from engine.ops import memory, pack_cache
from engine.ops.kernels import qdot_status
from engine.models.loader import load_model
from tests.tiny_gguf import TinySpec, write_tiny_gguf

pytestmark = pytest.mark.skipif(not qdot_status().available, reason="the qdot kernel is not built here")

IDS = [1, 5, 9, 2, 7]


@pytest.fixture
def gguf(tmp_path):
    return write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", seed=3))


def _logits(model) -> torch.Tensor:
    return model(IDS, model.new_cache(16))


def _load(path, fmt: str = "qdot", packs=None):
    """load_model, then wait for its cache write (it runs in the background)."""
    model = load_model(path, fmt, pack_dir=packs)
    if model.gguf.packs is not None:
        model.gguf.packs.wait()
    return model


def _no_packing(monkeypatch):
    def fail(srcs):
        raise AssertionError(f"packed {srcs[0].name} again instead of mapping the cache")
    monkeypatch.setattr(L, "_qdot_weight", fail)


def test_a_second_load_maps_the_packed_weights(gguf, tmp_path, monkeypatch):
    packs = tmp_path / "packed"
    cold = _load(gguf, "qdot", packs)
    [saved] = list(packs.glob("*.pt"))
    assert cold.gguf.packs.hits == 0 and not list(packs.glob(".pack-*"))  # written atomically, no temp left
    _no_packing(monkeypatch)
    warm = _load(gguf, "qdot", packs)
    assert warm.gguf.packs.hits > 0 and warm.gguf.packs.misses == 0
    assert torch.equal(_logits(warm), _logits(cold))
    assert list(packs.glob("*.pt")) == [saved]  # nothing rewritten when everything was found


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stale layout", "wrong shape"])
def test_a_bad_cache_is_rebuilt_not_trusted(gguf, tmp_path, monkeypatch, damage):
    packs = tmp_path / "packed"
    want = _logits(_load(gguf, "qdot", packs))
    [path] = list(packs.glob("*.pt"))
    if damage == "garbage":
        path.write_bytes(b"not a cache")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "stale layout":
        monkeypatch.setattr(pack_cache, "LAYOUT_VERSION", pack_cache.LAYOUT_VERSION + 1)
    else:
        data = torch.load(path, weights_only=True)
        key = next(iter(data["entries"]))
        data["entries"][key]["codes"] = data["entries"][key]["codes"][:1]
        torch.save(data, path)
    model = _load(gguf, "qdot", packs)
    assert model.gguf.packs.misses == 0  # saved again after the rebuild
    assert torch.equal(_logits(model), want)
    _no_packing(monkeypatch)
    again = _load(gguf, "qdot", packs)  # and the rebuilt file serves the next load
    assert again.gguf.packs.hits > 0 and torch.equal(_logits(again), want)


def test_other_formats_and_no_directory_pack_as_before(gguf, tmp_path):
    assert load_model(gguf, "qdot").gguf.packs is None
    _load(gguf, "int8", tmp_path / "packed")
    assert not list((tmp_path / "packed").glob("*.pt"))  # only the qdot layout is cached


def test_removing_the_blob_removes_its_packed_weights(tmp_path):
    from blobs import BlobStore
    from importer import CreateRequest, create_model

    store = BlobStore(tmp_path / "models")
    digest, _ = store.add_file(write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", seed=3)))
    create_model(store, CreateRequest(model="q", files={"m.gguf": digest}))
    packs = store.root / store.DERIVED_DIR
    _load(store.blob_path(digest), "qdot", packs)
    [path] = list(packs.glob("*.pt"))
    assert path.name.startswith(digest.split(":")[1][:16] + "-")
    store.delete("q")
    assert not path.exists()


def test_the_server_caches_beside_its_store(tmp_path):
    """Served models load through the cache under the store's ``packed/`` directory; after an unload the
    next load finds it (the engine reports nothing of it, so the file is what is checked)."""
    import httpx

    from blobs import BlobStore
    from importer import CreateRequest, create_model
    from server.settings import Settings
    from tests.server_thread import ServerThread

    store = BlobStore(tmp_path / "models")
    digest, _ = store.add_file(write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", seed=3)))
    create_model(store, CreateRequest(model="q", files={"m.gguf": digest}, parameters={"temperature": 0.0,
                                                                                      "weight_format": "qdot"}))
    with ServerThread(store, Settings(num_thread=1)) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        body = {"model": "q", "prompt": "hi", "stream": False, "options": {"num_predict": 6}}
        first = http.post("/api/generate", json={**body, "keep_alive": 0}).json()
        # written in the background and finished by the exiting engine, after the answer: wait for it
        pattern, deadline = digest.split(":")[1][:16] + "-qdot-*.pt", time.monotonic() + 60
        while not (found := list((store.root / "packed").glob(pattern))) and time.monotonic() < deadline:
            time.sleep(0.1)
        [path] = found
        mtime = path.stat().st_mtime_ns
        second = http.post("/api/generate", json=body).json()
        assert second["response"] == first["response"]
        assert path.stat().st_mtime_ns == mtime  # found, not rewritten


def test_the_runtime_finishes_its_cache_writes(tmp_path, gguf):
    """What an exiting engine waits on (engine.process.worker): every file's background write, done."""
    from engine.contract.protocol import LoadSpec
    from engine.runtime import ModelRuntime

    runtime = ModelRuntime.load(LoadSpec(model_path=str(gguf), num_ctx=64, device="cpu", weight_format="qdot",
                                         num_thread=1, pack_dir=str(tmp_path / "packed")))
    try:
        assert runtime.finish_writes(60)
        assert len(list((tmp_path / "packed").glob("*.pt"))) == 1
        assert not list((tmp_path / "packed").glob(".pack-*.tmp"))
    finally:
        runtime.close()


def _file_pmd_mapped(path) -> tuple[int, bool]:
    """(FilePmdMapped bytes, advised for huge pages) over this process's mappings of ``path``."""
    mine = [m for m in memory.process_mappings() if m.path == str(path)]
    return sum(m.sizes.get("FilePmdMapped", 0) for m in mine), any(m.huge_advised for m in mine)


def _folio_support(directory) -> bool:
    """Whether this kernel and filesystem cache a file in 2 MB folios when read through an advised mapping."""
    import mmap
    import os
    probe = directory / "probe.bin"
    probe.write_bytes(os.urandom(8 << 20))
    if not memory.recache_in_huge_folios(probe):
        return False
    with open(probe, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        _ = bytes(m[::4096])
        return _file_pmd_mapped(probe.resolve())[0] > 0


@pytest.mark.skipif(not memory.huge_pages_available(), reason="this kernel has no transparent huge pages")
def test_a_written_cache_is_mapped_in_2mb_pages_by_the_next_load(tmp_path):
    """A buffered write leaves the file cached in small folios, which a mapping can only map 4 kB at a time:
    the writer reads it back in 2 MB folios, and the next load's mapping of it is advised for them."""
    if not _folio_support(tmp_path):
        pytest.skip("this filesystem does not cache files in 2 MB folios")
    big = write_tiny_gguf(tmp_path / "big.gguf", TinySpec(arch="qwen2", dtype="Q8_0", n_embd=512, n_ff=2048, seed=4))
    packs = tmp_path / "packed"
    _load(big, "qdot", packs)
    [path] = [p.resolve() for p in packs.glob("*.pt")]
    warm = _load(big, "qdot", packs)
    assert warm.gguf.packs.hits > 0
    _logits(warm)  # every weight read through the mapping
    pmd, advised = _file_pmd_mapped(path)
    assert advised and pmd >= 2 << 20
