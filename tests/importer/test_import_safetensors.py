"""Importing Hugging Face safetensors folders (targets, drafters and MTP heads) into the blob store.

* every architecture, in F32/F16/BF16, single-file and sharded: the created model's GGUF gives the
  logits transformers gives on the same files (float64 reference of the stored weights), and its
  tokenizer encodes like the folder's tokenizer (byte-level Llama 3 / Qwen2 / SmolLM styles and
  SentencePiece Llama 2 / Gemma styles);
* config variants the GGUF must carry (Llama 3 RoPE factors, gemma3 linear scaling and query scale);
* a NextN (MTP) head in DeepSeek-V3 naming, inside the checkpoint or as a DRAFT folder of its own,
  drafts losslessly through the speculation engine; a head of the wrong width is refused;
* every refusal (missing config, unknown architecture, shapes, quantized sources, corrupt headers,
  missing tokenizer, missing shards) names the problem and leaves the store as it was.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blobs import MEDIA_TYPE_DRAFT, MEDIA_TYPE_MODEL, BlobStore, ModelNotFoundError  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.contract.protocol import EngineError, LoadSpec  # noqa: E402
from engine.runtime import ModelRuntime  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402
from importer import (  # noqa: E402
    CreateError,
    CreateRequest,
    LocalBlobSink,
    create_model,
    request_from_modelfile,
)
from importer.hf_to_gguf import convert_folder  # noqa: E402
from importer.hf.safetensors import read_header  # noqa: E402
from modelfile import parse  # noqa: E402
from tests import hf_folders  # noqa: E402
from tests.hf_folders import (  # noqa: E402
    SAMPLE,
    Folder,
    add_nextn,
    head_folder,
    make_folder,
    random_ids,
)
from tests.engine.speculative.test_speculation import GREEDY, generate, spec_opts  # noqa: E402
from tests.tiny_gguf import CHATML_TEMPLATE, TinySpec, spm_vocab, write_tiny_gguf  # noqa: E402

TOL = 1e-4  # max |Δlogit| relative to the reference's logit scale (weights are identical; f32 vs f64 compute)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "models")


def _request(store: BlobStore, text: str, base: Path, name: str = "imported") -> CreateRequest:
    return request_from_modelfile(parse(text), name, base, LocalBlobSink(store))


def create(store: BlobStore, text: str, base: Path, name: str = "imported") -> list:
    events: list = []
    create_model(store, _request(store, text, base, name), events.append)
    return events


def _layer_path(store: BlobStore, name: str, media_type: str) -> Path:
    layer = store.read_manifest(name).layer(media_type)
    assert layer is not None
    return store.blob_path(layer.digest)


def _max_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref).abs().max() / ref.abs().max())


def _logits_err(folder: Folder, gguf_path: Path, n: int = 24) -> float:
    model = load_model(gguf_path, fmt="f32")
    ids = random_ids(folder.vocab_size, n)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    ours = model(torch.tensor(ids), model.new_cache())
    model.close()
    return _max_err(ours, ref)


# ------------------------------------------------------------------------------------------------
# targets: logits and tokenizer against transformers
# ------------------------------------------------------------------------------------------------
CASES = {
    # id: (arch, dtype, max shard size, tokenizer style, tied)
    "llama-f32": ("llama", "F32", None, "llama3", True),
    "llama-bf16-sharded": ("llama", "BF16", "30KB", "llama2", True),
    "llama-f16": ("llama", "F16", None, "llama3", False),
    "qwen2-f32-sharded-untied": ("qwen2", "F32", "30KB", "qwen2", False),
    "qwen2-bf16": ("qwen2", "BF16", None, "smollm", True),
    "gemma3-f32": ("gemma3", "F32", None, "gemma", True),
    "gemma3-bf16-sharded": ("gemma3", "BF16", "60KB", "gemma", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_import_matches_transformers(store: BlobStore, tmp_path: Path, case: str) -> None:
    arch, dtype, shard, style, tied = CASES[case]
    folder = make_folder(arch, tmp_path / "hf", dtype=dtype, shard_size=shard, style=style, tied=tied)
    if shard:
        assert (folder.path / "model.safetensors.index.json").exists()
        assert len(list(folder.path.glob("*.safetensors"))) > 2
    events = create(store, "FROM ./hf\n", tmp_path)

    # Progress: "converting model" from 0 to every byte, then the normal create path.
    conv = [e for e in events if e.status == "converting model"]
    assert conv[0].completed == 0 and conv[-1].completed == conv[-1].total > 0
    assert events[-1].status == "success"

    path = _layer_path(store, "imported", MEDIA_TYPE_MODEL)
    with GGUFFile(path) as f:
        assert f.architecture == arch and f.file_type == dtype
        assert f.arch_key("block_count") == folder.config["num_hidden_layers"]
        assert ("output.weight" in f.tensors) == (not tied)
        weights = {t.type_name for n, t in f.tensors.items() if len(t.dims) == 2}
        assert weights == {dtype}
        assert {t.type_name for t in f.tensors.values() if len(t.dims) == 1} == {"F32"}
        assert f.metadata["tokenizer.chat_template"] == CHATML_TEMPLATE
        tok = Tokenizer.from_gguf_metadata(f.metadata)
    config = json.loads(store.read_blob(store.read_manifest("imported").config.digest))
    assert config["model_family"] == arch and config["file_type"] == dtype

    assert _logits_err(folder, path) < TOL

    import transformers as tf

    hf_tok = tf.AutoTokenizer.from_pretrained(folder.path)
    assert tok.encode(SAMPLE, add_bos=False) == hf_tok(SAMPLE, add_special_tokens=False)["input_ids"]
    assert tok.encode(SAMPLE) == hf_tok(SAMPLE)["input_ids"]  # BOS added exactly when HF adds one
    assert tok.decode(tok.encode(SAMPLE, add_bos=False)) == hf_tok.decode(
        hf_tok(SAMPLE, add_special_tokens=False)["input_ids"])


VARIANTS = {
    "llama3-rope-scaling": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "gemma3-linear-rope-and-query-scale": ("gemma3", {"query_pre_attn_scalar": 32, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 4.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_variants_match_transformers(store: BlobStore, tmp_path: Path, variant: str) -> None:
    arch, overrides = VARIANTS[variant]
    folder = make_folder(arch, tmp_path / "hf", config_overrides=overrides)
    create(store, "FROM ./hf\n", tmp_path)
    path = _layer_path(store, "imported", MEDIA_TYPE_MODEL)
    with GGUFFile(path) as f:
        if arch == "llama":
            assert "rope_freqs.weight" in f.tensors
        else:
            assert f.arch_key("rope.scaling.type") == "linear" and f.arch_key("rope.scaling.factor") == 4.0
            assert f.arch_key("attention.scale") == pytest.approx(32 ** -0.5)
    assert _logits_err(folder, path, n=40) < TOL


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model."])  # transformers 4 / 5
def test_gemma3_multimodal_checkpoint_imports_its_text_model(store: BlobStore, tmp_path: Path, prefix: str) -> None:
    """Gemma3ForConditionalGeneration: the text model under its prefix is imported, the vision tower skipped."""
    from safetensors.torch import load_file, save_file

    folder = make_folder("gemma3", tmp_path / "hf")
    weights = load_file(str(folder.path / "model.safetensors"))
    renamed = {prefix + k[len("model."):]: v for k, v in weights.items()}
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(8, 3, 2, 2)
    renamed["multi_modal_projector.mm_input_projection_weight"] = torch.zeros(8, 64)
    save_file(renamed, str(folder.path / "model.safetensors"), metadata={"format": "pt"})
    text = {k: v for k, v in folder.config.items() if k not in ("architectures", "tie_word_embeddings")}
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
              "vision_config": {"hidden_size": 8}, "tie_word_embeddings": True}
    (folder.path / "config.json").write_text(json.dumps(config))
    create(store, "FROM ./hf\n", tmp_path)
    path = _layer_path(store, "imported", MEDIA_TYPE_MODEL)
    with GGUFFile(path) as f:
        assert f.architecture == "gemma3" and not any("vision" in n or "mm_" in n for n in f.tensors)
    assert _logits_err(folder, path) < TOL


def test_api_create_with_chat_template_jinja_and_quantize(store: BlobStore, tmp_path: Path) -> None:
    """/api/create's JSON body with uploaded blobs; transformers 5 keeps the template in chat_template.jinja;
    the converted model then goes through --quantize like any GGUF."""
    folder = make_folder("qwen2", tmp_path / "hf", template=None)
    hf_folders.save_tokenizer(hf_folders.make_tokenizer("qwen2"), folder.path, template="{{ messages }}",
                              jinja_file=True)
    files = {p.name: store.add_file(p)[0] for p in folder.path.iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "quantize": "q8_0"}))
    with GGUFFile(_layer_path(store, "q", MEDIA_TYPE_MODEL)) as f:
        assert f.metadata["tokenizer.chat_template"] == "{{ messages }}"
        assert f.file_type == "Q8_0"


def test_safetensors_draft_model(store: BlobStore, tmp_path: Path) -> None:
    """A full drafter folder (same tokenizer, fewer layers) as DRAFT: converted, paired, drafting losslessly.
    (Through /api/create's body: both folders upload the same tokenizer.json blob.)"""
    target = make_folder("qwen2", tmp_path / "target", tied=False)
    draft = make_folder("qwen2", tmp_path / "draft", seed=1, n_layer=1)
    files = {p.name: store.add_file(p)[0] for p in target.path.iterdir()}
    draft_files = {p.name: store.add_file(p)[0] for p in draft.path.iterdir()}
    events: list = []
    create_model(store, CreateRequest.from_json({"model": "pair", "files": files, "draft_files": draft_files,
                                                 "draft_quantize": "q8_0"}), events.append)
    assert any(e.status == "converting draft model" for e in events)
    draft_path = _layer_path(store, "pair", MEDIA_TYPE_DRAFT)
    with GGUFFile(draft_path) as f:
        assert f.arch_key("block_count") == 1 and f.file_type == "Q8_0"
    engine = _engine(_layer_path(store, "pair", MEDIA_TYPE_MODEL), draft_path)
    assert engine.draft_kind == "model"
    base = generate(engine, **GREEDY, drafter="none")
    run = generate(engine, **GREEDY, **spec_opts("model", 3))
    assert run.tokens == base.tokens and run.spec.draft_n > 0
    engine.close()


def test_modelfile_draft_folder_sharing_the_targets_tokenizer(store: BlobStore, tmp_path: Path) -> None:
    """`FROM ./target` + `DRAFT ./draft` where both folders ship the same tokenizer files: only the weights
    must differ (a drafter folder normally carries its target's tokenizer.json)."""
    make_folder("qwen2", tmp_path / "target", tied=False)
    make_folder("qwen2", tmp_path / "draft", seed=1, n_layer=1)
    assert (tmp_path / "target" / "tokenizer.json").read_bytes() == (tmp_path / "draft" / "tokenizer.json").read_bytes()
    create(store, "FROM ./target\nDRAFT ./draft\n", tmp_path, name="pair")
    with GGUFFile(_layer_path(store, "pair", MEDIA_TYPE_DRAFT)) as f:
        assert f.arch_key("block_count") == 1
    # The same weights as FROM and DRAFT are still refused, and nothing is created.
    with pytest.raises(CreateError, match="DRAFT must not reference the same"):
        create(store, "FROM ./target\nDRAFT ./target\n", tmp_path, name="same")
    with pytest.raises(ModelNotFoundError):
        store.read_manifest("same")


def _write_spm_model(path: Path, add_dummy_prefix: bool = True) -> None:
    """A SentencePiece ModelProto (BPE) with tiny_gguf's SentencePiece vocabulary, in protobuf wire format."""

    def varint(n: int) -> bytes:
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    def field(no: int, payload: bytes) -> bytes:
        return varint(no << 3 | 2) + varint(len(payload)) + payload

    tokens, types, scores = spm_vocab()
    data = b""
    for tok, ty, score in zip(tokens, types, scores):
        piece = field(1, tok.encode()) + varint(2 << 3 | 5) + struct.pack("<f", score) + varint(3 << 3) + varint(ty)
        data += field(1, piece)
    data += field(2, varint(3 << 3) + varint(2))  # trainer_spec.model_type = BPE
    data += field(3, varint(3 << 3) + varint(int(add_dummy_prefix)))  # normalizer_spec.add_dummy_prefix
    path.write_bytes(data)


def test_tokenizer_model_without_tokenizer_json(store: BlobStore, tmp_path: Path) -> None:
    """A bare SentencePiece tokenizer.model: pieces, scores and types carried over exactly, so the
    engine tokenizes like on a GGUF converted by llama.cpp from the same vocabulary."""
    folder = make_folder("llama", tmp_path / "hf", style="llama2", template=None)
    for p in folder.path.glob("tokenizer*"):
        p.unlink()
    _write_spm_model(folder.path / "tokenizer.model")
    (folder.path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "add_bos_token": True}))
    create(store, "FROM ./hf\n", tmp_path)
    tokens, types, scores = spm_vocab()
    with GGUFFile(_layer_path(store, "imported", MEDIA_TYPE_MODEL)) as f:
        md = f.metadata
        assert md["tokenizer.ggml.model"] == "llama"
        assert list(md["tokenizer.ggml.tokens"]) == tokens
        assert [int(t) for t in md["tokenizer.ggml.token_type"]] == types
        assert [float(s) for s in md["tokenizer.ggml.scores"]] == scores
        ours = Tokenizer.from_gguf_metadata(md)
    with GGUFFile(write_tiny_gguf(tmp_path / "ref.gguf", TinySpec(tokenizer="llama"))) as ref_file:
        ref = Tokenizer.from_gguf_metadata(ref_file.metadata)
    assert ours.encode(SAMPLE, add_bos=False) == ref.encode(SAMPLE, add_bos=False)
    assert ours.encode("the end")[0] == ref.bos_id and ours.add_bos


