import hashlib
import io
import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from blobs import (
    MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_LICENSE,
    MEDIA_TYPE_MANIFEST,
    MEDIA_TYPE_MANIFEST_LIST,
    MEDIA_TYPE_MODEL,
    MEDIA_TYPE_PARAMS,
    MEDIA_TYPE_TEMPLATE,
    BlobNotFoundError,
    BlobStore,
    BlobsError,
    CorruptBlobError,
    DigestMismatchError,
    InvalidDigestError,
    InvalidManifestError,
    InvalidNameError,
    Layer,
    Manifest,
    ModelName,
    ModelNotFoundError,
    default_models_root,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def blob_files(store: BlobStore) -> list[str]:
    return sorted(os.listdir(store.blobs_dir)) if store.blobs_dir.exists() else []


def make_model(store: BlobStore, name: str, *parts: bytes) -> Manifest:
    """A model whose config is derived from its layers, so equal layers give equal manifests."""
    kinds = [MEDIA_TYPE_MODEL, MEDIA_TYPE_TEMPLATE, MEDIA_TYPE_PARAMS, MEDIA_TYPE_LICENSE]
    layers = []
    for kind, data in zip(kinds, parts):
        digest, size = store.write_blob(data)
        layers.append(Layer(kind, digest, size))
    cfg_digest, cfg_size = store.add_json_blob({"model_format": "gguf", "layers": [x.digest for x in layers]})
    m = Manifest(Layer(MEDIA_TYPE_CONFIG, cfg_digest, cfg_size), layers)
    store.write_manifest(name, m)
    return m


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "models")


# --- blobs ---------------------------------------------------------------------------------


def test_root_and_default_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", f"  \"{tmp_path / 'x'}\" ")
    assert default_models_root() == tmp_path / "x"
    assert BlobStore().root == tmp_path / "x"
    monkeypatch.setenv("TANDEM_MODELS", ' "" ')
    assert default_models_root() == Path.home() / ".tandem" / "models"
    monkeypatch.delenv("TANDEM_MODELS")
    assert default_models_root() == Path.home() / ".tandem" / "models"
    assert BlobStore(str(tmp_path)).root == tmp_path


def test_blob_path_forms(store):
    hexd = "ab" * 32
    expected = store.root / "blobs" / f"sha256-{hexd}"
    assert store.blob_path(f"sha256:{hexd}") == expected
    assert store.blob_path(f"sha256-{hexd}") == expected
    assert store.blob_path(f"sha256:{hexd.upper()}") == expected
    for bad in ["sha256:abc", f"sha1:{hexd}", hexd, f"sha256:{hexd}/../x", ""]:
        with pytest.raises(InvalidDigestError, match="^invalid digest format$"):
            store.blob_path(bad)
    assert not store.has_blob(f"sha256:{hexd}")


@pytest.mark.parametrize(
    "make_input",
    [
        lambda d: d,
        lambda d: bytearray(d),
        lambda d: memoryview(d),
        lambda d: io.BytesIO(d),
        lambda d: [d[:1000], b"", d[1000:2_000_000], d[2_000_000:]],
        lambda d: (d[i : i + 333_333] for i in range(0, len(d), 333_333)),
    ],
    ids=["bytes", "bytearray", "memoryview", "file", "list", "generator"],
)
def test_write_blob_inputs_and_progress(store, make_input):
    data = payload(1, 2_500_000)
    seen = []
    digest, size = store.write_blob(make_input(data), progress=seen.append)
    assert (digest, size) == (sha(data), len(data))
    assert seen == sorted(seen) and seen[-1] == len(data) and len(seen) > 1
    assert store.read_blob(digest) == data
    assert blob_files(store) == [digest.replace(":", "-")]
    assert oct(store.blob_path(digest).stat().st_mode & 0o777) == oct(0o644)
    store.verify_blob(digest)


