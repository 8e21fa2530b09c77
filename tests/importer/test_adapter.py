"""Modelfile ``ADAPTER``: LoRA adapters imported at create and applied by the engine to the target.

* a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) on a tiny llama / qwen2 is converted
  to llama.cpp's GGUF adapter layout; the created model's logits are transformers + peft's (float64);
* a GGUF LoRA written by hand in llama.cpp's layout (``convert_lora_to_gguf.py``) gives the same logits;
* an adapter that does not fit the target (wrong shapes, a tensor the model lacks, not an adapter) is a
  400 at create naming the tensor, and the store is left without the model;
* through the HTTP server: ``/api/create`` -> ``/api/show`` (the Modelfile shows ``ADAPTER``) -> ``/api/generate``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from blobs import MEDIA_TYPE_ADAPTER, BlobStore, ModelNotFoundError  # noqa: E402
from blobs.model import load_stored_model  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from importer import CreateError, LocalBlobSink, create_model, request_from_modelfile  # noqa: E402
from modelfile import parse  # noqa: E402
from tests import hf_tiny  # noqa: E402
from tests.model_checks import TOL, random_ids, relative_error  # noqa: E402

RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def make_peft(hf: torch.nn.Module, directory: Path, seed: int = 3) -> torch.nn.Module:
    """A LoRA over a copy of ``hf`` with random non-zero A and B (f32-exact values), saved in ``directory``."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS,
                                                         lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_((0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)).float().double())
    model.save_pretrained(directory)
    return model.eval()


def llama_cpp_adapter(peft_model: torch.nn.Module, spec, path: Path, *, alpha: float = ALPHA,
                      break_shape: bool = False, extra: dict[str, np.ndarray] | None = None) -> Path:
    """The peft model's LoRA written by hand in llama.cpp's layout (convert_lora_to_gguf.py's names and keys)."""
    import gguf

    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name, t in peft_model.state_dict().items():
        if "lora_" not in name:
            continue
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
        layer, sub = name.split("model.layers.")[1].split(".", 1)
        stem = sub.split(".lora_")[0]
        base = f"blk.{layer}.{hf_tiny._LAYER_NAMES[stem]}.weight"
        a = t.float().numpy()
        if ".lora_B" in name and spec.arch == "llama" and stem in ("self_attn.q_proj", "self_attn.k_proj"):
            a = hf_tiny._permute(a, spec.n_head if stem.endswith("q_proj") else spec.n_head_kv)
        if break_shape and ".lora_A" in name and base == "blk.0.attn_q.weight":
            a = np.concatenate([a, a], axis=1)  # [rank, 2 * in]: does not fit attn_q's columns
        w.add_tensor(base + (".lora_a" if ".lora_A" in name else ".lora_b"), np.ascontiguousarray(a))
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def case(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"lora-{request.param}")
    torch.set_num_threads(1)
    pair = hf_tiny.make_pair(request.param, d)
    peft_model = make_peft(pair.hf, d / "peft")
    return pair, peft_model, d


def _create(store: BlobStore, text: str, base: Path, name: str = "adapted"):
    create_model(store, request_from_modelfile(parse(text), name, base, LocalBlobSink(store)))
    return load_stored_model(store, name)


def _logits(model, ids):
    return model(torch.tensor(ids), model.new_cache())


def _peft_logits(peft_model, ids):
    with torch.no_grad():
        return peft_model(torch.tensor([ids])).logits[0].double()


@pytest.mark.parametrize("source", ["peft", "gguf"])
def test_adapted_logits_match_peft(case, tmp_path, source):
    pair, peft_model, d = case
    adapter = d / "peft" if source == "peft" else llama_cpp_adapter(peft_model, pair.spec, tmp_path / "lora.gguf")
    store = BlobStore(tmp_path / "models")
    stored = _create(store, f"FROM {pair.path}\nADAPTER {adapter}\n", tmp_path)
    assert len(stored.adapter_paths) == 1
    ids = random_ids(pair.vocab_size, 24)
    ref = _peft_logits(peft_model, ids)
    # The adapter matters: without it the logits are far off (so this test fails without LoRA support).
    assert relative_error(hf_tiny.hf_logits(pair.hf, ids), ref) > 100 * TOL
    model = load_model(stored.model_path, "f32", adapters=[str(p) for p in stored.adapter_paths])
    assert relative_error(_logits(model, ids), ref) < TOL
    # The base layer is the file as given: the adapter sits beside it, it is not merged in.
    assert relative_error(_logits(load_model(stored.model_path, "f32"), ids), hf_tiny.hf_logits(pair.hf, ids)) < TOL


