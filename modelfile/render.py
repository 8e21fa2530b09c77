"""Modelfile serialisation, as Ollama's ``Modelfile.String`` (one command's line is ``modelfile.command``)."""
from __future__ import annotations

from collections.abc import Iterable

from .command import Command, command_string

__all__ = ["render"]


def render(commands: Iterable[Command]) -> str:
    """The whole Modelfile: one command per line, each ending in ``\\n``."""
    return "".join(command_string(c) + "\n" for c in commands)
