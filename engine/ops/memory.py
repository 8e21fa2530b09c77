"""Resident size of a module's weights, counting storage shared between tensors once."""

from __future__ import annotations

import torch


def model_bytes(module: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # mkldnn tensors have no storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total
