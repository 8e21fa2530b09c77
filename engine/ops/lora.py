"""LoRA adapters applied at run time: ``y = W x + B (A x)`` around any ``Linear``.

The base weight stays in whatever format it was loaded in (qdot codes, int4, bf16, ...), so every weight
format keeps working and the adapter can never disturb the base's exactness; the low-rank product costs two
thin matmuls (rank x in, out x rank), small beside W for the ranks adapters use.

``LoraWeights`` holds the adapters of one base GGUF, keyed by base tensor name; ``engine.ops.linear.load_linear``
asks it (``GGUFFile.lora``) to wrap each linear it builds. A fused linear (q/k/v, gate/up) concatenates its
parts' outputs, so its adapter is block-diagonal: the parts' A stacked along the rank, each part's B in its
own rows and rank columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.contract.adapter import AdapterError, LoraAdapter, read_lora
from engine.contract.gguf import GGUFFile
from engine.ops.dequant import load_tensor
from engine.ops.linear import Linear


class LoraLinear(Linear):
    """``base`` plus a low-rank update: ``a`` f32 [R, in], ``b`` f32 [out, R] with the scale folded in."""

    def __init__(self, base: Linear, a: torch.Tensor, b: torch.Tensor):
        super().__init__(base.in_features, base.out_features, base.compute_dtype)
        # Not a QDotLinear/SplitLinear: engine.models.fused_stack leaves an adapted model's blocks to Python.
        self.format = f"{base.format}+lora"
        self.base = base
        self.register_buffer("a", a)
        # B transposed once: [R, out] row-major is the faster operand for the one-row decode step.
        self.register_buffer("bt", b.T.contiguous())

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        y = self.base._matmul(x2)
        xa = x2.to(self.a.dtype) @ self.a.T
        if y.dtype == self.bt.dtype:
            return y.addmm_(xa, self.bt)
        return y.add_((xa @ self.bt).to(y.dtype))  # bf16/int formats: the update in f32, rounded once

    def _storage_tensors(self) -> list[torch.Tensor]:
        return [*self.base._storage_tensors(), self.a, self.bt]


@dataclass
class _Update:
    a: torch.Tensor  # f32 [r, in]
    b: torch.Tensor  # f32 [out, r], scaled


@dataclass
class LoraWeights:
    """Every adapter's updates for one base file, by base tensor name (several adapters add up)."""

    updates: dict[str, list[_Update]] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, paths: Sequence[str], base: GGUFFile, user_scale: float = 1.0) -> "LoraWeights":
        """Read and check each adapter GGUF against ``base`` (``engine.contract.adapter.AdapterError`` if one does not fit)."""
        out = cls()
        for path in paths:
            with GGUFFile(path) as f:
                try:
                    adapter: LoraAdapter = read_lora(f, base)
                except AdapterError as e:
                    raise AdapterError(f"{path}: {e}") from None
                for pair in adapter.pairs:
                    b = load_tensor(f, pair.b) * adapter.scale(pair, user_scale)
                    out.updates.setdefault(pair.base, []).append(_Update(load_tensor(f, pair.a), b))
        return out

    def wrap(self, parts: Sequence[tuple[str, int]], lin: Linear) -> Linear:
        """``lin``, built from the base tensors ``parts`` (name, output rows) concatenated along its output,
        with those parts' updates; ``lin`` itself when none has one."""
        blocks: list[tuple[int, _Update]] = []  # (first output row, update)
        row = 0
        for name, rows in parts:
            blocks += [(row, u) for u in self.updates.get(name, [])]
            row += rows
        if not blocks:
            return lin
        self.applied.update(name for name, _ in parts if name in self.updates)
        a = torch.cat([u.a for _, u in blocks])
        b = torch.zeros(lin.out_features, a.shape[0])
        col = 0
        for r0, u in blocks:
            b[r0:r0 + u.b.shape[0], col:col + u.b.shape[1]] = u.b
            col += u.b.shape[1]
        return LoraLinear(lin, a.contiguous(), b)

    def unapplied(self) -> list[str]:
        """Adapted base tensors that no linear was built from (the engine runs them some other way)."""
        return sorted(set(self.updates) - self.applied)

