"""A trace of the step loop's forwards, one line each, and the reading of it: where a loaded model's time went.

Under load the engine's wall time is its forwards plus everything between them (the sequences' Python, a new
sequence's start, the compute thread's other work). Whether a gap to what the forwards allow lies in the loop or
in the forwards themselves is the first question a serving measurement raises, and the step loop is the one place
that sees every forward: with ``TANDEM_STEP_TRACE`` set to a directory, each native engine process appends to
``steps-<pid>.tsv`` there, per step, when it ended (wall clock), whose forwards it ran (``draft`` or ``target``),
how many sequences and rows they had, and how long they took. ``benchmarks.serving`` reads it back per load level
(``summarise``): the share of the level's wall time spent in forwards and the mean rows a target step carried.

A line is written after its step, outside the forward's timing; the file is line-buffered so that a reader sees
every finished step (the write costs microseconds against a forward's tens of milliseconds).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Sequence

log = logging.getLogger("tandem.engine")


def trace_path(directory: str | Path, pid: int) -> Path:
    """The file engine process ``pid`` traces into under ``directory``."""
    return Path(directory) / f"steps-{pid}.tsv"


class StepTrace:
    """Appends one line per step to ``trace_path(directory, os.getpid())`` (the directory is made if missing)."""

    def __init__(self, directory: str | Path):
        path = trace_path(directory, os.getpid())
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")

    @classmethod
    def opened(cls, directory: str | Path | None) -> "StepTrace | None":
        """A trace into ``directory``, or None when none is asked for or it cannot be written there (said in the
        engine's log: a trace is a measurement aid, and a directory it cannot write must not fail the load)."""
        if not directory:
            return None
        try:
            return cls(directory)
        except OSError as e:
            log.warning("TANDEM_STEP_TRACE: cannot write a step trace in %s (%s); not tracing", directory, e)
            return None

    def record(self, draft: bool, rows: Sequence[int], seconds: float) -> None:
        """A step that ran ``rows`` rows for each of ``len(rows)`` sequences' forwards in ``seconds``."""
        out = self._file
        if out is None:
            return
        try:
            out.write(f"{time.time():.6f}\t{'draft' if draft else 'target'}\t{len(rows)}\t{sum(rows)}\t{seconds:.6f}\n")
        except (OSError, ValueError):  # a full disk, or closed by an unload meanwhile: the trace stops, serving goes on
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True)
class StepRecord:
    ended: float  # wall clock (time.time) when the step's forwards were done
    draft: bool
    sequences: int
    rows: int
    seconds: float


def read_steps(path: str | Path) -> list[StepRecord]:
    """A trace file's steps (a line cut short by a writer still at work is left out)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) != 5:
            continue
        try:
            out.append(StepRecord(float(parts[0]), parts[1] == "draft", int(parts[2]), int(parts[3]), float(parts[4])))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class StepSummary:
    """The steps that ended within a window of wall time."""

    wall: float  # the window's length, seconds
    target_steps: int
    draft_steps: int
    target_rows: int
    target_seconds: float
    draft_seconds: float

    @property
    def forward_share(self) -> float:
        """The share of the window spent in forwards (target and draft)."""
        return (self.target_seconds + self.draft_seconds) / self.wall if self.wall > 0 else 0.0

    @property
    def rows_per_step(self) -> float:
        """The mean rows of a target step (a decode row per sequence, plus verified drafts and prompt chunks)."""
        return self.target_rows / self.target_steps if self.target_steps else 0.0


def summarise(steps: Iterable[StepRecord], start: float, end: float) -> StepSummary:
    """The steps that ended in [start, end] (wall clock)."""
    inside = [s for s in steps if start <= s.ended <= end]
    target = [s for s in inside if not s.draft]
    draft = [s for s in inside if s.draft]
    return StepSummary(wall=end - start, target_steps=len(target), draft_steps=len(draft),
                       target_rows=sum(s.rows for s in target), target_seconds=sum(s.seconds for s in target),
                       draft_seconds=sum(s.seconds for s in draft))
