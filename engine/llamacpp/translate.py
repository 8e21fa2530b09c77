"""A tandem request as llama-server's ``/completion`` body, and its statistics back as tandem's."""

from __future__ import annotations

import base64
import re
from typing import Any

from engine.contract.protocol import EngineError, GenerateRequest, TokenLogprob
from engine.contract.speculation_stats import SpeculationStats


IMAGE_TAG = re.compile(r"\[img-(\d+)\]")  # where Ollama's prompt rendering puts image N (server.text.render)


def multimodal_prompt(text: str, images: list[bytes], marker: str) -> dict[str, Any]:
    """llama-server's multimodal prompt: ``text`` with each ``[img-N]`` tag of an image this request carries
    replaced by the server's media marker, and the images in the order their markers appear. An image the text has
    no tag for (a raw prompt) goes first, as Ollama prefixes the tags of a message's images. The marker is random
    per llama-server, so text a user wrote can never stand for an image."""
    order: list[int] = []

    def place(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if i >= len(images) or i in order:
            return m.group(0)
        order.append(i)
        return marker

    body = IMAGE_TAG.sub(place, text)
    untagged = [i for i in range(len(images)) if i not in order]
    body = marker * len(untagged) + body
    return {"prompt_string": body,
            "multimodal_data": [base64.b64encode(images[i]).decode() for i in untagged + order]}


def completion_body(req: GenerateRequest, prompt: list[int] | dict[str, Any], n_predict: int, *,
                    draft_n_max: int) -> dict[str, Any]:
    """Every sampling option, ``stop``, ``seed``, logprobs and ``format`` mapped onto llama-server's names. The
    sampler order is llama.cpp's default, which is Ollama's (top-k, typical, top-p, min-p, temperature)."""
    o = req.options
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": o.temperature,
        "top_k": o.top_k,
        "top_p": o.top_p,
        "min_p": o.min_p,
        "typical_p": o.typical_p,
        "repeat_penalty": o.repeat_penalty,
        "repeat_last_n": o.repeat_last_n,
        "presence_penalty": o.presence_penalty,
        "frequency_penalty": o.frequency_penalty,
        "stop": list(o.stop),
        "cache_prompt": True,
        "return_tokens": True,
    }
    if "seed" in o.explicit and o.seed >= 0:
        body["seed"] = o.seed
    if req.logprobs:
        body["n_probs"] = max(1, req.top_logprobs)
        body["post_sampling_probs"] = False
    if draft_n_max > 0:  # the launch has a drafter: the request's own depth, within what llama-server allows
        depth = o.draft_num_predict if o.drafter != "none" else 0
        body["speculative.n_max"] = max(0, min(depth, draft_n_max))
        body["speculative.n_min"] = o.draft_n_min
        body["speculative.p_min"] = o.draft_p_min
    schema = json_schema(req)
    if schema is not None:
        body["json_schema"] = schema
    return body


def json_schema(req: GenerateRequest) -> dict[str, Any] | None:
    """llama-server's ``json_schema`` for Ollama's ``format`` (None: free text; ``{}``: any JSON)."""
    fmt = req.format
    if fmt is None or fmt == "":
        return None
    if req.think_first:
        raise EngineError("format together with think is not supported by the llamacpp engine (its grammar would "
                          "constrain the reasoning too); drop one of them, or serve the model with engine native", 400)
    if fmt == "json":
        return {}
    if isinstance(fmt, dict):
        return fmt
    raise EngineError(f"invalid format: {fmt!r}", 400)


def logprobs_of(event: dict[str, Any]) -> list[TokenLogprob] | None:
    """Ollama's per-token logprobs from a streamed event's ``completion_probabilities`` (None when it has none)."""
    items = event.get("completion_probabilities")
    if not items:
        return None
    out = []
    for item in items:
        token = str(item.get("token", ""))
        tops = [(str(t.get("token", "")), float(t.get("logprob", 0.0)), list(t.get("bytes") or str(t.get("token", "")).encode()))
                for t in item.get("top_logprobs") or []]
        out.append(TokenLogprob(token, float(item.get("logprob", 0.0)), list(item.get("bytes") or token.encode()), tops))
    return out


def speculation_stats(timings: dict[str, Any] | None, drafter: str, generated: int) -> SpeculationStats:
    """tandem's statistics from llama-server's final ``timings`` (``draft_n``, ``draft_n_accepted``: totals only,
    so rounds and positions are not known)."""
    t = timings or {}
    drafted, accepted = int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)
    if drafter == "none" or drafted == 0:
        return SpeculationStats(drafter=drafter, target_forwards=generated, plain_steps=generated)
    return SpeculationStats(drafter=drafter, draft_n=drafted, draft_n_accepted=accepted, depth_sum=drafted)