# ------------------------------------------------------------------------------------------------
# MTP (NextN) heads
# ------------------------------------------------------------------------------------------------
def _engine(model: Path, draft: Path | None = None) -> ModelRuntime:
    return ModelRuntime.load(LoadSpec(model_path=str(model), draft_path=str(draft) if draft else None, num_ctx=128,
                                weight_format="f32", draft_weight_format="f32", device="cpu"))


def _assert_mtp_drafts_losslessly(engine: ModelRuntime) -> None:
    base = generate(engine, **GREEDY, drafter="none")
    run = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    assert run.tokens == base.tokens
    assert run.spec.drafter == "mtp" and run.spec.draft_n > 0 and run.spec.draft_rounds > 0


def test_nextn_head_inside_the_checkpoint(store: BlobStore, tmp_path: Path) -> None:
    folder = make_folder("llama", tmp_path / "hf", tied=False)
    add_nextn(folder)
    create(store, "FROM ./hf\n", tmp_path)
    path = _layer_path(store, "imported", MEDIA_TYPE_MODEL)
    n = folder.config["num_hidden_layers"]
    with GGUFFile(path) as f:
        assert f.arch_key("block_count") == n  # the head is not a layer of the model
        nextn = sorted(k for k in f.tensors if k.startswith(f"blk.{n}."))
        assert f"blk.{n}.nextn.eh_proj.weight" in nextn and f"blk.{n}.attn_q.weight" in nextn
        assert {f"blk.{n}.nextn.{s}.weight" for s in ("enorm", "hnorm", "shared_head_norm", "shared_head_head",
                                                       "embed_tokens")} <= set(nextn)
    # The model without its head is still exactly the transformers model.
    assert _logits_err(folder, path) < TOL
    engine = _engine(path)
    assert sorted(engine.drafters) == ["mtp", "ngram"]
    _assert_mtp_drafts_losslessly(engine)
    engine.close()


