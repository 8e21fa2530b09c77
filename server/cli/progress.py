"""Transfer progress as `ollama pull` / `ollama push` draw it: on a terminal one bar per blob, redrawn in place
(`pulling 6a0746a1ec1a: 42% ▕███████         ▏ 1.2 GB/2.9 GB  48 MB/s  35s`); piped (and for `tandem create`, whose
progress is always printed this way), each whole ten percent once."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

BAR_WIDTH = 24


def human_bytes(n: float) -> str:
    """Ollama's format.HumanBytes (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


class TransferProgress:
    """Call with each progress object of a pull or push stream (``status``, ``digest``, ``total``, ``completed``)."""

    def __init__(self, out: TextIO | None = None, tty: bool | None = None):
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self._line = ""  # the bar being redrawn (tty) or the last line printed
        self._digest: str | None = None
        self._started: dict[str, tuple[float, int]] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        status, digest = str(event.get("status") or ""), event.get("digest")
        total, completed = int(event.get("total") or 0), int(event.get("completed") or 0)
        if total and (digest or not self.tty):  # a piped create's quantizing steps too (no digest: no bar)
            self._bar(status, str(digest), total, completed)
        else:
            self._end_bar()
            self._print(status)

    def _bar(self, status: str, digest: str, total: int, completed: int) -> None:
        pct = min(100, int(100 * completed / total))
        if not self.tty:  # a log: each whole ten percent once
            if pct % 10 == 0 or pct == 100:
                self._print(f"{status} {pct}%")
            return
        now = time.monotonic()
        t0, c0 = self._started.setdefault(digest, (now, completed))
        filled = BAR_WIDTH * pct // 100
        line = f"{status}: {pct:3d}% ▕{'█' * filled}{' ' * (BAR_WIDTH - filled)}▏ {human_bytes(completed)}/{human_bytes(total)}"
        if completed < total and now - t0 > 0.5 and completed > c0:
            rate = (completed - c0) / (now - t0)
            line += f"  {human_bytes(rate)}/s  {int((total - completed) / rate)}s"
        if digest != self._digest:
            self._end_bar()
            self._digest = digest
        self.out.write("\r" + line + " " * max(0, len(self._line) - len(line)))
        self.out.flush()
        self._line = line

    def _end_bar(self) -> None:
        if self._digest is not None:
            self.out.write("\n")
            self._digest, self._line = None, ""

    def _print(self, line: str) -> None:
        if line and line != self._line:
            self.out.write(line + "\n")
            self.out.flush()
            self._line = line

    def close(self) -> None:
        self._end_bar()
