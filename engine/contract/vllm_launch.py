"""What a model served by vLLM is started with: the typed launch record and its mapping onto vLLM's arguments.

Torch-free and vLLM-free: the server builds a :class:`VllmLaunch` (``server.lifecycle.load_spec``) and the engine
process turns it into a command line (:func:`server_args`). The speculative method comes from the same rule that
plans a native request (``engine.contract.speculation_plan``), applied to the model's own parameters once, at load:
vLLM fixes its speculative configuration when it starts, so a request cannot change it
(``engine.vllm.translate.refusal`` answers those with a 400 that names the backend).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from engine.contract.options import SPECULATION_DEFAULTS, Options
from engine.contract.speculation_plan import plan_speculation

#: The name tandem gives the model it starts (``--served-model-name``); an attached endpoint names its own.
SERVED_NAME = "tandem"

#: vLLM's speculative methods, as tandem's statistics name their drafter.
DRAFTER_OF_METHOD = {"draft_model": "model", "mtp": "mtp", "eagle3": "eagle3", "eagle": "eagle", "ngram": "ngram"}


@dataclass(frozen=True)
class VllmLaunch:
    """How to reach or start a model's vLLM engine.

    ``files``/``draft_files``: the Hugging Face folders as (name within the folder, path of its blob) pairs, which
    the engine process lays out as folders of links. ``url`` set: attach to that running vLLM (``TANDEM_VLLM_URL``)
    and start nothing; else start ``python -m vllm.entrypoints.openai.api_server`` with ``python``."""

    files: tuple[tuple[str, str], ...] = ()
    draft_files: tuple[tuple[str, str], ...] = ()
    drafter: str = "none"  # the planned drafter: model | mtp | ngram | none (engine.contract.speculation_plan)
    num_speculative_tokens: int = 0
    python: str = ""  # TANDEM_VLLM_PYTHON
    url: str = ""  # TANDEM_VLLM_URL
    served_model: str = ""  # TANDEM_VLLM_MODEL: the model's name at ``url`` ("" = the first it lists)
    extra_args: tuple[str, ...] = ()  # TANDEM_VLLM_ARGS, appended last (they win)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def attached(self) -> bool:
        return bool(self.url)


def plan_launch(model_params: Mapping[str, Any], *, files: tuple[tuple[str, str], ...],
                draft_files: tuple[tuple[str, str], ...], has_mtp_head: bool, **settings: Any) -> VllmLaunch:
    """The launch for a model from its own parameters (a request's options never start vLLM differently):
    the drafter and depth the native engine would plan for a request that sets nothing."""
    options = Options.merged(model_params, None)
    # vLLM's own suffix method needs Arctic Inference, which its CPU build lacks: no suffix drafting there
    plan = plan_speculation(options, has_draft_layer=bool(draft_files), has_mtp_head=has_mtp_head,
                            suffix_drafting=False)
    return VllmLaunch(files=files, draft_files=draft_files, drafter=plan.drafter,
                      num_speculative_tokens=plan.cap if plan.drafter != "none" else 0,
                      tensor_parallel_size=options.tensor_parallel_size,
                      pipeline_parallel_size=options.pipeline_parallel_size, **settings)


def draft_method(draft_config: Mapping[str, Any]) -> str:
    """vLLM's method for a DRAFT folder, from its config.json: an EAGLE-3 head, an MTP head or assistant (Gemma 4's
    assistant, a NextN head saved alone), or else an independent draft model."""
    names = " ".join(str(a) for a in draft_config.get("architectures") or []).lower()
    kind = str(draft_config.get("model_type", "")).lower()
    if "eagle3" in names or "eagle3" in kind:
        return "eagle3"
    if "eagle" in names or "eagle" in kind:
        return "eagle"
    if "mtp" in names or "mtp" in kind or "assistant" in names or "assistant" in kind or "nextn" in names:
        return "mtp"
    return "draft_model"


def speculative_method(launch: VllmLaunch) -> str | None:
    """vLLM's speculative method for the launch (None: no speculation): the planned drafter, and for a DRAFT folder
    the method its config.json names."""
    if launch.drafter == "none" or launch.num_speculative_tokens <= 0:
        return None
    if launch.drafter == "ngram":
        return "ngram"
    config = dict(launch.draft_files).get("config.json")
    if config is None:
        return "mtp" if launch.drafter == "mtp" else None  # mtp: the target's own MTP layers
    return draft_method(json.loads(Path(config).read_text()))


def speculative_config(launch: VllmLaunch, draft_dir: Path | None) -> dict[str, Any] | None:
    """vLLM's ``--speculative-config`` for the launch (None: no speculation). ``draft_dir``: the DRAFT folder as
    laid out on disk."""
    method = speculative_method(launch)
    if method is None:
        return None
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": launch.num_speculative_tokens}
    if method == "ngram":
        # tandem's n-gram drafter matches the longest suffix of up to 4 tokens, down to 1 (engine.speculative.ngram)
        spec |= {"prompt_lookup_max": 4, "prompt_lookup_min": 1}
    elif launch.draft_files:
        spec["model"] = str(draft_dir)
    return spec


def server_args(launch: VllmLaunch, *, model_dir: Path, speculative: dict[str, Any] | None, port: int, num_ctx: int,
                num_parallel: int, eager: bool) -> list[str]:
    """The arguments after ``python`` that start vLLM's OpenAI server on ``127.0.0.1:port`` for the launch, with
    ``speculative`` as its ``--speculative-config`` (``speculative_config``). ``eager``: skip torch.compile (vLLM's
    CPU build compiles on one thread for minutes at every start)."""
    args = ["-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", str(model_dir), "--served-model-name", SERVED_NAME,
            "--max-model-len", str(num_ctx), "--max-num-seqs", str(max(1, num_parallel)),
            "--tensor-parallel-size", str(launch.tensor_parallel_size),
            "--pipeline-parallel-size", str(launch.pipeline_parallel_size),
            "--enable-prompt-tokens-details",  # the final chunk's cached prompt tokens
            "--disable-uvicorn-access-log"]
    if eager:
        args.append("--enforce-eager")
    if speculative is not None:  # and the final chunk's per-step speculation counts (vLLM refuses them without)
        args += ["--speculative-config", json.dumps(speculative), "--per-request-spec-decode-metrics", "detailed"]
    return args + list(launch.extra_args)


#: Speculation options that only tandem's own decode loop has: vLLM verifies a fixed number of drafts per step
#: with its rejection sampler (strict acceptance) and drafts nothing else.
NATIVE_ONLY = ("draft_n_min", "draft_p_min", "relaxed_top_n", "relaxed_scope", "draft_schedule", "draft_trace",
               "draft_acceptance", "draft_copy", "draft_vocab")


def native_only_option(options: Options) -> str | None:
    """Why one of these options needs the native engine (None: vLLM does what they ask). An option counts when it
    was set (by the model's parameters or the request) to something other than what vLLM does."""
    for name in NATIVE_ONLY:
        value = getattr(options, name)
        if name in options.explicit and value != SPECULATION_DEFAULTS[name]:
            return (f"option {name}={_shown(value)} is not supported by the vllm engine (vLLM drafts a fixed "
                    "number of tokens and verifies them strictly); remove it, or serve the model with engine native")
    return None


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