def test_nextn_head_as_a_separate_draft_folder(store: BlobStore, tmp_path: Path) -> None:
    """A head-only folder (config + one NextN layer, no tokenizer: it adopts the target's) as DRAFT."""
    folder = make_folder("llama", tmp_path / "target")
    head_folder(folder, tmp_path / "head")
    events = create(store, "FROM ./target\nDRAFT ./head\n", tmp_path)
    assert any(e.status == "converting draft model" for e in events)
    target = _layer_path(store, "imported", MEDIA_TYPE_MODEL)
    draft = _layer_path(store, "imported", MEDIA_TYPE_DRAFT)
    with GGUFFile(draft) as f, GGUFFile(target) as t:
        assert "token_embd.weight" not in f.tensors and "blk.2.nextn.eh_proj.weight" in f.tensors
        assert list(f.metadata["tokenizer.ggml.tokens"]) == list(t.metadata["tokenizer.ggml.tokens"])
    config = json.loads(store.read_blob(store.read_manifest("imported").config.digest))
    assert config["draft"] == {"model_format": "gguf", "architecture": "llama"}

    engine = _engine(target, draft)
    assert engine.draft_kind == "mtp" and sorted(engine.drafters) == ["mtp", "ngram"]
    assert engine.drafters["mtp"].memory_bytes() > 0
    _assert_mtp_drafts_losslessly(engine)
    # The server resolves `auto` with a DRAFT layer to the DRAFT drafter: for a head, that is the head.
    for kind in ("auto", "model"):
        run = generate(engine, temperature=0, num_predict=8, drafter=kind, draft_num_predict=2)
        assert run.spec.drafter == "mtp+suffix"
    engine.close()


