"""Importing Hugging Face Gemma 4 safetensors folders: ``Gemma4ForCausalLM`` (E2B-like: per-layer embeddings, KV
sharing, double-wide FFN; 31B-like: K = V global layers with their own K/V head count; 26B-A4B-like: a mixture of
experts beside every layer's dense FFN), the text model of a ``Gemma4ForConditionalGeneration``, and a
``Gemma4AssistantForCausalLM`` as DRAFT.

The GGUF is the one llama.cpp's layout prescribes (the same tensors, shapes and ``gemma4.*`` metadata as
tests/hf_tiny_gemma4.py writes for the engine's own tests), its logits and tokenizer ids equal transformers' on
the saved files, the imported assistant drafts the logits of a hand-rolled transformers loop and losslessly,
``draft_quantize`` stores a quantized assistant that still drafts, ``quantize`` stores the 26B-like model's experts
quantized (its router and scales F32) and it still predicts what transformers does, and refusals (an assistant
for another width, an inconsistent mixture of experts) name the problem and leave the store as it was.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from blobs import MEDIA_TYPE_DRAFT, MEDIA_TYPE_MODEL, BlobStore  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.models.loader import load_assistant, load_model  # noqa: E402
from engine.ops.kernels import qdot_status  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402
from importer import CreateError, CreateRequest, LocalBlobSink, create_model, request_from_modelfile  # noqa: E402
from modelfile import parse  # noqa: E402
from tests import hf_tiny_gemma4 as g4  # noqa: E402
from tests.engine.speculative.test_speculation import GREEDY, generate, load_engine, spec_opts  # noqa: E402
from tests.hf_folders import random_ids  # noqa: E402
from tests.hf_gemma4_folders import SAMPLE, make_assistant_folder, make_gemma4_folder, make_tokenizer  # noqa: E402

TOL = 1e-4  # as test_import_safetensors: identical weights, f32 compute against float64


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "models")


def _create(store: BlobStore, base: Path, text: str, name: str = "imported", **fields) -> None:
    req = request_from_modelfile(parse(text), name, base, LocalBlobSink(store))
    for key, value in fields.items():
        setattr(req, key, value)
    create_model(store, req)


def _path(store: BlobStore, name: str, media_type: str = MEDIA_TYPE_MODEL) -> Path:
    return store.blob_path(store.read_manifest(name).layer(media_type).digest)


def _arch_metadata(f: GGUFFile) -> dict:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in f.metadata.items()
            if k.startswith(f.architecture + ".")}


@pytest.mark.parametrize("variant,dtype,shard,multimodal", [("e2b", "F32", None, False), ("31b", "F32", None, False),
                                                            ("e2b", "BF16", "60KB", False), ("31b", "F32", None, True),
                                                            ("26b", "F32", None, False), ("26b", "BF16", "60KB", False),
                                                            ("26b", "F32", None, True)])
def test_gemma4_import_matches_transformers(store, tmp_path, variant, dtype, shard, multimodal):
    folder = make_gemma4_folder(variant, tmp_path / "hf", dtype=dtype, shard_size=shard, multimodal=multimodal)
    assert shard is None or len(list(folder.path.glob("*.safetensors"))) > 1
    _create(store, tmp_path, "FROM ./hf\n")
    path = _path(store, "imported")
    # llama.cpp's layout: what the engine tests' own converter writes for the same (F32) weights
    ref_gguf = g4.write_gemma4_gguf(tmp_path / "ref.gguf", folder.config,
                                    g4.gguf_tensors(folder.reference.state_dict()))
    with GGUFFile(path) as f, GGUFFile(ref_gguf) as ref:
        assert f.architecture == "gemma4" and f.file_type == dtype
        assert {n: t.shape for n, t in f.tensors.items()} == {n: t.shape for n, t in ref.tensors.items()}
        assert _arch_metadata(f) == _arch_metadata(ref)
        assert f.metadata["tokenizer.ggml.model"] == "gemma4"
        assert f.metadata["tokenizer.chat_template"] == g4.CHAT_TEMPLATE
        assert (f.tensor_data("rope_freqs.weight") == ref.tensor_data("rope_freqs.weight")).all()
        tok = Tokenizer.from_gguf_metadata(f.metadata)
    hf_tok = make_tokenizer()
    assert tok.encode(SAMPLE, add_bos=False) == hf_tok(SAMPLE, add_special_tokens=False)["input_ids"]
    assert tok.encode(SAMPLE) == hf_tok(SAMPLE)["input_ids"]
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, 20)  # longer than the sliding window
    with torch.no_grad():
        ref_logits = folder.reference(torch.tensor([ids])).logits[0]
    cache = model.new_cache()
    ours = torch.cat([model(torch.tensor(ids[:-1]), cache), model(torch.tensor(ids[-1:]), cache)])  # + one decode
    model.close()
    assert float((ours.double() - ref_logits).abs().max() / ref_logits.abs().max()) < TOL


@pytest.fixture(scope="module")
def imported_pair(tmp_path_factory):
    """A 31B-like target and its assistant (no tokenizer files: it adopts the target's), imported together."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("g4pair")
    target = make_gemma4_folder("31b", d / "target")
    assistant, assistant_ref = make_assistant_folder(target, d / "assistant")
    store = BlobStore(d / "models")
    _create(store, d, "FROM ./target\nDRAFT ./assistant\n", name="pair")
    return SimpleNamespace(dir=d, store=store, target=target, assistant_ref=assistant_ref,
                           model=_path(store, "pair"), draft=_path(store, "pair", MEDIA_TYPE_DRAFT))


def _assert_drafts_match(model_path: Path, draft_path: Path, target_ref, assistant_ref, vocab_size: int,
                         length: int = 12) -> None:
    """tandem's drafted logits at each of 3 steps equal a hand-rolled transformers drafting round (on the rows
    transformers scores: an ordered-embeddings head masks the others to its minimum)."""
    model = load_model(model_path, fmt="f32")
    with GGUFFile(draft_path) as f:
        drafter = load_assistant(model, f, "f32")
    log = [random.Random(length).randrange(vocab_size) for _ in range(length)]
    want, ref = g4.hf_assistant_drafts(SimpleNamespace(hf=target_ref), SimpleNamespace(hf=assistant_ref), log, 3)
    cache = model.new_cache(64)
    out = model(log[:-1], cache, return_hidden=True)
    h, token = model.norm(out.prenorm_hidden[-1:])[0], log[-1]
    for i in range(3):
        logits, h = drafter.step(token, h, cache, len(log) - 1)
        scored = ref[i] > ref[i].min()
        ours = logits[0].double()
        assert float((ours[scored] - ref[i][scored]).abs().max() / ref[i].abs().max()) < TOL
        assert float(ours.max()) >= float(ref[i].max()) - TOL  # the full vocabulary's best is at least as good
        token = int(ref[i].argmax()) if not bool(scored.all()) else int(logits.argmax())
        assert token == want[i]
    model.close()


def test_imported_assistant_drafts_the_transformers_logits(imported_pair):
    p = imported_pair
    with GGUFFile(p.draft) as f:
        assert f.architecture == "gemma4-assistant"
        assert f.arch_key("embedding_length_out") == g4.N_EMBD and f.arch_key("embedding_length") == g4.ASSISTANT_EMBD
        assert f.arch_key("nextn_predict_layers") == len(g4.ASSISTANT_LAYER_TYPES)
        assert "nextn.pre_projection.weight" in f.tensors and not any("attn_k" in n for n in f.tensors)
    _assert_drafts_match(p.model, p.draft, p.target.reference, p.assistant_ref, p.target.vocab_size)


def test_an_ordered_embeddings_assistant_imports_without_its_centroids(store, tmp_path):
    """The E2B/E4B assistants' centroid head only picks which rows of the tied embedding to score: the import
    leaves it out, and tandem scores every row (the drafts are the target's to verify either way)."""
    target = make_gemma4_folder("e2b", tmp_path / "target")
    _, assistant_ref = make_assistant_folder(target, tmp_path / "assistant", ordered=True)
    _create(store, tmp_path, "FROM ./target\nDRAFT ./assistant\n", name="pair")
    draft = _path(store, "pair", MEDIA_TYPE_DRAFT)
    with GGUFFile(draft) as f:
        assert not any("centroid" in n or "ordering" in n for n in f.tensors)
    _assert_drafts_match(_path(store, "pair"), draft, target.reference, assistant_ref, target.vocab_size)


def test_imported_pair_drafts_losslessly(imported_pair):
    engine = load_engine(imported_pair.model, imported_pair.draft)
    assert engine.draft_kind == "mtp"
    plain = generate(engine, **GREEDY, drafter="none")
    run = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    assert run.tokens == plain.tokens and run.spec.drafter == "mtp" and run.spec.draft_n > 0
    engine.close()


@pytest.mark.parametrize("quant,weight_type", [("q8_0", "Q8_0"), ("q4_K_M", "Q5_0")])
def test_draft_quantize_quantizes_the_assistant(imported_pair, quant, weight_type):
    """q8_0 through a Modelfile request, q4_K_M through /api/create's body (``draft_quantize``): the assistant's
    matrices are quantized (a K type falls back as llama.cpp's does when rows are not whole 256-value
    super-blocks), its norms stay F32, and it still drafts for the unquantized target."""
    p = imported_pair
    name = f"pair-{quant}"
    if quant == "q8_0":
        _create(p.store, p.dir, "FROM ./target\nDRAFT ./assistant\n", name=name, draft_quantize=quant)
    else:
        files = {f.name: p.store.add_file(f)[0] for f in (p.dir / "target").iterdir()}
        draft_files = {f.name: p.store.add_file(f)[0] for f in (p.dir / "assistant").iterdir()}
        create_model(p.store, CreateRequest.from_json({"model": name, "files": files, "draft_files": draft_files,
                                                       "draft_quantize": quant}))
    draft = _path(p.store, name, MEDIA_TYPE_DRAFT)
    with GGUFFile(draft) as f:
        assert f.architecture == "gemma4-assistant" and f.file_type == quant.upper()
        assert f.tensors["blk.0.ffn_up.weight"].type_name == weight_type
        assert f.tensors["nextn.pre_projection.weight"].type_name == weight_type
        assert f.tensors["blk.0.attn_norm.weight"].type_name == "F32"
    with GGUFFile(_path(p.store, f"pair-{quant}")) as f:
        assert f.file_type == "F32"  # the target is left as it was
    engine = load_engine(p.model, draft)
    plain = generate(engine, **GREEDY, drafter="none")
    run = generate(engine, **GREEDY, **spec_opts("mtp", 3))
    assert run.tokens == plain.tokens and run.spec.draft_n > 0
    engine.close()


def test_an_assistant_for_another_width_is_refused(store, tmp_path):
    target = make_gemma4_folder("e2b", tmp_path / "target")
    make_assistant_folder(target, tmp_path / "assistant", backbone=96)
    req = request_from_modelfile(parse("FROM ./target\nDRAFT ./assistant\n"), "pair", tmp_path, LocalBlobSink(store))
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match="embedding_length_out") as e:
        create_model(store, req)
    assert "96" in str(e.value) and "64" in str(e.value)
    assert store.list_models() == [] and store.list_blobs() == uploaded


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_gemma4_moe_tensors_are_stored_as_llama_cpp_does(store, tmp_path, dtype):
    """The 26B-like model's experts stay stacked as transformers saves them (gate_up fused, gate rows first), in the
    checkpoint's dtype; the router, its input scale, the per-expert scales and the branch norms are F32. From F32
    weights every tensor is byte for byte what the engine tests' own converter writes."""
    folder = make_gemma4_folder("26b", tmp_path / "hf", dtype=dtype)
    _create(store, tmp_path, "FROM ./hf\n")
    ref_gguf = g4.write_gemma4_gguf(tmp_path / "ref.gguf", folder.config,
                                    g4.gguf_tensors(folder.reference.state_dict()))
    E, F, D = folder.config.num_experts, folder.config.moe_intermediate_size, g4.N_EMBD
    with GGUFFile(_path(store, "imported")) as f, GGUFFile(ref_gguf) as ref:
        assert (f.arch_key("expert_count"), f.arch_key("expert_used_count"),
                f.arch_key("expert_feed_forward_length")) == (E, folder.config.top_k_experts, F)
        assert f.arch_key("expert_weights_norm") is None  # gemma4's router always renormalises: the default
        for i in range(folder.config.num_hidden_layers):
            b = f"blk.{i}."
            assert f.tensors[b + "ffn_gate_up_exps.weight"].shape == (E, 2 * F, D)
            assert f.tensors[b + "ffn_down_exps.weight"].shape == (E, D, F)
            assert f.tensors[b + "ffn_gate_up_exps.weight"].type_name == dtype
            assert f.tensors[b + "ffn_down_exps.weight"].type_name == dtype
            for name in ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale", "pre_ffw_norm_2.weight",
                         "post_ffw_norm_1.weight", "post_ffw_norm_2.weight"):
                assert f.tensors[b + name].type_name == "F32"
        if dtype == "F32":
            for name in ref.tensors:
                assert bytes(f.tensor_data(name)) == bytes(ref.tensor_data(name)), name


