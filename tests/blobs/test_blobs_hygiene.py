"""Issue 15, part 5, in the store: partial files of dead writers go with the next writer or `tandem list`
(a live writer's stay), a full disk is a plain "no space left on device" that leaves nothing partial, and a
FIFO or device handed to add_file is refused without being read.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks.serving import free_port
from blobs import BlobStore, NoSpaceError, NotRegularFileError
from blobs import store as store_mod
from server.cli.commands import cmd_list

ROOT = Path(__file__).resolve().parents[2]
# A writer that stops half-way: its partial file stays on disk, flock-ed for as long as the process lives.
WRITER = """
import sys, time
from blobs import BlobStore
def chunks():
    yield b"half a model " * 1000
    print("writing", flush=True)
    time.sleep(120)
    yield b"never"
BlobStore(sys.argv[1]).write_blob(chunks())
"""


def _writer(root: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "writing"
    return p


def _partials(store: BlobStore) -> list[str]:
    return sorted(n for n in os.listdir(store.blobs_dir) if "-partial-" in n)


def test_dead_writers_partials_go_with_the_next_writer_and_list_live_ones_stay(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # `tandem list` asks a server when one answers at TANDEM_HOST (then the server's store is listed, not this one):
    # a port nothing listens on, whatever runs on this host's default one
    monkeypatch.setenv("TANDEM_HOST", f"127.0.0.1:{free_port()}")
    store = BlobStore(tmp_path / "models")
    live, dead = _writer(store.root), _writer(store.root)
    try:
        dead.kill()
        dead.wait(10)
        assert len(_partials(store)) == 2
        store.write_blob(b"the next writer")
        assert len(_partials(store)) == 1  # the killed writer's file went; the live writer's did not
        cmd_list(None, store)
        assert len(_partials(store)) == 1 and live.poll() is None
    finally:
        live.kill()
        live.wait(10)
    cmd_list(None, store)  # `tandem list`
    assert _partials(store) == []


def test_a_full_disk_says_so_and_leaves_nothing_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BlobStore(tmp_path / "models")
    store.write_blob(b"before")

    def full(self, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(store_mod._Partial, "write", full)
    with pytest.raises(NoSpaceError) as e:
        store.write_blob(b"x" * 3_000_000)
    assert str(e.value) == "no space left on device" and e.value.errno == errno.ENOSPC
    assert _partials(store) == [] and len(store.list_blobs()) == 1


def test_add_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "models")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def add(path: str) -> None:
        try:
            store.add_file(path)
        except BaseException as e:  # noqa: BLE001 - collected for the assertions
            errors.append(e)

    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        t = threading.Thread(target=add, args=(path,), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"add_file({path}) blocked or kept reading"
    assert [type(e) for e in errors] == [NotRegularFileError] * 3
    assert store.list_blobs() == []
