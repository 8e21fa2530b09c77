"""Which runtime loads a model, by ``LoadSpec.engine``: the one place the engine process names the engines. Each
import happens only when its engine loads (vLLM's client and llama.cpp's need no torch; the native engine does)."""

from __future__ import annotations

import os
from typing import Callable

from engine.contract.protocol import EngineError, LoadSpec
from engine.contract.runtime import EngineRuntime


def _native(spec: LoadSpec) -> EngineRuntime:
    import torch

    torch.set_num_threads(spec.num_thread if spec.num_thread > 0 else (os.cpu_count() or 1))
    from engine.runtime import ModelRuntime

    return ModelRuntime.load(spec)


def _vllm(spec: LoadSpec) -> EngineRuntime:
    from engine.vllm.runtime import VllmRuntime

    return VllmRuntime.load(spec)


def _llamacpp(spec: LoadSpec) -> EngineRuntime:
    from engine.llamacpp.runtime import LlamaCppRuntime

    return LlamaCppRuntime.load(spec)


LOADERS: dict[str, Callable[[LoadSpec], EngineRuntime]] = {"native": _native, "vllm": _vllm, "llamacpp": _llamacpp}


def load_runtime(spec: LoadSpec) -> EngineRuntime:
    loader = LOADERS.get(spec.engine)
    if loader is None:
        raise EngineError(f"unknown engine {spec.engine!r} (tandem has: {', '.join(LOADERS)})", 500)
    return loader(spec)