def test_quantize_stores_the_gemma4_experts_quantized(store, tmp_path):
    """--quantize q8_0 on an imported 26B-like model: the stacked experts (and the dense weights) are Q8_0, the
    router, its scale and the per-expert scales stay F32, and the model still predicts what transformers does."""
    folder = make_gemma4_folder("26b", tmp_path / "hf")
    files = {p.name: store.add_file(p)[0] for p in (tmp_path / "hf").iterdir()}
    create_model(store, CreateRequest.from_json({"model": "q", "files": files, "quantize": "q8_0"}))
    path = _path(store, "q")
    with GGUFFile(path) as f:
        assert f.file_type == "Q8_0" and f.arch_key("expert_count") == folder.config.num_experts
        for name in ("ffn_gate_up_exps.weight", "ffn_down_exps.weight", "ffn_up.weight"):
            assert f.tensors["blk.0." + name].type_name == "Q8_0"
        for name in ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale", "pre_ffw_norm_2.weight"):
            assert f.tensors["blk.0." + name].type_name == "F32"
    m = load_model(path, fmt="qdot" if qdot_status().available else "f32")
    assert m.config.moe.n_expert == folder.config.num_experts and m.config.moe.dense_branch
    ids = random_ids(folder.vocab_size, 40)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    out = m(torch.tensor(ids), m.new_cache())
    m.close()
    assert float((out.argmax(-1) == ref.argmax(-1)).double().mean()) >= 0.9


