"""Prompt sets for `tandem bench`: the built-in ones (``prompt_sets``, shared with
benchmarks.speculation) or a ``--prompts FILE``.

A prompts file is JSON: an object ``{"name": "prompt text", ...}`` or a list of
``{"name": ..., "prompt": ..., "kind": "code" | "prose" | ...}`` (``kind`` defaults to the name). The
quality run's likelihood measurement uses the prompts of kind ``prose`` (the built-in prose set when
the file has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .files import read_json
from .prompt_sets import PROMPTS, PROSE_PROMPTS


class PromptsError(ValueError):
    pass


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    kind: str


def builtin_prompts() -> list[Prompt]:
    return [Prompt(name, text, name) for name, text in PROMPTS.items()]


def builtin_prose() -> list[Prompt]:
    return [Prompt(name, text, "prose") for name, text in PROSE_PROMPTS.items()]


def load_prompts(path: str | Path) -> list[Prompt]:
    data = read_json(path, "prompts", PromptsError)
    out: list[Prompt] = []
    if isinstance(data, dict):
        for name, text in data.items():
            if not isinstance(text, str):
                raise PromptsError(f"prompt {name!r} must be a string")
            out.append(Prompt(str(name), text, str(name)))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            if isinstance(item, str):
                out.append(Prompt(f"prompt{i + 1}", item, "custom"))
                continue
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise PromptsError(f"prompt {i} must be a string or an object with a \"prompt\" string")
            name = str(item.get("name") or f"prompt{i + 1}")
            out.append(Prompt(name, item["prompt"], str(item.get("kind") or name)))
    else:
        raise PromptsError("the prompts file must hold an object or a list")
    if not out:
        raise PromptsError("the prompts file has no prompts")
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise PromptsError("prompt names must be unique")
    return out


def select(prompts: list[Prompt], names: str | None) -> list[Prompt]:
    """The prompts named in a comma-separated list (all when ``names`` is empty)."""
    if not names:
        return prompts
    wanted = [n for n in names.split(",") if n]
    by = {p.name: p for p in prompts}
    missing = [n for n in wanted if n not in by]
    if missing:
        raise PromptsError(f"unknown prompt(s): {', '.join(missing)} (have: {', '.join(by)})")
    return [by[n] for n in wanted]


def sampling_options(temperature: float, min_p: float) -> dict:
    """The options of one temperature: ``{"temperature": 0}`` for greedy, else with ``min_p`` (0.01 by
    default, as prompt_sets.TEMPERATURES)."""
    return {"temperature": 0.0} if temperature <= 0 else {"temperature": temperature, "min_p": min_p}
