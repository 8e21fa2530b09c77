"""engine.ops.lora and the engine's load path for LoRA adapters (llama.cpp's GGUF adapter layout).

* a fused linear (q/k/v, gate/up) gets each part's update in that part's rows, parts without one unchanged;
* llama.cpp's scale: alpha / rank, and 1 when alpha is 0; several adapters add up;
* the adapter reaches the target only (``LoadSpec.adapter_paths``): the DRAFT model loads without it, and
  greedy speculation stays lossless against the adapted target;
* an adapter that does not fit the target, or adapts a weight the model does not run as a linear, is a 400
  at load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.contract.adapter import AdapterError
from engine.contract.gguf import GGUFFile
from engine.load import load_parts
from engine.ops.dequant import load_tensor
from engine.ops.linear import load_linear
from engine.ops.lora import LoraLinear, LoraWeights
from engine.contract.protocol import EngineError, LoadSpec
from tests.tiny_gguf import TinySpec, write_tiny_gguf

RANK = 3


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("lora") / "base.gguf", TinySpec(arch="qwen2", seed=1))


def write_adapter(path: Path, base: Path, names: list[str], *, alpha: float = 6.0, seed: int = 0,
                  arch: str = "qwen2") -> Path:
    """A random LoRA for ``names`` of ``base`` in llama.cpp's layout (lora_a [rank, in], lora_b [out, rank])."""
    import gguf

    rng = np.random.default_rng(seed)
    with GGUFFile(base) as f:
        shapes = {n: f.tensors[n].shape for n in names}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for n in names:
        out, inp = shapes[n]
        w.add_tensor(n + ".lora_a", (0.3 * rng.standard_normal((RANK, inp))).astype(np.float32))
        w.add_tensor(n + ".lora_b", (0.3 * rng.standard_normal((out, RANK))).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _delta(adapter: Path, name: str, x: torch.Tensor, scale: float) -> torch.Tensor:
    with GGUFFile(adapter) as f:
        return scale * (x @ load_tensor(f, name + ".lora_a").T) @ load_tensor(f, name + ".lora_b").T


def test_fused_linear_gets_each_part_in_its_rows(base, tmp_path):
    qkv = [f"blk.0.attn_{p}.weight" for p in "qkv"]
    adapter = write_adapter(tmp_path / "a.gguf", base, [qkv[0], qkv[2]])  # q and v, not k
    x = torch.randn(5, 64)
    with GGUFFile(base) as f:
        plain = load_linear(f, qkv, "f32")(x)
        f.lora = LoraWeights.load([str(adapter)], f)
        lin = load_linear(f, qkv, "f32")
        assert isinstance(lin, LoraLinear) and lin.format == "f32+lora"
        got = lin(x)
        assert f.lora.applied == {qkv[0], qkv[2]}
        q, k = (f.tensors[n].shape[0] for n in qkv[:2])
    scale = 6.0 / RANK
    want = plain.clone()
    want[:, :q] += _delta(adapter, qkv[0], x, scale)
    want[:, q + k:] += _delta(adapter, qkv[2], x, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, q:q + k], plain[:, q:q + k])  # k has no update: exactly the base


def test_scale_rules_and_adapters_add_up(base, tmp_path):
    name = "blk.1.ffn_down.weight"
    no_alpha = write_adapter(tmp_path / "n.gguf", base, [name], alpha=0.0)
    other = write_adapter(tmp_path / "o.gguf", base, [name], seed=5)
    with GGUFFile(base) as f:
        x = torch.randn(4, f.tensors[name].shape[1])
        plain = load_linear(f, name, "f32")(x)
        f.lora = LoraWeights.load([str(no_alpha), str(other)], f)
        got = load_linear(f, name, "f32")(x)
    want = plain + _delta(no_alpha, name, x, 1.0) + _delta(other, name, x, 6.0 / RANK)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unfit_adapters_are_refused(base, tmp_path):
    with GGUFFile(base) as f:
        with pytest.raises(AdapterError, match="is for architecture 'llama'"):
            LoraWeights.load([str(write_adapter(tmp_path / "l.gguf", base, ["blk.0.attn_q.weight"], arch="llama"))], f)
        with pytest.raises(AdapterError, match="not a linear layer"):
            LoraWeights.load([str(write_adapter(tmp_path / "e.gguf", base, ["token_embd.weight"]))], f)
    with pytest.raises(EngineError) as e:
        load_parts(LoadSpec(model_path=str(base), adapter_paths=(str(tmp_path / "l.gguf"),)))
    assert e.value.status == 400 and "adapter" in str(e.value)


def test_a_lora_the_model_would_drop_is_refused(tmp_path):
    """A 2-D weight the model never loads as a linear: its LoRA would silently do nothing, so the load fails."""
    from tests.tiny_gguf import tiny_tensors, vocab_for

    spec = TinySpec(arch="qwen2", seed=1)
    tensors = tiny_tensors(spec, len(vocab_for(spec)[0]))
    tensors["blk.0.unused.weight"] = np.zeros((8, 64), np.float32)
    base = write_tiny_gguf(tmp_path / "extra.gguf", spec, tensors=tensors)
    adapter = write_adapter(tmp_path / "a.gguf", base, ["blk.0.unused.weight", "blk.0.attn_q.weight"])
    with pytest.raises(EngineError) as e:
        load_parts(LoadSpec(model_path=str(base), adapter_paths=(str(adapter),)))
    assert e.value.status == 400 and "blk.0.unused.weight is not run as a linear layer" in str(e.value)


def test_adapter_reaches_the_target_not_the_draft(base, tmp_path):
    from engine.runtime import ModelRuntime
    from tests.engine.speculative.test_speculation import GREEDY, generate, spec_opts

    draft = write_tiny_gguf(tmp_path / "draft.gguf", TinySpec(arch="qwen2", n_layer=1, seed=2))
    names = [f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_q", "attn_v", "ffn_up", "ffn_down")]
    adapter = write_adapter(tmp_path / "a.gguf", base, names)
    spec = LoadSpec(model_path=str(base), draft_path=str(draft), adapter_paths=(str(adapter),), num_ctx=256,
                    weight_format="f32", draft_weight_format="f32")
    engine = ModelRuntime.load(spec)
    try:
        target = engine.target
        assert isinstance(target.layers[0].attn.wqkv, LoraLinear)
        draft_model = engine.drafters["model"].model
        draft_model = getattr(draft_model, "unbatched", draft_model)
        assert not any(isinstance(m, LoraLinear) for m in draft_model.modules())
        drafted = generate(engine, **GREEDY, **spec_opts("model", cap=3))
        assert drafted.spec.draft_n > 0
        # greedy speculation is lossless against the adapted target
        assert drafted.tokens == generate(engine, **GREEDY, drafter="none").tokens
    finally:
        engine.close()