def _drop_per_expert_scale(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    shard = path / "model.safetensors"
    tensors = load_file(str(shard))
    del tensors["model.layers.2.router.per_expert_scale"]
    save_file(tensors, str(shard), metadata={"format": "pt"})


@pytest.mark.parametrize("edit,message", [
    ({"top_k_experts": 9}, "top_k_experts 9 with 8 experts"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size must be a positive integer"),
    ({"moe_intermediate_size": 16}, r"experts\.(gate_up|down)_proj has shape .*, but config\.json implies"),
    ({"enable_moe_block": False}, "experts.down_proj has no counterpart"),
    (_drop_per_expert_scale, "lack blk.2.ffn_down_exps.scale"),
], ids=["top_k", "no_width", "wrong_width", "moe_disabled", "missing_scale"])
def test_an_inconsistent_gemma4_moe_is_refused(store, tmp_path, edit, message):
    import json

    make_gemma4_folder("26b", tmp_path / "hf")
    if callable(edit):
        edit(tmp_path / "hf")
    else:
        cfg_path = tmp_path / "hf" / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **edit}))
    req = request_from_modelfile(parse("FROM ./hf\n"), "moe", tmp_path, LocalBlobSink(store))
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match=message):
        create_model(store, req)
    assert store.list_models() == [] and store.list_blobs() == uploaded


