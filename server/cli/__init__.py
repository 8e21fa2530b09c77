"""The command line (`tandem ...`), apart from the HTTP server it talks to: ``commands`` (the verbs), ``client``
(the HTTP client every verb and ``tandem bench`` use) and ``bench`` (``tandem bench``). The server never imports
this package; it imports the server (``tandem serve`` starts it)."""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tandem`` script's entry point (imports the verbs only when run)."""
    from .commands import main as run

    return run(argv)
