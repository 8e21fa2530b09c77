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
    DEFAULT_OPTIONS,
    DEPRECATED_PARAMETERS,
    DRAFT_SCHEDULES,
    DRAFTERS,
    LOAD_TIME_OPTIONS,
    OPTION_ALIASES,
    OPTION_TYPES,
    SPECULATION_DEFAULTS,
    SPECULATION_OPTIONS,
    ParamError,
    coerce_options,
    effective_draft_num_predict,
    format_params,
    parameters_from_commands,
    resolve_options,
    resolve_speculation,
)
from .parser import KEYWORDS, ROLES, ParseError, decode, parse
from .render import render

__all__ = [
    "parse", "render", "Command", "ParseError", "KEYWORDS", "ROLES", "decode",
    "command_string", "quote",
    "format_params", "parameters_from_commands", "coerce_options", "ParamError",
    "OPTION_TYPES", "OPTION_ALIASES", "DEFAULT_OPTIONS", "SPECULATION_DEFAULTS",
    "SPECULATION_OPTIONS", "DEPRECATED_PARAMETERS", "COMMAND_NAMES", "LOAD_TIME_OPTIONS",
    "DRAFT_SCHEDULES", "DRAFTERS",
    "resolve_speculation", "effective_draft_num_predict", "resolve_options",
]
