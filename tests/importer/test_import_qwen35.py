"""Importing Hugging Face Qwen3.5 / Qwen3.6 safetensors folders (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM`` and
the text model of the multimodal ``*ForConditionalGeneration``): every tensor equals the independent oracle
writer's (tests/hf_tiny_qwen35.py ``to_gguf_tensors``, llama.cpp's layout), the metadata is what the engine's
qwen35 reads, the engine gives transformers' logits on the imported file, an MTP head (``mtp.*``) becomes block N
in llama.cpp's names (inside the checkpoint or as a head-only folder), and what the engine cannot run is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from blobs import MEDIA_TYPE_DRAFT, MEDIA_TYPE_MODEL, BlobStore  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from importer import CreateError, CreateRequest, create_model  # noqa: E402
from importer.hf_to_gguf import convert_folder  # noqa: E402
from importer.hf.safetensors import folder_paths  # noqa: E402
from tests import hf_tiny, hf_tiny_qwen35 as q35  # noqa: E402
from tests.hf_folders import make_tokenizer, random_ids, save_tokenizer  # noqa: E402
from tests.model_checks import TOL, relative_error  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Folder:
    """A saved tiny model: its directory, the float64 transformers model and the oracle's GGUF tensors."""

    def __init__(self, path: Path, hf: torch.nn.Module, spec, vocab_size: int):
        self.path, self.hf, self.spec, self.vocab_size = path, hf, spec, vocab_size
        self.expected = q35.to_gguf_tensors(hf, spec)

    def config(self) -> dict:
        return json.loads((self.path / "config.json").read_text())

    def write_config(self, cfg: dict) -> None:
        (self.path / "config.json").write_text(json.dumps(cfg, indent=2))

    def tensors(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.path / "model.safetensors"))

    def write_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(self.path / "model.safetensors"),
                  metadata={"format": "pt"})


def make(directory: Path, *, moe: bool = False, tied: bool = True, seed: int = 0) -> Folder:
    directory.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer("qwen2")
    spec = q35.tiny_spec(moe=moe, tied=tied, seed=seed)
    hf = q35.build_hf(spec, len(tok))
    hf.float().save_pretrained(directory)
    hf.double()
    save_tokenizer(tok, directory)
    return Folder(directory, hf, spec, len(tok))


def convert(folder_path: Path, out: Path, role: str = "FROM", donor=None) -> Path:
    files = folder_paths({p.name: p for p in folder_path.iterdir()})
    convert_folder(files, out, role, tokenizer_donor=donor)
    return out


def tensor(f: GGUFFile, name: str) -> np.ndarray:
    """One F32 / F16 / BF16 tensor of ``f`` as float32, in torch order."""
    info, raw = f.tensors[name], f.tensor_data(name)
    if info.type_name == "BF16":
        a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        a = raw.view({"F32": np.float32, "F16": np.float16}[info.type_name]).astype(np.float32)
    return a.reshape(info.shape)


def gguf_tensors(f: GGUFFile) -> dict[str, np.ndarray]:
    return {name: tensor(f, name) for name in f.tensors}