def test_write_blob_rejects_text(store):
    with pytest.raises(TypeError):
        store.write_blob("text")
    with pytest.raises(TypeError):
        store.write_blob(io.StringIO("text"))
    with pytest.raises(TypeError):
        store.write_blob([b"ok", "text"])
    assert blob_files(store) == []


def test_write_blob_expected_digest(store):
    data = b"weights" * 1000
    assert store.write_blob(data, sha(data).replace(":", "-")) == (sha(data), len(data))

    other = b"something else"
    with pytest.raises(DigestMismatchError) as ei:
        store.write_blob(other, sha(data.upper()))
    assert str(ei.value) == f'digest mismatch, expected "{sha(data.upper())}", got "{sha(other)}"'
    # neither a blob under either name nor a temp file is left behind
    assert blob_files(store) == [sha(data).replace(":", "-")]

    with pytest.raises(InvalidDigestError):
        store.write_blob(data, "sha256:nothex")


def test_write_existing_blob_verifies_but_keeps_file(store):
    data = b"model bytes" * 100
    digest, _ = store.write_blob(data)
    path = store.blob_path(digest)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    before = path.stat()

    assert store.write_blob(io.BytesIO(data), digest) == (digest, len(data))
    assert store.write_blob(data) == (digest, len(data))  # digest unknown up front: temp then discard
    with pytest.raises(DigestMismatchError):
        store.write_blob(b"wrong", digest)

    after = path.stat()
    assert (after.st_ino, after.st_mtime) == (before.st_ino, before.st_mtime)
    assert blob_files(store) == [path.name]


def test_write_blob_error_mid_stream_leaves_nothing(store):
    def gen():
        yield b"x" * 100_000
        raise RuntimeError("client went away")

    with pytest.raises(RuntimeError):
        store.write_blob(gen(), sha(b"whatever"))
    assert blob_files(store) == []


def test_add_file_copies_not_links(store, tmp_path):
    src = tmp_path / "model.gguf"
    data = payload(2, 3_000_000)
    src.write_bytes(data)
    seen = []
    digest, size = store.add_file(src, progress=seen.append)
    assert (digest, size) == (sha(data), len(data)) and seen[-1] == len(data)
    blob = store.blob_path(digest)
    assert not os.path.samefile(src, blob)
    assert src.stat().st_nlink == 1 and blob.stat().st_nlink == 1
    # editing the source in place later must not change the stored blob
    with open(src, "r+b") as f:
        f.write(b"EDITED")
    store.verify_blob(digest)
    assert store.read_blob(digest) == data
    with pytest.raises(FileNotFoundError):
        store.add_file(tmp_path / "missing.gguf")


def test_open_read_verify(store):
    digest, _ = store.write_blob(b"abc" * 1000)
    with store.open_blob(digest.replace(":", "-")) as f:
        assert f.read(3) == b"abc"

    missing = sha(b"missing")
    for fn in (store.open_blob, store.read_blob, store.verify_blob):
        with pytest.raises(BlobNotFoundError) as ei:
            fn(missing)
        assert str(ei.value) == f'blob "{missing}" not found'
        assert isinstance(ei.value, BlobsError)

    # bit rot / tampering on disk
    path = store.blob_path(digest)
    raw = bytearray(path.read_bytes())
    raw[1500] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBlobError) as ei:
        store.verify_blob(digest)
    assert digest in str(ei.value) and ei.value.digest == digest and ei.value.actual == sha(bytes(raw))


