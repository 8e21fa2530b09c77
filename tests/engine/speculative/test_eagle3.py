"""EAGLE-3 heads from Hugging Face folders (importer/architectures/eagle3.py, engine/models/eagle3.py).

A random head in the layout SpecForge and EAGLE's trainer write, built for a tiny llama target that transformers
builds: created as DRAFT beside it, the head scores what a float64 reference of EAGLE-3 (written here from the
saved weights and transformers' hidden states) scores, drafts losslessly through the speculation loop (strict
greedy output identical to plain decoding, drafts actually made), and a head that does not fit its target is
refused at create with the reason, leaving the store as it was.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from blobs import MEDIA_TYPE_DRAFT, MEDIA_TYPE_MODEL, BlobStore  # noqa: E402
from engine.contract.gguf import GGUFFile  # noqa: E402
from engine.contract.protocol import LoadSpec  # noqa: E402
from engine.models.eagle3 import Eagle3Head  # noqa: E402
from engine.runtime import ModelRuntime  # noqa: E402
from importer import CreateError, LocalBlobSink, create_model, request_from_modelfile  # noqa: E402
from modelfile import parse  # noqa: E402
from tests.engine.speculative.test_speculation import GREEDY, generate, spec_opts  # noqa: E402
from tests.hf_folders import Eagle3Folder, eagle3_folder, make_folder, random_ids  # noqa: E402

N_LAYER = 6  # the default layers EAGLE-3 reads are 2, 3 and 3 of six


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_folder("llama", tmp_path_factory.mktemp("eagle3") / "target", n_layer=N_LAYER, tied=False)


def _create(tmp_path: Path, target, head: Eagle3Folder) -> tuple[BlobStore, Path, Path]:
    store = BlobStore(tmp_path / "models")
    (tmp_path / "target").symlink_to(target.path, target_is_directory=True)
    text = f"FROM ./target\nDRAFT ./{head.path.name}\n"
    create_model(store, request_from_modelfile(parse(text), "pair", tmp_path, LocalBlobSink(store)))
    manifest = store.read_manifest("pair")
    return (store, store.blob_path(manifest.layer(MEDIA_TYPE_MODEL).digest),
            store.blob_path(manifest.layer(MEDIA_TYPE_DRAFT).digest))


def _engine(model: Path, draft: Path) -> ModelRuntime:
    return ModelRuntime.load(LoadSpec(model_path=str(model), draft_path=str(draft), num_ctx=128,
                                      weight_format="f32", draft_weight_format="f32", device="cpu"))


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """transformers' RoPE (rotate halves) over positions 0..n-1 of x [n, heads, hd]."""
    n, hd = x.shape[0], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_logits(head: Eagle3Folder, captured: torch.Tensor, next_tokens: list[int],
                     embed: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's first draft step in float64, for pairs (captured[j], next_tokens[j]) at positions 0..n-1: the target
    vocabulary's logits [n, V] (-inf where the draft vocabulary has no token)."""
    cfg, t = head.config, {k: v.double() for k, v in head.tensors.items()}
    p, eps = "midlayer.", cfg["rms_norm_eps"]
    H, Hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    n = len(next_tokens)
    h = captured.double() @ t["fc.weight"].T
    x = torch.cat([_rms(embed.double()[next_tokens], t[p + "input_layernorm.weight"], eps),
                   _rms(h, t[p + "hidden_norm.weight"], eps)], -1)
    q = _rotate((x @ t[p + "self_attn.q_proj.weight"].T).view(n, H, hd), cfg["rope_theta"])
    k = _rotate((x @ t[p + "self_attn.k_proj.weight"].T).view(n, Hkv, hd), cfg["rope_theta"])
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(n, Hkv, hd)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, H * hd) @ t[p + "self_attn.o_proj.weight"].T
    r = (_rms(h, t[p + "hidden_norm.weight"], eps) if cfg["norm_before_residual"] else h) + o
    f = _rms(r, t[p + "post_attention_layernorm.weight"], eps)
    r = r + (torch.nn.functional.silu(f @ t[p + "mlp.gate_proj.weight"].T) * (f @ t[p + "mlp.up_proj.weight"].T)) \
        @ t[p + "mlp.down_proj.weight"].T
    draft = _rms(r, t["norm.weight"], eps) @ t["lm_head.weight"].T
    V = cfg["vocab_size"]
    ids = torch.arange(draft.shape[1]) + t["d2t"].long() if "d2t" in t else torch.arange(V)
    out = torch.full((n, V), float("-inf"), dtype=torch.float64)
    out[:, ids] = draft
    return out