def assert_same_tensors(path: Path, expected: dict[str, np.ndarray]) -> None:
    with GGUFFile(path) as f:
        got = gguf_tensors(f)
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def assert_engine_metadata(path: Path, spec, vocab_size: int, n_nextn: int = 0) -> None:
    """The keys the engine's qwen35 / qwen35moe (and base_config) read, as tiny_spec / tiny_gguf write them."""
    arch = spec.arch
    with GGUFFile(path) as f:
        assert f.architecture == arch
        for key, want in spec.extra_metadata.items():
            got = f.metadata[key]
            assert (list(got) if isinstance(want, list) else got) == want, key
        k = f.arch_key
        assert k("block_count") == spec.n_layer + n_nextn
        assert k("nextn_predict_layers") == (n_nextn or None)
        assert (k("embedding_length"), k("attention.head_count"), k("attention.head_count_kv")) == (
            spec.n_embd, spec.n_head, spec.n_head_kv)
        assert (k("attention.key_length"), k("attention.value_length")) == (spec.head_dim, spec.head_dim)
        assert k("feed_forward_length") == (spec.n_ff or None)
        assert k("context_length") == spec.context_length and k("vocab_size") == vocab_size
        assert abs(k("rope.freq_base") - spec.rope_base) < 1e-3
        assert abs(k("attention.layer_norm_rms_epsilon") - spec.rms_eps) < 1e-12
        if spec.n_expert:
            assert (k("expert_count"), k("expert_used_count"), k("expert_feed_forward_length")) == (
                spec.n_expert, spec.n_expert_used, spec.n_ff_expert)
            assert f.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
        assert f.metadata["tokenizer.ggml.model"] == "gpt2" and len(f.metadata["tokenizer.ggml.tokens"]) == vocab_size


def logits_err(folder: Folder, path: Path, n: int = 80) -> float:
    """As tests/engine/models/test_model_qwen35.py: 80 tokens, past one 64-token chunk of the DeltaNet's parallel form."""
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, n)
    want = hf_tiny.hf_logits(folder.hf, ids)
    got = model(ids, model.new_cache(128))
    model.close()
    return relative_error(got, want)


# ------------------------------------------------------------------------------------------------
# the text model: tensors, metadata, logits
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("moe,tied", [(False, True), (False, False), (True, True), (True, False)])
def test_import_matches_the_oracle_and_transformers(tmp_path, moe, tied):
    folder = make(tmp_path / "hf", moe=moe, tied=tied)
    out = convert(folder.path, tmp_path / "out.gguf")
    assert_same_tensors(out, folder.expected)
    assert_engine_metadata(out, folder.spec, folder.vocab_size)
    assert logits_err(folder, out) < TOL


def _wrap(folder: Folder, arch: str) -> None:
    """The multimodal layout: the text model under model.language_model, a vision tower beside it, the text
    config nested as text_config (transformers 5's Qwen3_5ForConditionalGeneration)."""
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in folder.tensors().items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
    tensors["model.visual.merger.linear_fc1.weight"] = torch.randn(8, 8)
    folder.write_tensors(tensors)
    text = folder.config()
    tied = text.pop("tie_word_embeddings")
    folder.write_config({"architectures": [arch], "model_type": "qwen3_5", "tie_word_embeddings": tied,
                         "text_config": text, "vision_config": {"depth": 1, "hidden_size": 8},
                         "image_token_id": 5})


@pytest.mark.parametrize("moe", [False, True])
def test_multimodal_checkpoint_imports_its_text_model(tmp_path, moe):
    folder = make(tmp_path / "hf", moe=moe, tied=not moe)
    _wrap(folder, "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration")
    out = convert(folder.path, tmp_path / "out.gguf")
    assert_same_tensors(out, folder.expected)
    assert_engine_metadata(out, folder.spec, folder.vocab_size)
    assert logits_err(folder, out) < TOL


def test_older_config_spelling(tmp_path):
    """transformers 4's spelling (rope_theta, rope_scaling.mrope_section, full_attention_interval, no layer_types)
    and Qwen3.5's defaults (partial_rotary_factor 0.25) give the same file."""
    folder = make(tmp_path / "hf")
    cfg = folder.config()
    rope = cfg.pop("rope_parameters")
    del cfg["layer_types"]
    cfg.update(rope_theta=rope["rope_theta"], full_attention_interval=q35.INTERVAL,
               rope_scaling={"type": "default", "mrope_section": rope["mrope_section"]})
    folder.write_config(cfg)
    out = convert(folder.path, tmp_path / "out.gguf")
    assert_same_tensors(out, folder.expected)
    assert_engine_metadata(out, folder.spec, folder.vocab_size)