def test_peft_conversion_is_llama_cpp_layout(case, tmp_path):
    pair, peft_model, d = case
    store = BlobStore(tmp_path / "models")
    stored = _create(store, f"FROM {pair.path}\nADAPTER {d / 'peft'}\n", tmp_path)
    from engine.contract.gguf import GGUFFile

    with GGUFFile(stored.adapter_paths[0]) as f:
        assert f.metadata["general.type"] == "adapter" and f.metadata["adapter.type"] == "lora"
        assert f.metadata["adapter.lora.alpha"] == ALPHA and f.architecture == pair.arch
        assert f.tensors["blk.0.attn_q.weight.lora_a"].shape == (RANK, hf_tiny.N_EMBD)
        assert f.tensors["blk.1.ffn_down.weight.lora_b"].shape == (hf_tiny.N_EMBD, RANK)
        assert len(f.tensors) == 2 * len(TARGETS) * pair.spec.n_layer
    manifest = store.read_manifest("adapted")
    assert [l.media_type for l in manifest.layers].count(MEDIA_TYPE_ADAPTER) == 1


@pytest.mark.parametrize("fmt", ["qdot", "int8", "bf16"])
def test_adapter_over_quantized_formats(case, tmp_path, fmt):
    """The base keeps its format; the update adds what the f32 LoRA adds (within that format's error)."""
    pair, peft_model, d = case
    store = BlobStore(tmp_path / "models")
    stored = _create(store, f"FROM {pair.path}\nADAPTER {d / 'peft'}\n", tmp_path)
    ids = random_ids(pair.vocab_size, 12)
    adapters = [str(p) for p in stored.adapter_paths]
    base, adapted = load_model(stored.model_path, fmt), load_model(stored.model_path, fmt, adapters=adapters)
    exact = _logits(load_model(stored.model_path, "f32", adapters=adapters), ids).double()
    delta = exact - _logits(load_model(stored.model_path, "f32"), ids).double()
    got = _logits(adapted, ids).double() - _logits(base, ids).double()
    assert relative_error(got, delta) < 0.1  # the low-rank update itself, seen through the format's rounding
    if fmt == "qdot":
        from engine.ops.kernels import decoder_stack_class

        assert (base.fused_stack() is not None) == (decoder_stack_class() is not None)
        assert adapted.fused_stack() is None  # the native stack would drop the adapter: Python blocks run


def _refused(store: BlobStore, text: str, base: Path) -> CreateError:
    with pytest.raises(CreateError) as e:
        _create(store, text, base)
    with pytest.raises(ModelNotFoundError):
        store.read_manifest("adapted")
    assert e.value.status == 400
    return e.value


def test_bad_adapters_are_refused_at_create(case, tmp_path):
    pair, peft_model, d = case
    store = BlobStore(tmp_path / "models")
    wrong = llama_cpp_adapter(peft_model, pair.spec, tmp_path / "wrong.gguf", break_shape=True)
    e = _refused(store, f"FROM {pair.path}\nADAPTER {wrong}\n", tmp_path)
    assert "blk.0.attn_q.weight.lora_a" in str(e) and "do not fit" in str(e)

    extra = {"blk.9.attn_q.weight.lora_a": np.zeros((RANK, hf_tiny.N_EMBD), np.float32),
             "blk.9.attn_q.weight.lora_b": np.zeros((hf_tiny.N_EMBD, RANK), np.float32)}
    absent = llama_cpp_adapter(peft_model, pair.spec, tmp_path / "absent.gguf", extra=extra)
    e = _refused(store, f"FROM {pair.path}\nADAPTER {absent}\n", tmp_path)
    assert "blk.9.attn_q.weight" in str(e) and "does not have" in str(e)

    e = _refused(store, f"FROM {pair.path}\nADAPTER {pair.path}\n", tmp_path)  # a model, not an adapter
    assert "not a LoRA adapter" in str(e)

    # A PEFT folder whose lora_A does not fit the base (another model's width).
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad-peft"
    shutil.copytree(d / "peft", bad)
    tensors = load_file(bad / "adapter_model.safetensors")
    key = next(k for k in tensors if "layers.1.mlp.down_proj.lora_A" in k)
    tensors[key] = torch.zeros(RANK, 7, dtype=tensors[key].dtype)
    save_file(tensors, bad / "adapter_model.safetensors")
    e = _refused(store, f"FROM {pair.path}\nADAPTER {bad}\n", tmp_path)
    assert "blk.1.ffn_down.weight.lora_a" in str(e)
    (bad / "adapter_config.json").write_text(json.dumps({**json.loads((d / "peft" / "adapter_config.json").read_text()),
                                                         "use_dora": True}))
    assert "DoRA" in str(_refused(store, f"FROM {pair.path}\nADAPTER {bad}\n", tmp_path))