def test_qwen2_head_with_its_own_tokenizer_through_the_api(store: BlobStore, tmp_path: Path) -> None:
    folder = make_folder("qwen2", tmp_path / "target", tied=False)
    head = head_folder(folder, tmp_path / "head", with_tokenizer=True)
    files = {p.name: store.add_file(p)[0] for p in folder.path.iterdir()}
    draft_files = {p.name: store.add_file(p)[0] for p in head.iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "draft_files": draft_files}))
    engine = _engine(_layer_path(store, "q", MEDIA_TYPE_MODEL), _layer_path(store, "q", MEDIA_TYPE_DRAFT))
    assert engine.draft_kind == "mtp"
    _assert_mtp_drafts_losslessly(engine)
    engine.close()


def test_head_of_another_width_is_refused(store: BlobStore, tmp_path: Path) -> None:
    folder = make_folder("llama", tmp_path / "target")
    head_folder(folder, tmp_path / "head", hidden=32)
    req = _request(store, "FROM ./target\nDRAFT ./head\n", tmp_path)
    with pytest.raises(CreateError, match="MTP head hidden size 32 does not match the target's 64"):
        create_model(store, req)
    assert store.list_models() == []

    # The engine refuses such a pair too (a GGUF made outside tandem create).
    target = tmp_path / "t.gguf"
    convert_folder({p.name: p for p in folder.path.iterdir()}, target, "FROM")
    with GGUFFile(target) as t:
        donor = dict(t.metadata)
    draft = tmp_path / "d.gguf"
    convert_folder({p.name: p for p in (tmp_path / "head").iterdir()}, draft, "DRAFT", tokenizer_donor=donor)
    with pytest.raises(EngineError, match="MTP head hidden size 32 does not match the target's 64") as e:
        _engine(target, draft)
    assert e.value.status == 400


