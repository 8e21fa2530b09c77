"""The vllm engine's pure parts: the launch a model's parameters plan, vLLM's arguments, the request body, the
options it refuses and the statistics it reports (no vLLM needed; tests/vllm runs the real one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.contract.options import Options
from engine.contract.protocol import EngineError, GenerateRequest
from engine.contract.vllm_launch import (VllmLaunch, draft_method, plan_launch, server_args, speculative_config,
                                speculative_method)
from engine.vllm.server import layout_folder
from engine.vllm.translate import completion_body, logprobs_of, refusal, speculation_stats

FOLDER = (("config.json", "/blobs/a"), ("model.safetensors", "/blobs/b"))


def test_a_draft_folder_plans_vllms_draft_model_with_the_models_depth(tmp_path: Path):
    config = tmp_path / "draft-config"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    draft_files = (("config.json", str(config)), ("model.safetensors", "/blobs/b"))
    launch = plan_launch({"draft_num_predict": 3}, files=FOLDER, draft_files=draft_files, has_mtp_head=False)
    assert (launch.drafter, launch.num_speculative_tokens) == ("model", 3)
    draft = tmp_path / "draft"  # the folder vLLM is given (laid out by engine.vllm.server)
    assert speculative_method(launch) == "draft_model"
    assert speculative_config(launch, draft) == {"method": "draft_model", "model": str(draft),
                                                 "num_speculative_tokens": 3}
    # without a draft_num_predict the model drafts Ollama's default 4
    assert plan_launch({}, files=FOLDER, draft_files=draft_files, has_mtp_head=False).num_speculative_tokens == 4


@pytest.mark.parametrize("config, method", [
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant"}, "mtp"),
    ({"architectures": ["DeepseekV3MTP"]}, "mtp"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, "draft_model"),
])
def test_the_draft_folders_config_names_vllms_method(config, method):
    assert draft_method(config) == method


def test_ngram_mtp_and_no_speculation_plan_without_a_draft_folder():
    ngram = plan_launch({"drafter": "ngram", "draft_num_predict": 5}, files=FOLDER, draft_files=(), has_mtp_head=False)
    assert speculative_config(ngram, None) == {"method": "ngram", "num_speculative_tokens": 5,
                                               "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    # Ollama's rule: an explicit depth on a model with MTP layers drafts with them
    mtp = plan_launch({"draft_num_predict": 2}, files=FOLDER, draft_files=(), has_mtp_head=True)
    assert speculative_config(mtp, None) == {"method": "mtp", "num_speculative_tokens": 2}
    assert speculative_config(plan_launch({}, files=FOLDER, draft_files=(), has_mtp_head=True), None) is None
    off = plan_launch({"drafter": "none"}, files=FOLDER, draft_files=FOLDER, has_mtp_head=False)
    assert speculative_config(off, Path("/nowhere")) is None


def test_server_args_map_the_load_options(tmp_path: Path):
    launch = VllmLaunch(files=FOLDER, drafter="ngram", num_speculative_tokens=3, tensor_parallel_size=2,
                        extra_args=("--dtype", "float32"))
    args = server_args(launch, model_dir=tmp_path, speculative=speculative_config(launch, None), port=8123,
                       num_ctx=2048, num_parallel=6, eager=True)
    flags = dict(zip(args, args[1:]))
    assert flags["--port"] == "8123" and flags["--model"] == str(tmp_path)
    assert flags["--max-model-len"] == "2048" and flags["--max-num-seqs"] == "6"
    assert flags["--tensor-parallel-size"] == "2" and flags["--pipeline-parallel-size"] == "1"
    assert json.loads(flags["--speculative-config"])["method"] == "ngram"
    assert flags["--per-request-spec-decode-metrics"] == "detailed"
    assert "--enforce-eager" in args and args[-2:] == ["--dtype", "float32"]  # the user's flags come last
    plain = server_args(VllmLaunch(files=FOLDER), model_dir=tmp_path, speculative=None, port=1, num_ctx=8,
                        num_parallel=1, eager=False)
    # vLLM refuses per-request speculation metrics without speculation
    assert "--enforce-eager" not in plain and "--per-request-spec-decode-metrics" not in plain


def test_the_folder_layout_links_each_file_and_refuses_names_that_leave_it(tmp_path: Path):
    blob = tmp_path / "blob"
    blob.write_text("{}")
    folder = layout_folder((("config.json", str(blob)), ("sub/tokenizer.json", str(blob))), tmp_path / "model")
    assert (folder / "config.json").resolve() == blob and (folder / "sub" / "tokenizer.json").read_text() == "{}"
    for bad in ("../x.json", "/etc/passwd"):
        with pytest.raises(EngineError) as e:
            layout_folder(((bad, str(blob)),), tmp_path / "other")
        assert e.value.status == 400


def _request(options: dict, **kw) -> GenerateRequest:
    return GenerateRequest(prompt="hi", options=Options.merged(None, options), **kw)


def test_the_request_body_maps_ollamas_sampling_options():
    req = _request({"temperature": 0, "top_k": 0, "top_p": 0.5, "seed": 7, "repeat_penalty": 1.1,
                    "stop": ["\n\n"], "min_p": 0.05}, logprobs=True, top_logprobs=2, format={"type": "object"})
    body = completion_body(req, [1, 2, 3], 17)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 17
    assert (body["temperature"], body["top_k"], body["top_p"], body["seed"]) == (0, -1, 0.5, 7)
    assert body["repetition_penalty"] == pytest.approx(1.1) and body["min_p"] == pytest.approx(0.05)
    assert body["stop"] == ["\n\n"] and body["logprobs"] == 2
    assert body["structured_outputs"] == {"json": {"type": "object"}}
    assert body["return_token_ids"] and body["stream_options"] == {"include_usage": True}
    assert "seed" not in completion_body(_request({}), [1], 1)  # Ollama's -1: a random seed
    assert completion_body(_request({}, format="json"), [1], 1)["structured_outputs"] == {"json_object": True}
    with pytest.raises(EngineError) as e:
        completion_body(_request({}, format="json", think_first=True), [1], 1)
    assert e.value.status == 400 and "vllm" in str(e.value)


def test_options_only_the_native_engine_has_are_refused_naming_the_backend():
    launch = VllmLaunch(drafter="model", num_speculative_tokens=4)
    assert refusal(Options.merged(None, {"temperature": 0.2}), launch) is None
    assert refusal(Options.merged(None, {"relaxed_top_n": 0}), launch) is None  # the default asks nothing
    for options in ({"relaxed_top_n": 3}, {"draft_schedule": "fixed"}, {"draft_p_min": 0.5}, {"draft_trace": True},
                    {"draft_num_predict": 6}, {"drafter": "ngram"}, {"drafter": "none"}):
        why = refusal(Options.merged(None, options), launch)
        assert why is not None and "vllm engine" in why and next(iter(options)) in why, options
    # the depth it was started with is fine, and so is asking for it by its Modelfile value
    assert refusal(Options.merged({"draft_num_predict": 4}, {"draft_num_predict": 4}), launch) is None
    assert refusal(Options.merged(None, {"drafter": "model"}), launch) is None


def test_vllms_per_step_metrics_become_tandems_statistics():
    metrics = {"speculative_decoding": {"num_spec_tokens": 3, "num_spec_steps": 4, "num_draft_tokens": 11,
                                        "num_accepted_draft_tokens": 5, "per_step_accepted": [3, 0, 1, 1],
                                        "per_step_drafted": [3, 3, 3, 2]}}
    stats = speculation_stats(metrics, "draft_model", generated=12)
    assert (stats.drafter, stats.draft_n, stats.draft_n_accepted, stats.draft_rounds) == ("model", 11, 5, 4)
    assert stats.accepted_per_position == [3, 1, 1] and stats.drafted_per_position == [4, 4, 3]
    # 4 rounds commit 5 drafts + 4 of the target's own tokens: the other 3 of 12 came from plain steps
    assert (stats.plain_steps, stats.target_forwards) == (3, 7)
    none = speculation_stats(None, None, generated=5)
    assert (none.drafter, none.draft_n, none.target_forwards) == ("none", 0, 5)


def test_logprobs_come_back_in_ollamas_shape():
    choice = {"logprobs": {"tokens": [" a", "b"], "token_logprobs": [-0.5, -1.0],
                           "top_logprobs": [{" a": -0.5, " c": -2.0}, {"b": -1.0}]}}
    out = logprobs_of(choice)
    assert [(t.token, t.logprob) for t in out] == [(" a", -0.5), ("b", -1.0)]
    assert out[0].top_logprobs[1] == (" c", -2.0, list(b" c")) and out[0].bytes == list(b" a")
    assert logprobs_of({"logprobs": None}) is None
