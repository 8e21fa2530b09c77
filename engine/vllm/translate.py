"""Between tandem's typed request and vLLM's completions API: the request body, the options vLLM cannot honour,
and the statistics of the final event.

Ollama's sampling options map one to one where vLLM has them (``repeat_penalty`` is ``repetition_penalty``, a
``top_k`` of 0 or less turns it off); ``typical_p``, ``repeat_last_n`` and ``num_keep`` have no vLLM counterpart
and are ignored, as Ollama's own newer engine ignores the ones it lacks. Speculation options are another matter:
they change what a user measures, so one vLLM cannot honour is refused (:func:`refusal`), never dropped.
"""

from __future__ import annotations

from typing import Any

from engine.contract.options import Options
from engine.contract.protocol import EngineError, GenerateRequest, TokenLogprob
from engine.contract.speculation_stats import SpeculationStats
from engine.contract.vllm_launch import DRAFTER_OF_METHOD, VllmLaunch, native_only_option

def refusal(options: Options, launch: VllmLaunch) -> str | None:
    """Why vLLM cannot serve these options as asked (None: it can): an option only the native engine has, or a
    speculation setting other than the one this vLLM was started with."""
    why = native_only_option(options)
    if why is not None or launch.attached:
        return why
        return None  # the endpoint's speculation is its own; tandem reports what it did
    if "drafter" in options.explicit and options.drafter not in ("auto", launch.drafter):
        return (f"option drafter={options.drafter} is not supported by this model's vllm engine, which was started "
                f"with drafter {launch.drafter}; vLLM fixes its drafter when it starts")
    if "draft_num_predict" in options.explicit and launch.drafter != "none" and \
            options.draft_num_predict != launch.num_speculative_tokens:
        return (f"option draft_num_predict={options.draft_num_predict} is not supported by this model's vllm engine, "
                f"which drafts {launch.num_speculative_tokens} tokens per step; set it in the Modelfile instead "
                "(vLLM fixes it when it starts)")
    return None


def completion_body(req: GenerateRequest, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The ``/v1/completions`` body for a request whose prompt tokens are ``prompt``."""
    o = req.options
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": o.temperature,
        "top_p": o.top_p,
        "top_k": o.top_k if o.top_k > 0 else -1,
        "min_p": o.min_p,
        "repetition_penalty": o.repeat_penalty if o.repeat_penalty > 0 else 1.0,
        "presence_penalty": o.presence_penalty,
        "frequency_penalty": o.frequency_penalty,
        "stop": list(o.stop),
        "return_token_ids": True,
        "skip_special_tokens": True,
        "stream_options": {"include_usage": True},
    }
    if o.seed >= 0:
        body["seed"] = o.seed
    if req.logprobs:
        body["logprobs"] = max(0, int(req.top_logprobs or 0))
    structured = structured_output(req)
    if structured is not None:
        body["structured_outputs"] = structured
    return body


def structured_output(req: GenerateRequest) -> dict[str, Any] | None:
    """vLLM's ``structured_outputs`` for Ollama's ``format`` (None: free text)."""
    fmt = req.format
    if fmt is None or fmt == "":
        return None
    if req.think_first:
        raise EngineError("format together with think is not supported by the vllm engine (its grammar would "
                          "constrain the reasoning too); drop one of them, or serve the model with engine native", 400)
    if fmt == "json":
        return {"json_object": True}
    if isinstance(fmt, dict):
        return {"json": fmt}
    raise EngineError(f"invalid format: {fmt!r}", 400)


def logprobs_of(choice: dict[str, Any]) -> list[TokenLogprob] | None:
    """Ollama's per-token logprobs from a completions choice's ``logprobs`` (None when it has none)."""
    lp = choice.get("logprobs")
    if not lp:
        return None
    out = []
    tops = lp.get("top_logprobs") or []
    for i, (token, value) in enumerate(zip(lp.get("tokens") or [], lp.get("token_logprobs") or [])):
        top = tops[i] if i < len(tops) and tops[i] else {}
        out.append(TokenLogprob(token, float(value if value is not None else 0.0), list(token.encode()),
                                [(t, float(v), list(t.encode())) for t, v in top.items()]))
    return out


def speculation_stats(metrics: dict[str, Any] | None, method: str | None, generated: int) -> SpeculationStats:
    """tandem's statistics from vLLM's per-request ``metrics.speculative_decoding`` (``detailed`` level: one entry
    per verification step). ``method``: vLLM's speculative method (None: none). ``generated``: the tokens the
    request produced. A step that verified drafts is a draft round; every other token came from a plain step."""
    drafter = DRAFTER_OF_METHOD.get(method, method) if method else "none"
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not spec:
        return SpeculationStats(drafter=drafter, target_forwards=generated, plain_steps=generated)
    accepted = [int(a) for a in spec.get("per_step_accepted") or []]
    drafted = [int(d) for d in spec.get("per_step_drafted") or []]
    depth = max(drafted, default=int(spec.get("num_spec_tokens") or 0))
    rounds = int(spec.get("num_spec_steps") or len(accepted))
    n_accepted = int(spec.get("num_accepted_draft_tokens") or sum(accepted))
    # each round commits its accepted drafts plus the target's own token; the rest came one per plain step
    plain = max(0, generated - rounds - n_accepted)
    return SpeculationStats(
        drafter=drafter,
        draft_n=int(spec.get("num_draft_tokens") or sum(drafted)),
        draft_n_accepted=n_accepted,
        draft_rounds=rounds,
        target_forwards=rounds + plain,
        plain_steps=plain,
        accepted_per_position=[sum(1 for a in accepted if a > j) for j in range(depth)],
        drafted_per_position=[sum(1 for d in drafted if d > j) for j in range(depth)],
        depth_sum=int(spec.get("num_draft_tokens") or sum(drafted)),
    )

