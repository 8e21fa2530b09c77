"""Issue 15, part 1: `/api/create` over HTTP never copies a server file the operator did not allow.

A real server (tests/server_thread.py) whose allow-list (TANDEM_CREATE_PATHS) is one temp directory; secrets,
FIFOs, device files and symlinks are tried through the old `{"modelfile", "path"}` form. Every refusal must read
the same (nothing about the path's existence), nothing may reach the store, and nothing may block.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import httpx
import pytest

from blobs import BlobStore
from importer import CreateError, PathGate
from server.settings import Settings
from tests.server_thread import ServerThread, write_pair

REFUSED = "local paths are not readable through the API"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    allowed = tmp_path_factory.mktemp("allowed")
    outside = tmp_path_factory.mktemp("outside")
    write_pair(allowed)
    (outside / "shadow").write_bytes(b"root:$6$secret-hash:19000:0:99999:7:::\n")
    (outside / "private").write_bytes(b"only the owner may read this\n")
    (outside / "private").chmod(0o600)
    shutil.copy(allowed / "target.gguf", outside / "real.gguf")  # a valid model, only in the wrong place
    (allowed / "link.gguf").symlink_to(outside / "real.gguf")
    (allowed / "folder").mkdir()
    (allowed / "folder" / "model.gguf").symlink_to(outside / "real.gguf")
    (allowed / "inner.gguf").symlink_to(allowed / "target.gguf")  # a link that stays inside is fine
    os.mkfifo(allowed / "pipe.gguf")
    with ServerThread(BlobStore(allowed.parent / "h15-models"), Settings(num_thread=1, create_paths=(allowed,))) as s:
        s.allowed, s.outside = allowed, outside
        yield s


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=20) as c:
        yield c


def _old_form(http: httpx.Client, modelfile: str, path: str | None = None) -> httpx.Response:
    body = {"name": "leak", "modelfile": modelfile, "stream": False}
    if path is not None:
        body["path"] = path
    return http.post("/api/create", json=body)


def _blobs(srv: ServerThread) -> set[str]:
    return set(os.listdir(srv.store.blobs_dir)) if srv.store.blobs_dir.exists() else set()


def test_files_outside_the_allow_list_are_refused_alike_and_never_stored(http: httpx.Client, srv: ServerThread) -> None:
    before = _blobs(srv)
    missing = srv.outside / "no-such-file"
    cases = {
        f"FROM {srv.outside / 'shadow'}": f"FROM {srv.outside / 'shadow'}",  # 0644, readable, outside
        f"FROM {srv.outside / 'private'}": f"FROM {srv.outside / 'private'}",  # 0600
        f"FROM {srv.outside / 'real.gguf'}": f"FROM {srv.outside / 'real.gguf'}",  # a valid GGUF, outside
        f"FROM {srv.outside}": f"FROM {srv.outside}",  # a directory
        f"FROM {missing}": f"FROM {missing}",  # does not exist
        f"FROM {srv.allowed / 'target.gguf'}\nDRAFT {srv.outside / 'real.gguf'}": f"DRAFT {srv.outside / 'real.gguf'}",
        f"FROM {srv.allowed / 'target.gguf'}\nDRAFT {missing}": f"DRAFT {missing}",
        f"FROM {srv.allowed / 'target.gguf'}\nADAPTER {srv.outside / 'shadow'}": f"ADAPTER {srv.outside / 'shadow'}",
    }
    escape = f"FROM ../{srv.outside.name}/shadow"  # relative, out of the allowed directory
    cases[escape] = escape
    texts = set()
    for modelfile, what in cases.items():
        r = _old_form(http, modelfile, str(srv.allowed))
        assert r.status_code == 400, (modelfile, r.text)
        error = r.json()["error"]
        assert error.startswith(f"{what}: {REFUSED}"), (modelfile, error)
        texts.add(error.removeprefix(what))
    assert len(texts) == 1  # missing, unreadable, outside, a directory: one text
    # `path` itself (the Modelfile's location) is held to the list too, and relative FROMs without it
    r = _old_form(http, "FROM ./shadow", str(srv.outside / "shadow"))
    assert r.status_code == 400 and r.json()["error"] == f"path {srv.outside / 'shadow'}{texts.pop()}"
    r = _old_form(http, "FROM ./shadow")
    assert r.status_code == 400 and REFUSED in r.json()["error"]
    secret = "sha256:" + hashlib.sha256((srv.outside / "shadow").read_bytes()).hexdigest()
    assert http.head(f"/api/blobs/{secret}").status_code == 404
    assert _blobs(srv) == before


def test_device_files_and_fifos_are_never_read(http: httpx.Client, srv: ServerThread) -> None:
    before = _blobs(srv)
    # /dev/zero would be copied until the disk is full; the FIFO (inside the allowed directory) would block.
    for modelfile in ("FROM /dev/zero", "FROM /dev/urandom", "FROM ./pipe.gguf",
                      "FROM ./target.gguf\nDRAFT ./pipe.gguf"):
        r = _old_form(http, modelfile, str(srv.allowed))
        assert r.status_code == 400 and REFUSED in r.json()["error"], (modelfile, r.text)
    assert _blobs(srv) == before
    # Not even an operator who lists /dev makes a device readable.
    with pytest.raises(CreateError, match=REFUSED):
        PathGate(["/dev"]).admit(Path("/dev/zero"), "FROM", "/dev/zero")


def test_a_symlink_out_of_the_allowed_directory_is_refused(http: httpx.Client, srv: ServerThread) -> None:
    before = _blobs(srv)
    for modelfile in ("FROM ./link.gguf", "FROM ./folder", f"FROM {srv.allowed / 'link.gguf'}"):
        r = _old_form(http, modelfile, str(srv.allowed))
        assert r.status_code == 400 and REFUSED in r.json()["error"], (modelfile, r.text)
    assert _blobs(srv) == before


def test_files_in_the_allowed_directory_are_read(http: httpx.Client, srv: ServerThread) -> None:
    r = http.post("/api/create", json={"name": "allowed", "modelfile": "FROM ./inner.gguf\nDRAFT ./draft.gguf\n",
                                       "path": str(srv.allowed), "stream": False})
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    r = http.post("/api/create", json={"name": "allowed-abs", "modelfile": f"FROM {srv.allowed / 'target.gguf'}\n",
                                       "stream": False})
    assert (r.status_code, r.json()) == (200, {"status": "success"})
    model = "sha256:" + hashlib.sha256((srv.allowed / "target.gguf").read_bytes()).hexdigest()
    assert oct(srv.store.blob_path(model).stat().st_mode & 0o777) == "0o644"


def test_no_allow_list_by_default() -> None:
    assert Settings.from_env({}).create_paths == ()
    assert Settings.from_env({"TANDEM_CREATE_PATHS": f" /srv/models{os.pathsep}{os.pathsep}~/gguf "}).create_paths == (
        Path("/srv/models"), Path("~/gguf").expanduser())
    with pytest.raises(CreateError, match=REFUSED):
        PathGate([]).admit(Path("/"), "FROM", "/")
