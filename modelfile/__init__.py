"""Modelfile support: Ollama-exact parsing and serialisation, and typed parameters.

>>> cmds = parse("FROM llama3\\nPARAMETER temperature 0.7\\n")
>>> cmds
[Command(name='model', args='llama3'), Command(name='temperature', args='0.7')]
>>> parameters_from_commands(cmds)
({'temperature': 0.7}, [])
>>> print(render(cmds), end="")
FROM llama3
PARAMETER temperature 0.7
"""
from .command import Command, command_string, quote
from .params import (
    COMMAND_NAMES,
    DEPRECATED_PARAMETERS,
    ParamError,
    format_params,
    parameters_from_commands,
)
from .parser import KEYWORDS, ROLES, ParseError, decode, parse
from .render import render

__all__ = [
    "parse", "render", "Command", "ParseError", "KEYWORDS", "ROLES", "decode",
    "command_string", "quote",
    "format_params", "parameters_from_commands", "ParamError",
    "DEPRECATED_PARAMETERS", "COMMAND_NAMES",
]
