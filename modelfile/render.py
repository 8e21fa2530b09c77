"""Modelfile serialisation, as Ollama's ``Command.String`` / ``Modelfile.String``."""
from __future__ import annotations

from collections.abc import Iterable

from .parser import Command

__all__ = ["render", "command_string", "quote"]

_QUOTED_KEYWORDS = ("license", "template", "system", "adapter", "renderer", "parser",
                    "requires", "draft")


def quote(s: str) -> str:
    """Ollama's ``quote``: quote only values that need it; no escaping."""
    if "\n" in s or s.startswith(" ") or s.endswith(" "):
        if '"' in s:
            return f'"""{s}"""'
        return f'"{s}"'
    return s


def command_string(cmd: Command) -> str:
    """One command as a Modelfile line (no trailing newline)."""
    if cmd.name == "model":
        return f"FROM {cmd.args}"
    if cmd.name in _QUOTED_KEYWORDS:
        return f"{cmd.name.upper()} {quote(cmd.args)}"
    if cmd.name == "message":
        role, sep, text = cmd.args.partition(": ")
        return f"MESSAGE {role} {quote(text)}"
    return f"PARAMETER {cmd.name} {quote(cmd.args)}"


def render(commands: Iterable[Command]) -> str:
    """The whole Modelfile: one command per line, each ending in ``\\n``."""
    return "".join(command_string(c) + "\n" for c in commands)
