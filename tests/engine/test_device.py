"""Where the native engine runs (issue 36): the CPU unless a GPU is asked for with Ollama's num_gpu / main_gpu, even on
a machine where torch sees CUDA (faked here at the one place the engine asks, engine.load.resolve_device)."""

from __future__ import annotations

import pytest
import torch

import engine.load as load
from engine.load import load_parts
from engine.contract.options import Options
from engine.contract.protocol import EngineError, LoadSpec
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.mark.parametrize("options,device", [
    ({}, "cpu"),  # Ollama's default num_gpu -1 ("as many as fit"): the untested GPU path is never a default
    ({"num_gpu": 0}, "cpu"),
    ({"num_gpu": -1}, "cpu"),
    ({"num_gpu": 99}, "cuda:0"),
    ({"num_gpu": 1, "main_gpu": 1}, "cuda:1"),
])
def test_num_gpu_and_main_gpu_choose_the_device(options, device):
    assert Options.from_map(options).device() == device


@pytest.fixture
def cuda_visible(monkeypatch):
    monkeypatch.setattr(load.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(load.torch.cuda, "device_count", lambda: 1)


def test_num_gpu_0_keeps_the_model_on_the_cpu_where_cuda_is_visible(cuda_visible, tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="llama"))
    assert load.resolve_device("auto").type == "cuda"  # what every load did before: CUDA whenever torch saw it
    parts = load_parts(LoadSpec(model_path=str(path), num_ctx=32, device=Options.from_map({"num_gpu": 0}).device()))
    try:
        assert parts.facts.device == "cpu"
        assert all(p.device.type == "cpu" for p in parts.target.parameters())
    finally:
        parts.gguf.close()


def test_a_gpu_the_machine_lacks_is_a_clear_400(cuda_visible, monkeypatch):
    with pytest.raises(EngineError, match="GPU 1 was requested \\(main_gpu\\) but this machine has 1") as e:
        load.resolve_device(Options.from_map({"num_gpu": 1, "main_gpu": 1}).device())
    assert e.value.status == 400
    monkeypatch.setattr(load.torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineError, match="num_gpu > 0.*CUDA is not available"):
        load.resolve_device("cuda:0")
