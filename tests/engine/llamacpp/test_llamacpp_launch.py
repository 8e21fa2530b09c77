"""How the llamacpp engine starts llama-server and speaks to it, without starting one: which drafter the model's
parameters give and the --spec-type that runs it (by the DRAFT's architecture, the target's NextN layers), the
projector as --mmproj, the options only the native engine has refused, and images placed at their tags."""

from __future__ import annotations

import base64
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.contract.llamacpp_launch import LlamaCppLaunch, plan, refusal
from engine.contract.options import Options
from engine.contract.protocol import LoadSpec
from engine.llamacpp.runtime import cache_bytes
from engine.llamacpp.server import server_args
from engine.llamacpp.translate import multimodal_prompt

ENV = {"TANDEM_LLAMA_SERVER": "/bin/true"}


def write_gguf(path: Path, arch: str, tensors: tuple[str, ...] = ("token_embd.weight",)) -> str:
    w = gguf.GGUFWriter(str(path), arch)
    for name in tensors:
        w.add_tensor(name, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def args_of(launch: LlamaCppLaunch, spec: LoadSpec) -> list[str]:
    return server_args(launch, spec, port=1234, slots=2)


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def launch_for(params: dict, *, has_draft: bool) -> LlamaCppLaunch:
    model = Options.merged(params, None)
    return plan(model, model, has_draft=has_draft, env=ENV)


def test_the_models_drafter_becomes_llama_servers_speculative_type(tmp_path: Path) -> None:
    target = write_gguf(tmp_path / "t.gguf", "phi2")
    with_nextn = write_gguf(tmp_path / "n.gguf", "glm4moe", ("token_embd.weight", "blk.1.nextn.eh_proj.weight"))
    drafts = {arch: write_gguf(tmp_path / f"{arch}.gguf", arch) for arch in ("phi2", "eagle3", "dflash")}

    pair = launch_for({"draft_num_predict": 5}, has_draft=True)
    assert (pair.drafter, pair.draft_n_max) == ("model", 5)
    for arch, kind in (("phi2", "draft-simple"), ("eagle3", "draft-eagle3"), ("dflash", "draft-dflash")):
        args = args_of(pair, LoadSpec(model_path=target, draft_path=drafts[arch], num_ctx=512))
        assert flag(args, "--spec-type") == kind and flag(args, "--model-draft") == drafts[arch]
        assert flag(args, "--spec-draft-n-max") == "5" and flag(args, "-c") == "1024"

    ngram = launch_for({"drafter": "ngram"}, has_draft=False)
    args = args_of(ngram, LoadSpec(model_path=target))
    assert flag(args, "--spec-type") == "ngram-simple" and flag(args, "--spec-ngram-simple-size-m") == "4"
    assert "--model-draft" not in args

    # no DRAFT: the target's own NextN layers draft (draft-mtp) where it has them, nothing where it has none
    own = launch_for({}, has_draft=False)
    assert own.drafter == "mtp"
    assert flag(args_of(own, LoadSpec(model_path=with_nextn)), "--spec-type") == "draft-mtp"
    assert "--spec-type" not in args_of(own, LoadSpec(model_path=target))
    # speculation off in the model's parameters: none at all
    for params in ({"drafter": "none"}, {"draft_num_predict": 0}):
        off = launch_for(params, has_draft=True)
        assert off.drafter == "none" and "--spec-type" not in args_of(off, LoadSpec(model_path=target, draft_path=drafts["phi2"]))


def test_the_operators_own_llama_server_flags_come_last(tmp_path: Path) -> None:
    target = write_gguf(tmp_path / "t.gguf", "phi2")
    launch = plan(Options(), Options(), has_draft=False, env={**ENV, "TANDEM_LLAMACPP_ARGS": "--poll 0 --cache-type-k 'q8_0'"})
    assert args_of(launch, LoadSpec(model_path=target))[-4:] == ["--poll", "0", "--cache-type-k", "q8_0"]


def test_a_projector_starts_llama_server_with_mmproj(tmp_path: Path) -> None:
    target = write_gguf(tmp_path / "t.gguf", "qwen2vl")
    args = args_of(LlamaCppLaunch(), LoadSpec(model_path=target, projector_path="/store/p"))
    assert flag(args, "--mmproj") == "/store/p"
    assert "--mmproj" not in args_of(LlamaCppLaunch(), LoadSpec(model_path=target))


@pytest.mark.parametrize("option,value", [("relaxed_top_n", 3), ("draft_acceptance", "match"), ("draft_trace", True),
                                          ("relaxed_scope", "thinking"), ("draft_schedule", "adaptive"),
                                          ("drafter", "suffix")])
def test_an_option_only_the_native_engine_has_is_refused(option: str, value) -> None:
    why = refusal(Options.merged({}, {option: value}))
    assert why is not None and option in why and "llamacpp engine" in why
    assert refusal(Options.merged({}, {"draft_schedule": "fixed", "temperature": 0.5})) is None
    assert refusal(Options()) is None  # the defaults are not an ask


def test_images_go_in_at_their_tags_as_the_servers_marker() -> None:
    a, b = b"first", b"second"
    out = multimodal_prompt("x [img-1] y [img-0] z [img-7]", [a, b], "<M>")
    # the order of the markers decides the order of the data; an unknown tag stays text
    assert out["prompt_string"] == "x <M> y <M> z [img-7]"
    assert out["multimodal_data"] == [base64.b64encode(b).decode(), base64.b64encode(a).decode()]
    untagged = multimodal_prompt("say", [a], "<M>")
    assert untagged == {"prompt_string": "<M>say", "multimodal_data": [base64.b64encode(a).decode()]}


def test_a_slots_cache_is_budgeted_from_the_gguf(tmp_path: Path) -> None:
    """What one llama-server slot's f16 KV cache costs, as llama.cpp reports it for Qwen2.5-1.5B's shape (28 layers,
    2 KV heads of 128): 112 MiB at 4096 positions; per-layer KV head counts (an array) are summed."""
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "qwen2")
    w.add_block_count(28)
    w.add_embedding_length(1536)
    w.add_head_count(12)
    w.add_head_count_kv(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert cache_bytes(str(tmp_path / "q.gguf"), 4096) == 112 * 2**20
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3n")
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_array("gemma3n.attention.head_count_kv", [2, 2, 0])
    w.add_key_length(32)
    w.add_value_length(16)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert cache_bytes(str(tmp_path / "g.gguf"), 100) == 4 * (32 + 16) * 100 * 2
