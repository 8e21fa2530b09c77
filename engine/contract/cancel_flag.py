"""The cancel flag the server sets and the engine polls between rounds.

One byte of shared memory, with no lock: ``multiprocessing.Event`` guards its flag with a semaphore, and
an engine killed while holding it (it polls the flag every round) leaves it held forever, so the
server's next ``set()`` would block, on the event loop, for good. A single aligned byte is written
and read atomically, which is all a stop request needs.
"""

from __future__ import annotations

import ctypes
from multiprocessing.context import BaseContext


class CancelFlag:
    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def clear(self) -> None:
        self._value.value = False

    def is_set(self) -> bool:
        return self._value.value