def test_add_json_blob_is_go_json_marshal(store):
    params = {"temperature": 1.0, "stop": ["<|im_end|>", "a&b"], "top_p": 0.9, "num_ctx": 4096}
    expected = b'{"temperature":1,"stop":["\\u003c|im_end|\\u003e","a\\u0026b"],"top_p":0.9,"num_ctx":4096}'
    digest, size = store.add_json_blob(params)
    assert store.read_blob(digest) == expected and (digest, size) == (sha(expected), len(expected))
    # a Go map[string]any with json.Encoder (Ollama's params layer): sorted keys and a newline
    digest, _ = store.add_json_blob(params, sort_keys=True, newline=True)
    assert store.read_blob(digest) == (
        b'{"num_ctx":4096,"stop":["\\u003c|im_end|\\u003e","a\\u0026b"],"temperature":1,"top_p":0.9}\n'
    )
    digest, _ = store.add_json_blob([{"role": "user", "content": "héllo\n\u2028"}, 1e-7, 1e21, None, True])
    assert store.read_blob(digest) == '[{"role":"user","content":"héllo\\n\\u2028"},1e-7,1e+21,null,true]'.encode()


# --- manifests -------------------------------------------------------------------------------

D1, D2, D3 = ("sha256:" + c * 64 for c in "123")
OLLAMA_MANIFEST = (
    '{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",'
    f'"config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"{D1}","size":485}},'
    f'"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"{D2}","size":1000,'
    '"from":"/root/.ollama/models/blobs/sha256-abc"},'
    f'{{"mediaType":"application/vnd.ollama.image.tensor","digest":"{D3}","size":7,"name":"a.b\\u003cc\\u003e"}}]}}\n'
).encode()


def test_manifest_json_byte_compatible():
    m = Manifest.from_json(OLLAMA_MANIFEST)
    assert m.schema_version == 2 and m.media_type == MEDIA_TYPE_MANIFEST
    assert m.config == Layer(MEDIA_TYPE_CONFIG, D1, 485)
    assert m.layers[0].from_ == "/root/.ollama/models/blobs/sha256-abc" and m.layers[0].name is None
    assert m.layers[1].name == "a.b<c>" and m.layers[1].from_ is None
    assert m.to_json() == OLLAMA_MANIFEST
    assert m.size == 1492
    assert m.layer(MEDIA_TYPE_MODEL) is m.layers[0] and m.layer(MEDIA_TYPE_TEMPLATE) is None
    assert m.layers_of(MEDIA_TYPE_MODEL) == [m.layers[0]] and m.layers_of(MEDIA_TYPE_LICENSE) == []

    built = Manifest(Layer(MEDIA_TYPE_CONFIG, D1, 2), [Layer(MEDIA_TYPE_MODEL, D2, 3, from_="", name="")])
    obj = json.loads(built.to_json())
    assert list(obj) == ["schemaVersion", "mediaType", "config", "layers"]
    assert obj["layers"] == [{"mediaType": MEDIA_TYPE_MODEL, "digest": D2, "size": 3}]  # omitempty

    for bad in [b"", b"not json", b"[]", b'{"layers":{}}', b'{"layers":[{"size":-1}]}', b'{"layers":[{"digest":5}]}']:
        with pytest.raises(InvalidManifestError):
            Manifest.from_json(bad)


def test_write_and_read_manifest(store):
    m = make_model(store, "llama3", b"weights", b"{{ .Prompt }}")
    path = store.root / "manifests/registry.ollama.ai/library/llama3/latest"
    assert path.read_bytes() == m.to_json()
    assert store.read_manifest("llama3") == m
    assert store.read_manifest(ModelName.parse("registry.ollama.ai/library/llama3:latest")) == m
    assert os.listdir(path.parent) == ["latest"]  # no temp file left

    entry = store.entry("llama3")
    assert entry.name == ModelName.parse("llama3") and entry.manifest == m
    assert entry.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry.size == m.size == sum(x.size for x in [m.config, *m.layers])
    assert entry.modified_at.tzinfo is not None
    assert abs(entry.modified_at.timestamp() - path.stat().st_mtime) < 1e-3


