"""Per-tensor value transforms a conversion applies between reading a source tensor and writing it.

Each transform is a small frozen dataclass with the shape it produces from a source shape (checked against
config.json before anything is written) and the torch operation itself (run when the tensor is written, one
tensor at a time). A ``TensorPlan`` lists them in the order they run. Permutations and slices are exact in any
dtype; arithmetic (``NegExp``) runs in float64 and is rounded once, to the output type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class NegExp:
    """-exp(x): a log-parameterised decay stored as the value the kernel multiplies by (qwen35 ``A_log`` -> ``ssm_a``)."""

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def apply(self, t: Any) -> Any:
        import torch

        return -torch.exp(t.to(torch.float64))


@dataclass(frozen=True)
class Squeeze:
    """Drop a size-1 axis (a depthwise conv's [channels, 1, kernel] -> [channels, kernel])."""

    axis: int

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) <= self.axis or shape[self.axis] != 1:
            return shape  # left as is: the caller's shape check then names the mismatch
        return shape[:self.axis] + shape[self.axis + 1:]

    def apply(self, t: Any) -> Any:
        return t.squeeze(self.axis)


@dataclass(frozen=True)
class TakeSlice:
    """Part ``index`` of ``parts`` equal parts along ``axis`` (a fused gate/up projection split in two)."""

    axis: int
    index: int
    parts: int

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) <= self.axis or shape[self.axis] % self.parts:
            return shape
        return shape[:self.axis] + (shape[self.axis] // self.parts,) + shape[self.axis + 1:]

    def apply(self, t: Any) -> Any:
        return t.chunk(self.parts, dim=self.axis)[self.index].contiguous()


@dataclass(frozen=True)
class TileHeads:
    """Heads grouped by key head -> tiled, along ``axis`` from ``offset`` on.

    Gated DeltaNet's checkpoints order the value heads of key head k together ([k0v0, k0v1, k1v0, k1v1]);
    llama.cpp's qwen35 (and the engine) index them tiled ([k0v0, k1v0, k0v1, k1v1]), so each value head
    repeats the key heads in order. ``head_dim`` is the rows (or columns) one head spans; what lies before
    ``offset`` (the q and k rows of a fused qkv) stays where it is.
    """

    axis: int
    n_groups: int  # key heads
    per_group: int  # value heads per key head
    head_dim: int
    offset: int = 0

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def apply(self, t: Any) -> Any:
        import torch

        n = self.n_groups * self.per_group * self.head_dim
        if t.shape[self.axis] != self.offset + n:
            raise ValueError(f"{t.shape[self.axis]} rows along axis {self.axis}, expected {self.offset} + {n}")
        head = t.narrow(self.axis, 0, self.offset)
        v = t.narrow(self.axis, self.offset, n)
        shape = list(v.shape)
        grouped = shape[:self.axis] + [self.n_groups, self.per_group, self.head_dim] + shape[self.axis + 1:]
        v = v.reshape(grouped).transpose(self.axis, self.axis + 1).reshape(shape)
        return torch.cat([head, v], dim=self.axis)


Transform = Union[NegExp, Squeeze, TakeSlice, TileHeads]


def out_shape(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``transforms`` make of a source tensor of ``shape``."""
    for tr in transforms:
        shape = tr.out_shape(shape)
    return shape