def test_kv_weights_a_layer_never_uses_are_left_out(store, tmp_path):
    """A checkpoint that still carries K/V projections for a KV-shared layer (transformers never loads them):
    imported without them, and the logits are transformers'."""
    from safetensors.torch import load_file, save_file

    folder = make_gemma4_folder("e2b", tmp_path / "hf")
    shard = folder.path / "model.safetensors"
    tensors = load_file(str(shard))
    last = len(g4.LAYER_TYPES) - 1
    tensors[f"model.layers.{last}.self_attn.k_proj.weight"] = torch.ones(2 * g4.HEAD_FULL, g4.N_EMBD)
    tensors[f"model.layers.{last}.self_attn.v_proj.weight"] = torch.ones(2 * g4.HEAD_FULL, g4.N_EMBD)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    _create(store, tmp_path, "FROM ./hf\n")
    path = _path(store, "imported")
    with GGUFFile(path) as f:
        assert f"blk.{last}.attn_k.weight" not in f.tensors and f"blk.{last}.attn_v.weight" not in f.tensors
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, 12)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    ours = model(torch.tensor(ids), model.new_cache())
    model.close()
    assert float((ours.double() - ref).abs().max() / ref.abs().max()) < TOL


def test_an_untied_assistant_is_refused_before_anything_is_converted(store, tmp_path):
    import json

    target = make_gemma4_folder("31b", tmp_path / "target")
    make_assistant_folder(target, tmp_path / "assistant")
    cfg_path = tmp_path / "assistant" / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "tie_word_embeddings": False}))
    req = request_from_modelfile(parse("FROM ./target\nDRAFT ./assistant\n"), "pair", tmp_path, LocalBlobSink(store))
    uploaded = store.list_blobs()
    with pytest.raises(CreateError, match=r"DRAFT: a Gemma 4 assistant with its own lm_head"):
        create_model(store, req)
    assert store.list_models() == [] and store.list_blobs() == uploaded


def test_a_scaled_proportional_rope_goes_into_rope_freqs(store, tmp_path):
    """``factor`` on the global layers' proportional RoPE divides their rotated frequencies: the rope_freqs
    divisors carry it, and the logits are transformers' past the sliding window."""
    folder = make_gemma4_folder("31b", tmp_path / "hf", rope_factor=4.0)
    _create(store, tmp_path, "FROM ./hf\n")
    path = _path(store, "imported")
    with GGUFFile(path) as f:
        freqs = f.tensor_data("rope_freqs.weight").view(np.float32).tolist()
    n_rot = int(g4.HEAD_FULL * g4.PARTIAL_ROTARY / 2)
    assert freqs == np.array([4.0] * n_rot + [1e30] * (g4.HEAD_FULL // 2 - n_rot), dtype=np.float32).tolist()
    model = load_model(path, fmt="f32")
    ids = random_ids(folder.vocab_size, 24)
    with torch.no_grad():
        ref = folder.reference(torch.tensor([ids])).logits[0]
    ours = model(torch.tensor(ids), model.new_cache())
    model.close()
    assert float((ours.double() - ref).abs().max() / ref.abs().max()) < TOL
