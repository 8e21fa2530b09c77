"""Importing Hugging Face Qwen3ForCausalLM and Qwen3MoeForCausalLM safetensors folders: the GGUF is laid out as
llama.cpp's converter writes it (q/k norms, ``key_length``; per-expert tensors stacked into 3-D
``ffn_{gate,up,down}_exps``, an F32 router, ``expert_*`` metadata) and gives transformers' logits on the same
files; --quantize keeps the router F32 and quantizes the stacked experts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blobs import MEDIA_TYPE_MODEL, BlobStore  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.ops.kernels import qdot_status  # noqa: E402
from importer import CreateError, CreateRequest, LocalBlobSink, create_model, request_from_modelfile  # noqa: E402
from modelfile import parse  # noqa: E402
from tests import hf_tiny  # noqa: E402
from tests.hf_folders import make_folder, random_ids  # noqa: E402

TOL = 1e-4  # as test_import_safetensors: identical weights, f32 compute against float64


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "models")


def _create(store: BlobStore, base: Path, name: str = "imported") -> Path:
    create_model(store, request_from_modelfile(parse("FROM ./hf\n"), name, base, LocalBlobSink(store)))
    layer = store.read_manifest(name).layer(MEDIA_TYPE_MODEL)
    return store.blob_path(layer.digest)


def _logits_err(folder, path: Path, n: int = 24) -> float:
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, n)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    ours = model(torch.tensor(ids), model.new_cache())
    model.close()
    return float((ours.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("dtype,shard,tied", [("F32", None, True), ("BF16", "30KB", False)])
def test_qwen3_import_matches_transformers(store, tmp_path, dtype, shard, tied):
    folder = make_folder("qwen3", tmp_path / "hf", dtype=dtype, shard_size=shard, tied=tied)
    path = _create(store, tmp_path)
    with GGUFFile(path) as f:
        assert f.architecture == "qwen3" and f.file_type == dtype
        assert f.arch_key("attention.key_length") == hf_tiny.QWEN3_HEAD_DIM
        assert "blk.1.attn_q_norm.weight" in f.tensors and "blk.0.attn_q.bias" not in f.tensors
        assert ("output.weight" in f.tensors) == (not tied)
    assert _logits_err(folder, path) < TOL


@pytest.mark.parametrize("dtype,shard,overrides", [("F32", None, {}), ("BF16", "60KB", {}),
                                                   ("F32", None, {"norm_topk_prob": False})])
def test_qwen3moe_import_matches_transformers(store, tmp_path, dtype, shard, overrides):
    folder = make_folder("qwen3moe", tmp_path / "hf", dtype=dtype, shard_size=shard, config_overrides=overrides)
    path = _create(store, tmp_path)
    E, F = hf_tiny.N_EXPERT, hf_tiny.N_FF_EXPERT
    with GGUFFile(path) as f:
        assert f.architecture == "qwen3moe" and f.file_type == dtype
        assert (f.arch_key("expert_count"), f.arch_key("expert_used_count"),
                f.arch_key("expert_feed_forward_length")) == (E, hf_tiny.N_EXPERT_USED, F)
        assert f.arch_key("expert_weights_norm") == (False if overrides else None)
        assert f.tensors["blk.1.ffn_gate_exps.weight"].shape == (E, F, 64)
        assert f.tensors["blk.1.ffn_down_exps.weight"].shape == (E, 64, F)
        assert f.tensors["blk.1.ffn_gate_exps.weight"].type_name == dtype
        assert f.tensors["blk.1.ffn_gate_inp.weight"].type_name == "F32"
        assert not any(".experts." in n or n.endswith("ffn_gate.weight") for n in f.tensors)
    assert _logits_err(folder, path) < TOL


@pytest.mark.parametrize("quant,expert_type", [("q8_0", "Q8_0"), ("q4_K_M", "Q5_0")])
def test_qwen3moe_quantized_import(store, tmp_path, quant, expert_type):
    """--quantize on the converted MoE: the stacked experts are quantized row by row (a K type falls back as
    llama.cpp's does when 64-wide rows are not whole 256-value super-blocks), the router stays F32, and the
    model still predicts what the float64 reference does."""
    folder = make_folder("qwen3moe", tmp_path / "hf")
    files = {p.name: store.add_file(p)[0] for p in (tmp_path / "hf").iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "quantize": quant}))
    path = store.blob_path(store.read_manifest("q").layer(MEDIA_TYPE_MODEL).digest)
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.ffn_up_exps.weight"].type_name == expert_type
        assert f.tensors["blk.0.ffn_up_exps.weight"].shape == (hf_tiny.N_EXPERT, hf_tiny.N_FF_EXPERT, 64)
        assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
    m = load_model(path, fmt="qdot" if qdot_status().available else "f32")
    assert m.config.moe.n_expert == hf_tiny.N_EXPERT
    ids = random_ids(folder.vocab_size, 24)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    out = m(torch.tensor(ids), m.new_cache())
    m.close()
    assert float((out.argmax(-1) == ref.argmax(-1)).double().mean()) >= 0.9


def test_qwen3moe_with_dense_layers_is_refused(store, tmp_path):
    make_folder("qwen3moe", tmp_path / "hf", config_overrides={"mlp_only_layers": [1]})
    req = request_from_modelfile(parse("FROM ./hf\n"), "imported", tmp_path, LocalBlobSink(store))
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match="mlp_only_layers"):
        create_model(store, req)
    assert store.list_models() == [] and store.list_blobs() == uploaded