@pytest.mark.parametrize("variant", ["full-vocab", "pruned-vocab+layers+norm-before-residual"])
def test_the_head_scores_what_eagle3_computes_and_drafts_losslessly(target, tmp_path, variant):
    pruned = variant != "full-vocab"
    layers = [1, 3, 4] if pruned else None
    head = eagle3_folder(target, tmp_path / "head", draft_vocab=target.vocab_size // 3 if pruned else None,
                         layers=layers, norm_before_residual=pruned)
    _, model_path, draft_path = _create(tmp_path, target, head)
    with GGUFFile(draft_path) as f, GGUFFile(model_path) as m:
        assert f.architecture == "eagle3" and ("d2t" in f.tensors) == pruned
        assert list(f.metadata["tokenizer.ggml.tokens"]) == list(m.metadata["tokenizer.ggml.tokens"])
    engine = _engine(model_path, draft_path)
    try:
        assert engine.draft_kind == "mtp" and engine.facts.draft_architecture == "eagle3"
        mtp = engine.drafters["mtp"]
        assert isinstance(mtp.head, Eagle3Head)
        read = tuple(layers) if layers else (2, N_LAYER // 2, N_LAYER - 3)
        assert engine.target.capture_layers == read

        # The head over the engine's captured states scores what EAGLE-3 scores over transformers' hidden states.
        tokens = random_ids(target.vocab_size, 10, seed=4)
        with torch.no_grad():
            states = target.reference(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        captured_ref = torch.cat([states[i][0] for i in read], -1)
        out = engine.target.forward(tokens, engine.target.new_cache(32), logits_for="none", return_hidden=True)
        assert torch.allclose(out.captured.double(), captured_ref, atol=1e-4, rtol=1e-4)
        h = mtp.head
        g = h.forward(h.from_target(out.captured[:-1]), tokens[1:], h.new_cache(32))
        got = torch.cat([h.logits(row) for row in g]).double()
        want = reference_logits(head, captured_ref[:-1], tokens[1:], target.reference.model.embed_tokens.weight.detach())
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        assert int(finite[0].sum()) == (target.vocab_size // 3 if pruned else target.vocab_size)
        scale = want[finite].abs().max()
        assert (got[finite] - want[finite]).abs().max() / scale < 1e-4

        # Through the loop: strict greedy output identical to plain decoding, with drafts made and judged.
        base = generate(engine, **GREEDY, drafter="none")
        run = generate(engine, **GREEDY, **spec_opts("mtp", 3))
        assert run.tokens == base.tokens
        assert run.spec.drafter == "mtp" and run.spec.draft_n > 0 and run.spec.draft_rounds > 0
        # and at temperature > 0 the drafts come from q over the draft vocabulary only (lossless by the strict rule)
        hot = generate(engine, temperature=0.8, seed=3, num_predict=16, **spec_opts("mtp", 3))
        assert len(hot.tokens) == 16 and hot.spec.draft_n > 0
    finally:
        engine.close()


def test_a_head_that_does_not_fit_its_target_is_refused_at_create(target, tmp_path):
    cases = {
        "wide": (dict(target_width=96), "built for a target of hidden size 96"),
        "deep": (dict(layers=[1, 3, 9]), "reads target layer 9, but the target has 6 layers"),
    }
    for name, (kwargs, message) in cases.items():
        head = eagle3_folder(target, tmp_path / name, **kwargs)
        store = BlobStore(tmp_path / f"models-{name}")
        req = request_from_modelfile(parse(f"FROM {target.path}\nDRAFT ./{name}\n"), "pair", tmp_path,
                                     LocalBlobSink(store))
        with pytest.raises(CreateError, match=message):
            create_model(store, req)
        assert store.list_models() == []
        assert head.path.exists()
    # An EAGLE-3 head is no model of its own.
    head = eagle3_folder(target, tmp_path / "alone")
    store = BlobStore(tmp_path / "models-alone")
    with pytest.raises(CreateError, match="an EAGLE-3 head only drafts for a target model"):
        create_model(store, request_from_modelfile(parse("FROM ./alone\n"), "x", tmp_path, LocalBlobSink(store)))
