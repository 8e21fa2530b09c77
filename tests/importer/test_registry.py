"""Pull and push against a real OCI registry (Debian's docker-registry, tests/registry_server.py): byte-identical
round trips, every layer kept, chunked and mounted uploads, bearer tokens, resumed and verified downloads, and
Ollama's errors for a registry that is down, a model it lacks and a token it refuses."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from blobs import MEDIA_TYPE_LICENSE, MEDIA_TYPE_MESSAGES, BlobStore, Layer
from importer.registry import Credentials, Downloads, PullSettings, RegistryError, pull_model, push_model, resolve
from importer.registry.download import part_bounds
from tests.registry_server import REGISTRY, CountingProxy, Registry, TokenIssuer, free_port
from tests.server_thread import make_store

SMALL_PARTS = PullSettings(min_part_size=1 << 18)  # 256 KiB parts: a 4 MiB layer comes in 16


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> BlobStore:
    """A store with ``tiny`` (the test pair: a DRAFT layer beside the model) and ``big``: the same model with a 4 MiB
    license and a messages layer, layers tandem does not use but must carry."""
    d = tmp_path_factory.mktemp("registry-source")
    store = make_store(d)
    manifest = store.read_manifest("tiny")
    license_text = hashlib.sha256(b"seed").hexdigest().encode() * (4 * (1 << 20) // 64)
    lic, lic_size = store.write_blob(license_text)
    msg, msg_size = store.write_blob(b'[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]')
    manifest.layers += [Layer(MEDIA_TYPE_LICENSE, lic, lic_size), Layer(MEDIA_TYPE_MESSAGES, msg, msg_size)]
    store.write_manifest("big", manifest)
    return store


def _same_model(a: BlobStore, b: BlobStore, name: str) -> None:
    data = a.read_manifest_bytes(name)
    assert b.read_manifest_bytes(name) == data
    for layer in a.read_manifest(name).all_layers():
        assert b.read_blob(layer.digest) == a.read_blob(layer.digest)


def _statuses(events) -> list[str]:
    return [e.status for e in events]


def test_names_resolve_as_ollama_resolves_them():
    ref = resolve("gemma3")
    assert (ref.base_url, ref.repository, ref.name.tag) == ("https://registry.ollama.ai", "library/gemma3", "latest")
    ref = resolve("user/model:q4", registry="http://127.0.0.1:5000")
    assert (ref.base_url, ref.repository, str(ref.name)) == ("http://127.0.0.1:5000", "user/model",
                                                             "registry.ollama.ai/user/model:q4")
    ref = resolve("example.com:5001/team/coder:v1", insecure=True, registry="http://127.0.0.1:5000")
    assert (ref.base_url, ref.repository) == ("http://example.com:5001", "team/coder")
    assert resolve("example.com/team/coder").base_url == "https://example.com"
    with pytest.raises(RegistryError, match="invalid model name"):
        resolve("bad name!")


def test_part_bounds_cover_the_blob_once():
    for size in (0, 1, 1000, (1 << 20) + 7, 50 << 20):
        bounds = part_bounds(size, PullSettings())
        assert bounds[0][0] == 0 and bounds[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert len(bounds) <= 16


def test_push_then_pull_is_byte_identical_and_keeps_every_layer(registry, source: BlobStore, tmp_path: Path):
    events = []
    push_model(source, "big", events.append, registry=registry.url)
    assert _statuses(events)[0] == "retrieving manifest" and _statuses(events)[-2:] == ["pushing manifest", "success"]
    pushed = {e.digest for e in events if e.digest}
    assert pushed == {x.digest for x in source.read_manifest("big").all_layers()}
    dest = BlobStore(tmp_path / "dest")
    events = []
    name = pull_model(dest, "big", events.append, downloads=Downloads(SMALL_PARTS), registry=registry.url)
    assert name.display() == "big:latest"
    _same_model(source, dest, "big")
    statuses = _statuses(events)
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"]
    lic = source.read_manifest("big").layer(MEDIA_TYPE_LICENSE)
    progress = [e for e in events if e.digest == lic.digest]
    assert progress[0].status == f"pulling {lic.digest[7:19]}" and progress[-1].completed == lic.size == progress[-1].total
    assert not (dest.root / "downloads").exists() or not any((dest.root / "downloads").iterdir())
    # pulled again: nothing fetched, every blob reported whole at once
    proxy = CountingProxy(registry.url)
    try:
        pull_model(dest, "big", lambda e: None, downloads=Downloads(), registry=proxy.url)
        assert proxy.blob_bytes == 0
    finally:
        proxy.close()


def test_a_large_blob_goes_in_chunks_and_a_blob_the_registry_has_is_mounted(registry, source: BlobStore):
    proxy = CountingProxy(registry.url)
    try:
        push_model(source, "big", lambda e: None, registry=proxy.url, chunk_size=1 << 20)
        lic = source.read_manifest("big").layer(MEDIA_TYPE_LICENSE)
        patches = [p for m, p in proxy.requests if m == "PATCH"]
        assert len(patches) >= lic.size // (1 << 20)  # the 4 MiB license in 1 MiB chunks
        source.copy("big", "team/big:v2")
        proxy.requests.clear()
        events = []
        push_model(source, "team/big:v2", events.append, registry=proxy.url)
        mounts = [p for m, p in proxy.requests if m == "POST" and "mount=" in p]
        assert mounts and all("from=library/big" in p for p in mounts)
        assert not [p for m, p in proxy.requests if m in ("PUT", "PATCH") and "/blobs/" in p]  # nothing uploaded
        assert _statuses(events)[-1] == "success"
    finally:
        proxy.close()


def test_bearer_challenge_is_answered_with_a_token_and_a_refused_token_is_unauthorized(registry, source, tmp_path):
    proxy = CountingProxy(registry.url)
    proxy.token = "t0ken"
    try:
        push_model(source, "tiny", lambda e: None, registry=proxy.url)
        dest = BlobStore(tmp_path / "dest")
        pull_model(dest, "tiny", lambda e: None, downloads=Downloads(), registry=proxy.url)
        _same_model(source, dest, "tiny")
        assert proxy.tokens_issued >= 2  # one per client, reused for every later request
        proxy.issue = False
        other = BlobStore(tmp_path / "other")
        with pytest.raises(RegistryError, match="^pull model manifest: unauthorized: access denied$") as e:
            pull_model(other, "tiny", lambda e: None, downloads=Downloads(), registry=proxy.url)
        assert e.value.status == 401
    finally:
        proxy.close()


def test_distribution_token_auth_pull_and_push_with_credentials(source: BlobStore, tmp_path: Path):
    """The registry itself asks for a token (distribution's token auth, a JWT signed by a key it trusts): tandem
    follows the challenge to the realm with the credentials it was given; without them the realm refuses it."""
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed")
    issuer = TokenIssuer(tmp_path / "issuer", user=("alice", "s3cret"))
    reg = Registry(tmp_path / "registry", issuer=issuer)
    try:
        alice = Credentials("alice", "s3cret")
        events = []
        push_model(source, "big", events.append, registry=reg.url, credentials=alice, chunk_size=1 << 20)
        assert events[-1].status == "success" and issuer.issued >= 1
        dest = BlobStore(tmp_path / "dest")
        pull_model(dest, "big", lambda e: None, downloads=Downloads(SMALL_PARTS), registry=reg.url, credentials=alice)
        _same_model(source, dest, "big")
        for who in (None, Credentials("alice", "wrong")):
            with pytest.raises(RegistryError, match="^pull model manifest: unauthorized: access denied$"):
                pull_model(BlobStore(tmp_path / "other"), "big", lambda e: None, downloads=Downloads(),
                           registry=reg.url, credentials=who)
        with pytest.raises(RegistryError, match="unauthorized: access denied"):
            push_model(source, "tiny", lambda e: None, registry=reg.url)
    finally:
        reg.stop()
        issuer.close()


def test_a_dropped_connection_resumes_where_it_stopped(registry, source: BlobStore, tmp_path: Path):
    push_model(source, "big", lambda e: None, registry=registry.url)
    lic = source.read_manifest("big").layer(MEDIA_TYPE_LICENSE)
    proxy = CountingProxy(registry.url)
    proxy.cut_after = 100_000  # the first blob response ends after 100 kB
    try:
        dest = BlobStore(tmp_path / "dest")
        pull_model(dest, "big", lambda e: None, downloads=Downloads(PullSettings(min_part_size=8 << 20)),
                   registry=proxy.url)
        _same_model(source, dest, "big")
        total = sum(x.size for x in source.read_manifest("big").all_layers() if x.media_type != "")
        assert proxy.cut_after is None and proxy.blob_bytes <= total  # the cut bytes were not fetched again
        assert lic.size > 100_000
    finally:
        proxy.close()


def test_parts_left_by_a_killed_pull_are_not_fetched_again(registry, source: BlobStore, tmp_path: Path):
    push_model(source, "big", lambda e: None, registry=registry.url)
    lic = source.read_manifest("big").layer(MEDIA_TYPE_LICENSE)
    dest = BlobStore(tmp_path / "dest")
    # what a pull killed part-way leaves: the first parts whole, the next one half written
    folder = dest.root / "downloads" / lic.digest.replace(":", "-")
    folder.mkdir(parents=True)
    data = source.read_blob(lic.digest)
    bounds = part_bounds(lic.size, SMALL_PARTS)
    for i, (start, end) in enumerate(bounds[:5]):
        (folder / f"part-{i}").write_bytes(data[start:end if i < 4 else (start + end) // 2])
    kept = sum(f.stat().st_size for f in folder.iterdir())
    proxy = CountingProxy(registry.url)
    try:
        pull_model(dest, "big", lambda e: None, downloads=Downloads(SMALL_PARTS), registry=proxy.url)
        _same_model(source, dest, "big")
        others = sum(x.size for x in source.read_manifest("big").all_layers() if x.digest != lic.digest)
        assert proxy.blob_bytes == others + lic.size - kept
        assert not folder.exists()
    finally:
        proxy.close()


def test_a_corrupted_blob_is_refused_and_leaves_nothing(registry, source: BlobStore, tmp_path: Path):
    push_model(source, "big", lambda e: None, registry=registry.url)
    lic = source.read_manifest("big").layer(MEDIA_TYPE_LICENSE)
    stored = registry.blob_file(lic.digest)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    dest = BlobStore(tmp_path / "dest")
    with pytest.raises(RegistryError, match=f"^digest mismatch, file must be downloaded again: want {lic.digest}, got "):
        pull_model(dest, "big", lambda e: None, downloads=Downloads(SMALL_PARTS), registry=registry.url)
    assert dest.list_blobs() == [] and dest.list_models() == []
    assert not any((dest.root / "downloads").iterdir())


def test_a_registry_down_or_without_the_model_answers_as_ollama(registry, tmp_path: Path):
    dest = BlobStore(tmp_path / "dest")
    with pytest.raises(RegistryError, match="^pull model manifest: file does not exist$") as e:
        pull_model(dest, "no-such-model", lambda e: None, downloads=Downloads(), registry=registry.url)
    assert e.value.status == 404
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError, match=f'^pull model manifest: Get "{down}/v2/library/tiny/manifests/latest": '
                                            "connection refused$"):
        pull_model(dest, "tiny", lambda e: None, downloads=Downloads(), registry=down)
    assert dest.list_models() == []


def test_two_pulls_of_one_model_share_one_download(registry, source: BlobStore, tmp_path: Path):
    push_model(source, "big", lambda e: None, registry=registry.url)
    proxy = CountingProxy(registry.url)
    proxy.delay = 0.01  # long enough for the second pull to find the first one's downloads running
    downloads = Downloads(SMALL_PARTS)
    dest = BlobStore(tmp_path / "dest")
    errors: list[BaseException] = []
    reported: list[list] = [[], []]

    def pull(i: int) -> None:
        try:
            pull_model(dest, "big", reported[i].append, downloads=downloads, registry=proxy.url)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=pull, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        _same_model(source, dest, "big")
        assert proxy.blob_bytes == sum(x.size for x in source.read_manifest("big").all_layers())
        assert all(_statuses(r)[-1] == "success" for r in reported)
    finally:
        proxy.close()


def test_the_manifest_is_written_only_after_every_blob(registry, source: BlobStore, tmp_path: Path):
    push_model(source, "big", lambda e: None, registry=registry.url)
    proxy = CountingProxy(registry.url)
    proxy.delay = 0.005
    dest = BlobStore(tmp_path / "dest")
    seen_models = []

    def progress(event) -> None:
        if event.status.startswith("pulling "):
            seen_models.append(len(dest.list_models()))

    try:
        pull_model(dest, "big", progress, downloads=Downloads(SMALL_PARTS), registry=proxy.url)
        assert seen_models and set(seen_models) == {0}
        assert os.path.exists(dest.manifest_path("big"))
    finally:
        proxy.close()