def test_a_head_alone_is_not_a_model(store: BlobStore, tmp_path: Path) -> None:
    folder = make_folder("llama", tmp_path / "target")
    head_folder(folder, tmp_path / "head", with_tokenizer=True)
    req = _request(store, "FROM ./head\n", tmp_path)
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match="the model is only an MTP \\(NextN\\) head, which drafts for a target"):
        create_model(store, req)
    assert store.list_models() == [] and store.list_blobs() == uploaded


# ------------------------------------------------------------------------------------------------
# refusals: clear message, store untouched
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    """A sharded llama folder the error tests copy and break."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("base") / "hf"
    make_folder("llama", d, shard_size="30KB")
    return d


def _set_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _a_shard(d: Path) -> Path:
    return sorted(d.glob("model-*.safetensors"))[1]


def _int_tensor(d: Path) -> None:
    """Rewrite one shard with one of its tensors stored as I32, as quantized checkpoints store packed weights."""
    from safetensors.torch import load_file, save_file

    shard = _a_shard(d)
    tensors = load_file(str(shard))
    name = min(tensors)
    tensors[name] = tensors[name].view(torch.int32)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _corrupt_header(d: Path) -> None:
    shard = _a_shard(d)
    data = shard.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    shard.write_bytes(data[:8] + b"{" + b"x" * (n - 1) + data[8 + n:])


def _drop_tokenizer(d: Path) -> None:
    for p in d.glob("tokenizer*"):
        p.unlink()


def _drop_shard(d: Path) -> None:
    _a_shard(d).unlink()


def _unsupported_pretokenizer(d: Path) -> None:
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, tj["pre_tokenizer"]]}
    (d / "tokenizer.json").write_text(json.dumps(tj))


ERRORS = {
    "missing config": (lambda d: (d / "config.json").unlink(), r"FROM: config\.json is missing"),
    "unknown architecture": (lambda d: _set_config(d, architectures=["MambaForCausalLM"]), (
        r"unsupported architecture MambaForCausalLM in config\.json \(tandem imports: "
        r"LlamaForCausalLM, Qwen2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, "
        r"Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, "
        r"Gemma4AssistantForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5MoeForCausalLM, "
        r"Qwen3_5MoeForConditionalGeneration\)")),
    "mismatched shapes": (lambda d: _set_config(d, intermediate_size=96), (
        r"tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[128, 64\], but config\.json implies \[96, 64\]")),
    "quantization_config": (lambda d: _set_config(d, quantization_config={"quant_method": "gptq", "bits": 4}),
                            r"already quantized \(quantization_config: gptq\)"),
    "int tensor": (_int_tensor, r"tensor model\.\S+ is I32: the checkpoint is already quantized"),
    "corrupt header": (_corrupt_header, (
        r"model-00002-of-\d+\.safetensors: corrupt safetensors header: the header is not valid JSON")),
    "missing tokenizer": (_drop_tokenizer, r"the tokenizer is missing: upload tokenizer\.json"),
    "missing shard": (_drop_shard, (
        r"model\.safetensors\.index\.json names 1 shard\(s\) that were not uploaded: model-00002-of-\d+\.safetensors")),
    "unknown rope scaling": (lambda d: _set_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                       "rope_theta": 1e4}),
                             r"RoPE scaling 'yarn' is not supported for llama"),
    "unsupported pre-tokenizer": (_unsupported_pretokenizer, r"pre-tokenizer step .*Whitespace.* is not supported"),
    "extra tensor": (lambda d: _add_tensor(d, "model.layers.0.self_attn.o_proj.bias", torch.zeros(64)),
                     r"tensor model\.layers\.0\.self_attn\.o_proj\.bias \(blk\.0\.attn_output\.bias\) is not supported"),
    "missing tensor": (lambda d: _drop_tensor(d, "model.layers.1.mlp.up_proj.weight"),
                       r"the safetensors lack blk\.1\.ffn_up\.weight"),
}


def _add_tensor(d: Path, name: str, value: torch.Tensor) -> None:
    from safetensors.torch import save_file

    save_file({name: value}, str(d / "model-extra.safetensors"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"][name] = "model-extra.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _drop_tensor(d: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = d / index["weight_map"].pop(name)
    tensors = load_file(str(shard))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("error", list(ERRORS))
def test_refusals_leave_the_store_untouched(store: BlobStore, base_folder: Path, tmp_path: Path, error: str) -> None:
    breaker, message = ERRORS[error]
    d = tmp_path / "hf"
    shutil.copytree(base_folder, d)
    breaker(d)
    req = _request(store, "FROM ./hf\n", tmp_path)
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match=message):
        create_model(store, req)
    assert store.list_models() == []
    assert store.list_blobs() == uploaded


def test_draft_folder_refusals_leave_the_store_untouched(store: BlobStore, base_folder: Path, tmp_path: Path) -> None:
    """The DRAFT side is converted and vetted the same way (a GGUF target, a broken safetensors draft)."""
    write_tiny_gguf(tmp_path / "target.gguf")
    d = tmp_path / "hf"
    shutil.copytree(base_folder, d)
    _corrupt_header(d)
    req = _request(store, "FROM ./target.gguf\nDRAFT ./hf\n", tmp_path)
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match=r"DRAFT: model-00002-of-\d+\.safetensors: corrupt safetensors header"):
        create_model(store, req)
    assert store.list_models() == [] and store.list_blobs() == uploaded


def test_pytorch_pickles_are_refused(store: BlobStore, tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    files = {"pytorch_model.bin": store.add_file(tmp_path / "pytorch_model.bin")[0]}
    with pytest.raises(CreateError, match="PyTorch pickle weights are not supported"):
        create_model(store, CreateRequest(model="x", files=files))


# ------------------------------------------------------------------------------------------------
# safetensors header validation
# ------------------------------------------------------------------------------------------------
def _st_file(path: Path, header: dict | bytes, data: bytes = b"", length: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize("header,data,length,message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 10_000, "header length 10000 does not fit"),
    (b"[1, 2]", b"", None, "the header is not a JSON object"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8, None, "outside the 8-byte data section"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs 12 bytes, its offsets give 8"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}}, b"\0" * 8, None, "invalid shape"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "overlap"),
])
def test_corrupt_headers_are_named(tmp_path: Path, header, data, length, message) -> None:
    path = _st_file(tmp_path / "x.safetensors", header, data, length)
    with pytest.raises(CreateError, match=f"FROM: x.safetensors: corrupt safetensors header: .*{message}"):
        read_header(path, "x.safetensors", "FROM")


def test_truncated_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(b"\1\2\3")
    with pytest.raises(CreateError, match="corrupt safetensors header: the file has 3 bytes, fewer than the 8-byte"):
        read_header(tmp_path / "x.safetensors", "x.safetensors", "FROM")


def test_valid_header_entries(tmp_path: Path) -> None:
    path = _st_file(tmp_path / "ok.safetensors", {"__metadata__": {"format": "pt"},
                                                  "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}},
                    b"\0" * 12)
    (entry,) = read_header(path, "ok.safetensors", "FROM").values()
    assert (entry.name, entry.dtype, entry.shape, entry.file) == ("w", "BF16", (2, 3), "ok.safetensors")
