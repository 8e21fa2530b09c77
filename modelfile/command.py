"""A Modelfile command and its one-line string form, as Ollama's ``parser.Command`` and ``Command.String``.

The parser produces Commands and the serialiser writes them back; both depend on this module, which
depends on neither (a Command's ``str`` is its Modelfile line, so the line format lives here too).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Command", "command_string", "quote"]

_QUOTED_KEYWORDS = ("license", "template", "system", "adapter", "renderer", "parser",
                    "requires", "draft")


@dataclass(frozen=True)
class Command:
    """One Modelfile command, as Ollama's ``parser.Command``.

    ``name`` is ``model`` for FROM, the lower-cased keyword for TEMPLATE, SYSTEM,
    ADAPTER, LICENSE, DRAFT, RENDERER, PARSER, REQUIRES, ``message`` for MESSAGE
    (``args`` = ``"role: text"``), and the parameter name verbatim for PARAMETER.
    """

    name: str
    args: str

    def __str__(self) -> str:  # Ollama's Command.String
        return command_string(self)


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
