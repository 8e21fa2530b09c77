"""Loading llama.cpp (llama-cpp-python) for the benchmarks' comparisons, without torch: the decode bench's
probe child imports this before llama.cpp alone."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def extra_buffer_types(llama_cpp_module, enabled: bool):
    """Load with llama.cpp's extra weight buffer types (its AMX and CPU repacking) on or off.

    ``Llama()`` takes no switch for ``llama_model_params.use_extra_bufts``; it reads the defaults from
    ``llama_cpp.llama_cpp.llama_model_default_params`` at construction, so that function is wrapped for
    the duration of the load."""
    low = getattr(llama_cpp_module, "llama_cpp", None)
    if enabled or low is None or not hasattr(low, "llama_model_default_params"):
        yield
        return
    original = low.llama_model_default_params

    def defaults():
        params = original()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = defaults
    try:
        yield
    finally:
        low.llama_model_default_params = original