def test_write_manifest_requires_blobs(store):
    digest, size = store.write_blob(b"w")
    m = Manifest(Layer(MEDIA_TYPE_CONFIG, D1, 10), [Layer(MEDIA_TYPE_MODEL, digest, size)])
    with pytest.raises(BlobNotFoundError, match=D1):
        store.write_manifest("m", m)
    bad = Manifest(Layer(MEDIA_TYPE_CONFIG, digest, size), [Layer(MEDIA_TYPE_MODEL, "sha256:xyz", 1)])
    with pytest.raises(InvalidDigestError):
        store.write_manifest("m", bad)
    assert store.list_models() == []
    with pytest.raises(ModelNotFoundError):
        store.read_manifest("m")


def test_missing_model_errors(store):
    for call in (store.read_manifest, store.resolve, store.entry, store.delete):
        with pytest.raises(ModelNotFoundError) as ei:
            call("nope")
        assert str(ei.value) == "model 'nope' not found"
        assert isinstance(ei.value, BlobsError)
    with pytest.raises(ModelNotFoundError, match="^model 'ns/x:1' not found$"):
        store.read_manifest(ModelName.parse("ns/x:1"))
    with pytest.raises(ModelNotFoundError):
        store.copy("nope", "other")
    with pytest.raises(InvalidNameError):
        store.read_manifest("bad name")


def test_case_insensitive_lookup(store):
    m = make_model(store, "Llama3:8B", b"w")
    for spelling in ["llama3:8b", "LLAMA3:8b", "REGISTRY.ollama.ai/LIBRARY/llama3:8B"]:
        assert store.read_manifest(spelling) == m
        assert store.resolve(spelling) == ModelName.parse("Llama3:8B")
    # rewriting under another spelling updates the existing file instead of adding a twin
    m2 = make_model(store, "llama3:8b", b"w2")
    assert os.listdir(store.root / "manifests/registry.ollama.ai/library") == ["Llama3"]
    assert store.read_manifest("Llama3:8B") == m2
    assert [e.name.display() for e in store.list_models()] == ["Llama3:8B"]
    store.delete("LLAMA3:8B")
    assert store.list_models() == []


def test_copy_then_delete_shares_blobs(store):
    weights, template, params = payload(3, 100_000), b"{{ .Prompt }}", b'{"temperature":0.5}'
    m = make_model(store, "alice/base:v1", weights, template, params)
    shared = {x.digest for x in m.all_layers()}

    store.copy("alice/base:v1", "bob/copy")
    assert store.read_manifest_bytes("bob/copy") == store.read_manifest_bytes("alice/base:v1")
    assert store.entry("bob/copy").digest == store.entry("alice/base:v1").digest
    assert len(blob_files(store)) == 4  # no blob was copied

    assert store.delete("alice/base:v1") == []  # everything is still used by bob/copy
    assert not (store.root / "manifests/registry.ollama.ai/alice").exists()  # empty dirs pruned
    assert {d for d in shared if store.has_blob(d)} == shared
    for d in shared:
        store.verify_blob(d)
    assert store.read_manifest("bob/copy") == m

    # a third model shares only the weights
    m3 = make_model(store, "carol/tuned", weights, b"{{ .System }}")
    removed = store.delete("bob/copy")
    assert set(removed) == shared - {m.layer(MEDIA_TYPE_MODEL).digest}
    assert store.has_blob(m.layer(MEDIA_TYPE_MODEL).digest)
    assert store.read_manifest("carol/tuned") == m3
    assert store.referenced_digests() >= {x.digest for x in m3.all_layers()}

    store.delete("carol/tuned")
    assert blob_files(store) == []
    assert os.listdir(store.root / "manifests") == []


def test_copy_onto_itself_and_overwrite(store):
    a = make_model(store, "a", b"1")
    b = make_model(store, "b", b"2")
    store.copy("a", "A:latest")  # same model: no-op
    assert sorted(e.name.display() for e in store.list_models()) == ["a:latest", "b:latest"]
    store.copy("a", "b")
    assert store.read_manifest("b") == a
    assert store.delete("a") == []
    assert set(store.delete("b")) == {x.digest for x in a.all_layers()}
    # like Ollama's copy, overwriting leaves the old target's blobs for prune() to collect
    b_digests = {x.digest for x in b.all_layers()}
    assert all(store.has_blob(d) for d in b_digests)
    assert set(store.prune()) == b_digests
    assert blob_files(store) == []