def test_fused_experts_are_split(tmp_path):
    """Experts stored fused (``mlp.experts.gate_up_proj`` [E, 2F, D] and ``down_proj`` [E, D, F], as the released
    MoE checkpoints store them) give the same GGUF as per-expert tensors."""
    folder = make(tmp_path / "hf", moe=True)
    t = folder.tensors()
    for layer in range(folder.spec.n_layer):
        p = f"model.layers.{layer}.mlp.experts."
        gate, up, down = ([t.pop(f"{p}{e}.{k}_proj.weight") for e in range(q35.N_EXPERT)] for k in ("gate", "up", "down"))
        t[p + "gate_up_proj"] = torch.cat([torch.stack(gate), torch.stack(up)], dim=1)
        t[p + "down_proj"] = torch.stack(down)
    folder.write_tensors(t)
    out = convert(folder.path, tmp_path / "out.gguf")
    assert_same_tensors(out, folder.expected)


def test_bf16_checkpoint_keeps_bf16_weights(tmp_path):
    folder = make(tmp_path / "hf")
    folder.write_tensors({k: v.to(torch.bfloat16) for k, v in folder.tensors().items()})
    out = convert(folder.path, tmp_path / "out.gguf")
    with GGUFFile(out) as f:
        assert f.file_type == "BF16"
        assert f.tensors["blk.0.attn_qkv.weight"].type_name == "BF16"
        assert f.tensors["blk.0.ssm_conv1d.weight"].type_name == "F32"
        assert f.tensors["blk.0.ssm_a"].type_name == "F32" and f.tensors["blk.3.attn_q_norm.weight"].type_name == "F32"
        # -exp(A_log) of the bf16 values, computed in float64 and rounded once
        a_log = folder.tensors()["model.layers.0.linear_attn.A_log"].to(torch.bfloat16).double().numpy()
        want = q35._tile_v(-np.exp(a_log)[:, None], 0, 1)[:, 0].astype(np.float32)
        np.testing.assert_array_equal(tensor(f, "blk.0.ssm_a"), want)


def test_qwen35_pre_tokenizer_is_recognised(tmp_path):
    """Qwen3.5's tokenizer.json splits words with combining marks (``[\\p{L}\\p{M}]+``): stored as pre ``qwen35``."""
    from engine.contract.pretokenizers import _QWEN35

    folder = make(tmp_path / "hf")
    tj_path = folder.path / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = _QWEN35
    tj_path.write_text(json.dumps(tj))
    out = convert(folder.path, tmp_path / "out.gguf")
    with GGUFFile(out) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "qwen35"


def test_create_through_the_api(tmp_path):
    """/api/create with the folder's uploaded files, as a client imports (no MTP head: the engine loads it)."""
    store = BlobStore(tmp_path / "models")
    folder = make(tmp_path / "hf", tied=False)
    files = {p.name: store.add_file(p)[0] for p in folder.path.iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q35", "files": files}))
    path = store.blob_path(store.read_manifest("q35").layer(MEDIA_TYPE_MODEL).digest)
    assert_same_tensors(path, folder.expected)
    assert logits_err(folder, path) < TOL


@pytest.mark.parametrize("moe,quant", [(False, "q8_0"), (True, "q4_K_M")])
def test_quantized_import(tmp_path, moe, quant):
    """--quantize on the imported file: the weight matrices are quantized (a K type whose 256-value block does not
    fit these 64-wide rows falls back as llama.cpp's does), the conv kernel, the routers and every 1-D tensor stay
    F32, and the model still predicts what the float64 reference does."""
    store = BlobStore(tmp_path / "models")
    folder = make(tmp_path / "hf", moe=moe)
    files = {p.name: store.add_file(p)[0] for p in folder.path.iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "quantize": quant}))
    path = store.blob_path(store.read_manifest("q").layer(MEDIA_TYPE_MODEL).digest)
    with GGUFFile(path) as f:
        types = {n: t.type_name for n, t in f.tensors.items()}
    weight = "Q8_0" if quant == "q8_0" else "Q5_0"
    assert types["blk.0.attn_qkv.weight"] == weight and types["blk.3.attn_q.weight"] == weight
    for name in ("blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight",
                 *(("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight") if moe else ())):
        assert types[name] == "F32", name
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, 24)
    want = hf_tiny.hf_logits(folder.hf, ids)
    got = model(ids, model.new_cache(64))
    model.close()
    assert float((got.argmax(-1) == want.argmax(-1)).double().mean()) >= 0.9


