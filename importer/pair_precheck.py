"""Refusing a FROM/DRAFT pair of Hugging Face folders from their config.json files alone, before anything is converted.

Converting a target folder puts its GGUF in the store; a drafter found unfit only after that would leave the
store changed by a create that failed. What config.json already decides (a Gemma 4 assistant built for
another target width, or a target family it does not draft for) is therefore checked first, with the same
words the GGUF pair check uses (``engine.contract.capabilities.drafter_problem``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from engine.contract.capabilities import DRAFTER_ARCHITECTURES, drafter_problem

from .architectures import whole_folder_spec
from .hf_config import read_params
from .request import CreateError
from .hf.safetensors import folder_paths


def _config(files: Mapping[str, str], blob_path: Callable[[str], Path]) -> dict[str, Any] | None:
    """The parsed config.json of an uploaded safetensors folder; None for a GGUF upload or a missing/bad config
    (which the conversion itself reports)."""
    names = folder_paths(files)
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        return None
    try:
        data = json.loads(blob_path(names["config.json"]).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def precheck_folder_pair(files: Mapping[str, str], draft_files: Mapping[str, str],
                         blob_path: Callable[[str], Path]) -> None:
    """Raise CreateError when two uploaded folders cannot pair as target and drafter-only DRAFT."""
    target_cfg, draft_cfg = _config(files, blob_path), _config(draft_files, blob_path)
    if target_cfg is None or draft_cfg is None:
        return
    whole = whole_folder_spec(draft_cfg)
    if whole is not None:  # a drafter converted whole (an EAGLE-3 head) says itself what it needs of its target
        problem = whole.pair_problem(draft_cfg, read_params(target_cfg, "FROM")) if whole.pair_problem else None
        if problem is not None:
            raise CreateError(problem)
        return
    draft = read_params(draft_cfg, "DRAFT")
    if draft.arch not in DRAFTER_ARCHITECTURES:
        return
    target = read_params(target_cfg, "FROM")
    problem = drafter_problem(draft.arch, draft.n_embd_out, target.arch, target.n_embd)
    if problem is not None:
        raise CreateError(problem)