def test_prune(store):
    kept = make_model(store, "kept", b"kept weights")
    orphan, _ = store.write_blob(b"orphan")
    stale = store.blobs_dir / "sha256-1234567890"  # what Ollama's os.CreateTemp leaves
    stale.write_bytes(b"partial")
    junk = store.blobs_dir / ".DS_Store"
    junk.write_bytes(b"not ours")
    (store.root / "manifests/example.com/ns/empty").mkdir(parents=True)
    tmp_manifest = store.root / "manifests/registry.ollama.ai/library/kept/.tandem-tmp-abc"
    tmp_manifest.write_bytes(b"{")

    removed = store.prune()
    assert removed == [orphan, ".tandem-tmp-abc", stale.name]
    assert not store.has_blob(orphan) and not stale.exists() and not tmp_manifest.exists()
    assert junk.exists()
    assert not (store.root / "manifests/example.com").exists()
    for layer in kept.all_layers():
        store.verify_blob(layer.digest)
    assert store.prune() == []


def test_prune_keeps_partial_of_live_writer(store):
    data = payload(4, 3_000_000)
    half_written, go_on = threading.Event(), threading.Event()
    result = {}

    def gen():
        yield data[: len(data) // 2]
        half_written.set()
        go_on.wait(10)
        yield data[len(data) // 2 :]

    t = threading.Thread(target=lambda: result.setdefault("r", store.write_blob(gen(), sha(data))))
    t.start()
    assert half_written.wait(10)
    partials = [f for f in blob_files(store) if "-partial-" in f]
    assert len(partials) == 1
    assert store.prune() == []  # the writer still holds its lock
    assert blob_files(store) == partials
    go_on.set()
    t.join(10)
    assert result["r"] == (sha(data), len(data))
    assert blob_files(store) == [sha(data).replace(":", "-")]
    store.verify_blob(sha(data))


def test_gc_is_conservative_with_unreadable_manifests(store, caplog):
    make_model(store, "good", b"good")
    orphan, _ = store.write_blob(b"orphan")
    broken = store.root / "manifests/registry.ollama.ai/library/broken/latest"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b'{"layers": [')
    with caplog.at_level(logging.WARNING, logger="blobs"):
        assert store.prune() == []
        assert [e.name.display() for e in store.list_models()] == ["good:latest"]
    assert store.has_blob(orphan)
    assert "broken" in caplog.text
    broken.unlink()
    assert store.prune() == [orphan]


def test_shadowed_case_twin_still_pins_its_blobs(store):
    """On a case-sensitive filesystem an older tool may have left 'Foo' next to 'foo'."""
    foo = make_model(store, "foo", b"foo weights")
    twin = store.root / "manifests/registry.ollama.ai/library/Foo/latest"
    twin.parent.mkdir(parents=True)
    other_w, other_s = store.write_blob(b"Foo weights")
    twin_m = Manifest(foo.config, [Layer(MEDIA_TYPE_MODEL, other_w, other_s)])
    twin.write_bytes(twin_m.to_json())
    assert len(store.list_models()) == 1  # one model as far as names go ...
    assert store.prune() == []  # ... but the twin's blobs are not garbage
    store.delete("foo")
    assert store.read_manifest("foo") == twin_m  # the twin surfaces, complete
    store.verify_blob(other_w)


def test_manifest_writes_wait_for_garbage_collection(store):
    digest, size = store.write_blob(b"w")
    m = Manifest(Layer(MEDIA_TYPE_CONFIG, digest, size), [])
    done = threading.Event()
    with store._lock(exclusive=True):  # what delete() and prune() hold
        t = threading.Thread(target=lambda: (store.write_manifest("m", m), done.set()))
        t.start()
        assert not done.wait(0.3)
    t.join(10)
    assert done.is_set() and store.read_manifest("m") == m


# --- an existing Ollama models directory -----------------------------------------------------


def build_ollama_store(root: Path) -> dict:
    """Lay files out by hand exactly as Ollama does, without using BlobStore."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> tuple[str, int]:
        (blobs / ("sha256-" + hashlib.sha256(data).hexdigest())).write_bytes(data)
        return sha(data), len(data)

    gguf = b"GGUF" + payload(5, 50_000)
    w, ws = blob(gguf)
    t, ts = blob(b"<|start_header_id|>{{ .Prompt }}")
    lic, ls = blob(b"LLAMA 3.2 COMMUNITY LICENSE")
    p, ps = blob(b'{"stop":["\\u003c|eot_id|\\u003e"]}')
    c, cs = blob(b'{"model_format":"gguf","model_family":"llama","model_families":["llama"],'
                 b'"model_type":"3.2B","file_type":"Q4_K_M","architecture":"amd64","os":"linux","rootfs":'
                 b'{"type":"layers","diff_ids":[]}}')
    llama = (
        '{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",'
        f'"config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"{c}","size":{cs}}},'
        f'"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"{w}","size":{ws}}},'
        f'{{"mediaType":"application/vnd.ollama.image.template","digest":"{t}","size":{ts}}},'
        f'{{"mediaType":"application/vnd.ollama.image.license","digest":"{lic}","size":{ls}}},'
        f'{{"mediaType":"application/vnd.ollama.image.params","digest":"{p}","size":{ps}}}]}}'
    ).encode()  # as served by the registry: no trailing newline
    path = root / "manifests/registry.ollama.ai/library/llama3.2/latest"
    path.parent.mkdir(parents=True)
    path.write_bytes(llama)

    hw, hws = blob(b"GGUF" + payload(6, 20_000))
    hc, hcs = blob(b'{"model_format":"gguf","file_type":"Q4_K_M"}')
    hf = json.dumps(  # pretty-printed on purpose: the digest is of the bytes, whatever they are
        {"schemaVersion": 2, "mediaType": MEDIA_TYPE_MANIFEST,
         "config": {"mediaType": MEDIA_TYPE_CONFIG, "digest": hc, "size": hcs},
         "layers": [{"mediaType": MEDIA_TYPE_MODEL, "digest": hw, "size": hws}, {"mediaType": MEDIA_TYPE_TEMPLATE,
                    "digest": t, "size": ts}]}, indent=3).encode()
    hpath = root / "manifests/hf.co/org/repo/Q4_K_M"
    hpath.parent.mkdir(parents=True)
    hpath.write_bytes(hf)
    os.utime(hpath, (1_700_000_000, 1_700_000_000))  # older than llama3.2

    # junk a real directory accumulates; none of it is a model
    (path.parent / ".DS_Store").write_bytes(b"\0")
    (root / "manifests/registry.ollama.ai/library/deep/er/latest").mkdir(parents=True)
    (root / "manifests/registry.ollama.ai/library/deep/er/latest/x").write_bytes(b"{}")
    (root / "manifests/registry.ollama.ai/shallow").write_bytes(b"{}")
    (root / "manifests/registry.ollama.ai/library/bad name/latest").parent.mkdir(parents=True)
    (root / "manifests/registry.ollama.ai/library/bad name/latest").write_bytes(llama)
    (blobs / f"sha256-{w[7:]}-partial-0").write_bytes(b"GG")
    return {
        "llama": (llama, ws + ts + ls + ps + cs, {w, t, lic, p, c}),
        "hf": (hf, hws + ts + hcs, {hw, t, hc}),
    }


def test_lists_a_hand_made_ollama_store(tmp_path):
    info = build_ollama_store(tmp_path)
    store = BlobStore(tmp_path)
    entries = store.list_models()
    assert [e.name.display() for e in entries] == ["llama3.2:latest", "hf.co/org/repo:Q4_K_M"]
    for entry, key in zip(entries, ["llama", "hf"]):
        raw, size, digests = info[key]
        assert entry.digest == hashlib.sha256(raw).hexdigest()
        assert entry.size == size
        assert {x.digest for x in entry.manifest.all_layers()} == digests
    assert entries[1].modified_at.timestamp() == 1_700_000_000
    assert store.entry("hf.co/org/repo:q4_k_m").name == ModelName("hf.co", "org", "repo", "Q4_K_M")
    assert store.read_manifest("llama3.2").layer(MEDIA_TYPE_PARAMS).size == 33
    assert store.referenced_digests() == info["llama"][2] | info["hf"][2] | {
        sha(info["llama"][0]), sha(info["hf"][0])}
    for d in store.referenced_digests():
        if store.has_blob(d):
            store.verify_blob(d)

    # Ollama's own startup prune would do the same: the partial goes, every blob stays
    removed = store.prune()
    assert len(removed) == 1 and removed[0].endswith("-partial-0")
    assert len(blob_files(store)) == 7
    # deleting one model keeps the template blob the other one shares
    removed = store.delete("llama3.2")
    assert set(removed) == info["llama"][2] - info["hf"][2]
    assert [e.name.display() for e in store.list_models()] == ["hf.co/org/repo:Q4_K_M"]


def test_reads_newer_ollama_manifests_v2(tmp_path):
    """Newer Ollama keeps named manifests as symlinks into blobs under manifests-v2; GC must keep them."""
    store = BlobStore(tmp_path)
    w, ws = store.write_blob(b"GGUF qwen")
    c, cs = store.add_json_blob({"model_format": "gguf"})
    plain = Manifest(Layer(MEDIA_TYPE_CONFIG, c, cs), [Layer(MEDIA_TYPE_MODEL, w, ws)], runner="ollama")
    plain_digest, _ = store.write_blob(plain.to_json())
    link = tmp_path / "manifests-v2/ollama.com/library/qwen/latest"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(store.blob_path(plain_digest), link.parent))

    mw, mws = store.write_blob(b"MLX tensors")
    mlx_child = Manifest(Layer(MEDIA_TYPE_CONFIG, c, cs), [Layer(MEDIA_TYPE_MODEL, mw, mws)], runner="mlx")
    mlx_digest, _ = store.write_blob(mlx_child.to_json())
    lst = json.dumps({"schemaVersion": 2, "mediaType": MEDIA_TYPE_MANIFEST_LIST, "manifests": [
        {"mediaType": MEDIA_TYPE_MANIFEST, "digest": mlx_digest, "runner": "mlx"},
        {"mediaType": MEDIA_TYPE_MANIFEST, "digest": plain_digest, "runner": "ollama"},
    ]}).encode()
    list_digest, _ = store.write_blob(lst)
    link2 = tmp_path / "manifests-v2/ollama.com/library/multi/latest"
    link2.parent.mkdir(parents=True)
    link2.symlink_to(store.blob_path(list_digest))

    assert sorted(e.name.display() for e in store.list_models()) == ["multi:latest", "qwen:latest"]
    assert store.resolve("qwen") == ModelName.parse("qwen")
    assert store.read_manifest("qwen") == plain
    assert store.read_manifest("multi").runner == "ollama"  # GGUF child preferred
    assert store.entry("multi").digest == list_digest[7:]
    assert store.prune() == []  # nothing is garbage, not even the manifest blobs
    assert len(blob_files(store)) == 6

    # deleting the list frees the MLX-only blobs but keeps what qwen still uses
    assert set(store.delete("multi")) == {list_digest, mlx_digest, mw}
    assert not link2.exists() and link.exists()
    # a tandem write of the same name replaces Ollama's v2 entry
    store.write_manifest("qwen", Manifest(Layer(MEDIA_TYPE_CONFIG, c, cs), [Layer(MEDIA_TYPE_MODEL, w, ws)]))
    assert not link.exists() and (tmp_path / "manifests/registry.ollama.ai/library/qwen/latest").is_file()
    assert store.prune() == [plain_digest]


# --- crashes and concurrency -----------------------------------------------------------------

KILLED_WRITER = """
import os, sys
from blobs import BlobStore
data = bytes(range(256)) * 8192
def gen():
    yield data[: len(data) // 2]
    os._exit(3)  # simulate SIGKILL / power loss halfway through
BlobStore(sys.argv[1]).write_blob(gen(), sys.argv[2])
"""


def test_killed_writer_leaves_no_blob(store):
    data = bytes(range(256)) * 8192
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store.root), sha(data)], env=env, timeout=60)
    assert proc.returncode == 3
    assert not store.has_blob(sha(data))
    files = blob_files(store)
    assert len(files) == 1 and files[0].startswith(sha(data).replace(":", "-") + "-partial-")
    assert store.list_blobs() == []
    assert store.prune() == files
    assert blob_files(store) == []
    assert store.write_blob(data, sha(data)) == (sha(data), len(data))
    store.verify_blob(sha(data))


SHARED = [(10 + i, 400_000 + 7 * i) for i in range(3)]


def _write_all(root: str, worker: int) -> list[str]:
    """Every worker writes the shared payloads (in a worker-specific order and style) and two of its own."""
    store = BlobStore(root)
    jobs = [payload(seed, size) for seed, size in SHARED] + [payload(1000 + worker * 10 + k, 150_000) for k in range(2)]
    order = list(range(len(jobs)))
    random.Random(worker).shuffle(order)
    digests = []
    for n, i in enumerate(order):
        data = jobs[i]
        chunks = (data[o : o + 16_384] for o in range(0, len(data), 16_384))
        style = (worker + n) % 3
        if style == 0:
            digest, _ = store.write_blob(chunks, sha(data))
        elif style == 1:
            digest, _ = store.write_blob(chunks)
        else:
            digest, _ = store.write_blob(io.BytesIO(data), sha(data))
        digests.append(digest)
        # manifests referencing shared blobs, written concurrently too
        store.write_manifest(f"w{worker}/m{n}", Manifest(Layer(MEDIA_TYPE_CONFIG, digest, len(data)), []))
    return digests


def _proc_writer(root: str, worker: int, barrier, results) -> None:
    barrier.wait(60)
    results.put((worker, _write_all(root, worker)))


def test_concurrent_writers_threads_and_processes(store):
    store.blobs_dir.mkdir(parents=True)
    ctx = multiprocessing.get_context("spawn")
    # one barrier for processes and threads alike, so all seven really write at the same time
    barrier, queue = ctx.Barrier(7), ctx.Queue()
    procs = [ctx.Process(target=_proc_writer, args=(str(store.root), w, barrier, queue)) for w in range(3)]
    for p in procs:
        p.start()
    thread_results = {}

    def run_thread(w):
        barrier.wait(60)
        thread_results[w] = _write_all(str(store.root), w)

    threads = [threading.Thread(target=run_thread, args=(w,)) for w in range(3, 7)]
    for t in threads:
        t.start()
    proc_results = dict(queue.get(timeout=120) for _ in procs)
    for t in threads:
        t.join(120)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = {**proc_results, **thread_results}
    assert sorted(results) == list(range(7))

    expected = {sha(payload(seed, size)) for seed, size in SHARED}
    expected |= {sha(payload(1000 + w * 10 + k, 150_000)) for w in range(7) for k in range(2)}
    assert {d for ds in results.values() for d in ds} == expected
    # exactly the blobs, no partial or temp file anywhere
    assert blob_files(store) == sorted(d.replace(":", "-") for d in expected)
    for d in expected:
        store.verify_blob(d)
    assert len(store.list_models()) == 7 * 5
    assert store.prune() == []