# ------------------------------------------------------------------------------------------------
# the MTP head
# ------------------------------------------------------------------------------------------------
def mtp_tensors(spec, vocab_size: int, *, fused_experts: bool = False, seed: int = 7,
                extras: bool = False) -> dict[str, torch.Tensor]:
    """Random ``mtp.*`` tensors of Qwen3.5's MTP head: one full-attention decoder layer (q_proj holding q and
    the gate) plus the fc projection and its norms."""
    g = torch.Generator().manual_seed(seed)
    D, H, Hkv, hd = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim

    def w(*shape):
        return 0.1 * torch.randn(shape, generator=g)

    t = {"mtp.fc.weight": w(D, 2 * D), "mtp.pre_fc_norm_embedding.weight": w(D),
         "mtp.pre_fc_norm_hidden.weight": w(D), "mtp.norm.weight": w(D)}
    p = "mtp.layers.0."
    t.update({p + "input_layernorm.weight": w(D), p + "post_attention_layernorm.weight": w(D),
              p + "self_attn.q_proj.weight": w(2 * H * hd, D), p + "self_attn.k_proj.weight": w(Hkv * hd, D),
              p + "self_attn.v_proj.weight": w(Hkv * hd, D), p + "self_attn.o_proj.weight": w(D, H * hd),
              p + "self_attn.q_norm.weight": w(hd), p + "self_attn.k_norm.weight": w(hd)})
    if spec.n_expert:
        E, F, Fs = spec.n_expert, spec.n_ff_expert, q35.N_FF_SHARED
        if fused_experts:
            t[p + "mlp.experts.gate_up_proj"] = w(E, 2 * F, D)
            t[p + "mlp.experts.down_proj"] = w(E, D, F)
        else:
            for e in range(E):
                t.update({p + f"mlp.experts.{e}.gate_proj.weight": w(F, D), p + f"mlp.experts.{e}.up_proj.weight": w(F, D),
                          p + f"mlp.experts.{e}.down_proj.weight": w(D, F)})
        t.update({p + "mlp.gate.weight": w(E, D), p + "mlp.shared_expert.gate_proj.weight": w(Fs, D),
                  p + "mlp.shared_expert.up_proj.weight": w(Fs, D), p + "mlp.shared_expert.down_proj.weight": w(D, Fs),
                  p + "mlp.shared_expert_gate.weight": w(1, D)})
    else:
        t.update({p + "mlp.gate_proj.weight": w(spec.n_ff, D), p + "mlp.up_proj.weight": w(spec.n_ff, D),
                  p + "mlp.down_proj.weight": w(D, spec.n_ff)})
    if extras:
        t["mtp.embed_tokens.weight"] = w(vocab_size, D)
        t["mtp.shared_head.head.weight"] = w(vocab_size, D)
    return t


_MTP_NAMES = {"mtp.fc.weight": "nextn.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
              "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight", "mtp.norm.weight": "nextn.shared_head_norm.weight",
              "mtp.embed_tokens.weight": "nextn.embed_tokens.weight",
              "mtp.shared_head.head.weight": "nextn.shared_head_head.weight",
              "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
              "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
              "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
              "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
              "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
              "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
              "mlp.experts.down_proj": "ffn_down_exps.weight"}


def expected_mtp(t: dict[str, torch.Tensor], n: int) -> dict[str, np.ndarray]:
    """What the head becomes, written out by hand: block n, llama.cpp's names, every norm + 1."""
    out: dict[str, np.ndarray] = {}
    stacked: dict[str, list] = {}
    for name, v in t.items():
        a = v.double().numpy()
        key = name[len("mtp.layers.0."):] if name.startswith("mtp.layers.0.") else name
        if ".experts." in name and key.split(".")[2].isdigit():  # mlp.experts.E.kind_proj.weight
            stacked.setdefault(key.split(".")[3].split("_")[0], []).append((int(key.split(".")[2]), a))
            continue
        if key == "mlp.experts.gate_up_proj":
            out[f"blk.{n}.ffn_gate_exps.weight"], out[f"blk.{n}.ffn_up_exps.weight"] = np.split(a, 2, axis=1)
            continue
        if "norm" in key:
            a = a + 1.0
        out[f"blk.{n}.{_MTP_NAMES[key]}"] = a
    for kind, items in stacked.items():
        out[f"blk.{n}.ffn_{kind}_exps.weight"] = np.stack([a for _, a in sorted(items, key=lambda x: x[0])])
    return {k: v.astype(np.float32) for k, v in out.items()}


@pytest.mark.parametrize("moe,fused,key", [(False, False, "mtp_num_hidden_layers"),
                                           (True, False, "num_nextn_predict_layers"), (True, True, None)])
def test_mtp_head_inside_the_checkpoint(tmp_path, moe, fused, key):
    folder = make(tmp_path / "hf", moe=moe)
    head = mtp_tensors(folder.spec, folder.vocab_size, fused_experts=fused, extras=not moe)
    folder.write_tensors({**folder.tensors(), **head})
    if key:
        folder.write_config({**folder.config(), key: 1})
    out = convert(folder.path, tmp_path / "out.gguf")
    n = folder.spec.n_layer
    assert_same_tensors(out, {**folder.expected, **expected_mtp(head, n)})
    assert_engine_metadata(out, folder.spec, folder.vocab_size, n_nextn=1)
    with GGUFFile(out) as f:
        assert f.tensors[f"blk.{n}.attn_q.weight"].shape == (2 * q35.N_HEAD * q35.HEAD_DIM, q35.N_EMBD)


def test_mtp_head_only_folder(tmp_path):
    """config.json and only mtp.* tensors: a GGUF of block N alone (a DRAFT for its target), adopting the target's
    tokenizer when the folder has none."""
    folder = make(tmp_path / "hf", moe=True)
    target = convert(folder.path, tmp_path / "target.gguf")
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / "config.json").write_text(json.dumps({**folder.config(), "mtp_num_hidden_layers": 1}))
    head = mtp_tensors(folder.spec, folder.vocab_size)
    from safetensors.torch import save_file

    save_file(head, str(head_dir / "model.safetensors"))
    from engine.contract.gguf import read_metadata

    donor, _ = read_metadata(target)
    out = convert(head_dir, tmp_path / "head.gguf", role="DRAFT", donor=donor)
    n = folder.spec.n_layer
    assert_same_tensors(out, expected_mtp(head, n))
    with GGUFFile(out) as f, GGUFFile(target) as t:
        assert f.arch_key("block_count") == n + 1 and f.arch_key("nextn_predict_layers") == 1
        assert f.arch_key("ssm.inner_size") == q35.LIN_V_HEADS * q35.LIN_V_DIM
        assert list(f.metadata["tokenizer.ggml.tokens"]) == list(t.metadata["tokenizer.ggml.tokens"])


def test_mtp_head_folder_as_draft_through_the_api(tmp_path):
    """/api/create with the target's files and the head-only folder as draft_files: the DRAFT layer is the head."""
    from safetensors.torch import save_file

    store = BlobStore(tmp_path / "models")
    folder = make(tmp_path / "hf")
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / "config.json").write_text(json.dumps(folder.config()))
    head = mtp_tensors(folder.spec, folder.vocab_size)
    save_file(head, str(head_dir / "model.safetensors"))
    files = {p.name: store.add_file(p)[0] for p in folder.path.iterdir()}
    draft_files = {p.name: store.add_file(p)[0] for p in head_dir.iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "draft_files": draft_files}))
    manifest = store.read_manifest("q")
    draft = store.blob_path(manifest.layer(MEDIA_TYPE_DRAFT).digest)
    assert_same_tensors(draft, expected_mtp(head, folder.spec.n_layer))
    assert_same_tensors(store.blob_path(manifest.layer(MEDIA_TYPE_MODEL).digest), folder.expected)


@pytest.mark.parametrize("moe", [False, True])
def test_an_imported_checkpoint_drafts_with_its_mtp_head(tmp_path, moe):
    """A checkpoint with its ``mtp.*`` head (the oracle head of tests/hf_tiny_qwen35, saved under the
    checkpoint's names) imports into a GGUF whose head the engine runs as the oracle does."""
    folder = make(tmp_path / "hf", moe=moe, tied=False)
    head = q35.build_mtp(folder.hf, seed=0)
    folder.write_tensors({**folder.tensors(), **{"mtp." + k: v.float() for k, v in head.state_dict().items()}})
    model = load_model(convert(folder.path, tmp_path / "out.gguf"), fmt="f32")
    assert model.config.n_layer == folder.spec.n_layer
    tokens, drafts = random_ids(folder.vocab_size, 10), random_ids(folder.vocab_size, 3, seed=4)
    got = q35.engine_head_logits(model, tokens, drafts)
    assert relative_error(got, head.chain(folder.hf, tokens, drafts)) < TOL


# ------------------------------------------------------------------------------------------------
# refusals
# ------------------------------------------------------------------------------------------------
def _refused(folder: Folder, tmp_path: Path, match: str) -> None:
    with pytest.raises(CreateError, match=match):
        convert(folder.path, tmp_path / "out.gguf")


@pytest.mark.parametrize("change,match", [
    ({"layer_types": ["linear_attention", "linear_attention", "full_attention", "full_attention"]},
     "full attention on every"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "sliding_attention"),
    ({"attention_bias": True}, "attention_bias"),
    ({"quantization_config": {"quant_method": "fp8"}}, "already quantized"),
    ({"hidden_act": "gelu"}, "activation"),
    ({"linear_num_value_heads": 3}, "do not divide"),
])
def test_what_the_engine_cannot_run_is_refused(tmp_path, change, match):
    folder = make(tmp_path / "hf")
    folder.write_config({**folder.config(), **change})
    _refused(folder, tmp_path, match)


def test_a_missing_or_misshapen_tensor_is_refused(tmp_path):
    folder = make(tmp_path / "hf")
    t = folder.tensors()
    del t["model.layers.1.linear_attn.dt_bias"]
    folder.write_tensors(t)
    _refused(folder, tmp_path, "lack blk.1.ssm_dt.bias")
    t["model.layers.1.linear_attn.dt_bias"] = torch.zeros(5)
    folder.write_tensors(t)
    _refused(folder, tmp_path, r"dt_bias has shape \[5\]")
    del t["model.layers.1.linear_attn.dt_bias"]
    t["model.layers.3.linear_attn.dt_bias"] = torch.zeros(q35.LIN_V_HEADS)  # a DeltaNet tensor on the attention layer
    folder.write_tensors(t)
    _refused(folder, tmp_path, "layers.3.linear_attn.dt_bias has no counterpart")


def test_a_two_layer_mtp_head_is_refused(tmp_path):
    folder = make(tmp_path / "hf")
    head = mtp_tensors(folder.spec, folder.vocab_size)
    head["mtp.layers.1.input_layernorm.weight"] = torch.zeros(q35.N_EMBD)
    folder.write_tensors({**folder.tensors(), **head})
    _refused(folder, tmp_path, "more than one layer")
