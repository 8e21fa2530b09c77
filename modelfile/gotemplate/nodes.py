"""The syntax tree a parsed template is: small immutable dataclasses, one per Go parse node kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

# ---------------------------------------------------------------------------------------------------
# Syntax tree.  Positions are (line, column), 1-based, for error messages.

Pos = tuple[int, int]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Field:
    chain: tuple[str, ...]
    pos: Pos


@dataclass(frozen=True)
class Variable:
    name: str  # "$" or "$x"
    chain: tuple[str, ...]
    pos: Pos


@dataclass(frozen=True)
class Dot:
    pos: Pos


@dataclass(frozen=True)
class Ident:
    name: str
    pos: Pos


@dataclass(frozen=True)
class Literal:
    value: Any  # None is Go's nil
    pos: Pos


@dataclass(frozen=True)
class Paren:
    pipe: Pipe
    chain: tuple[str, ...]
    pos: Pos


Arg = Union[Field, Variable, Dot, Ident, Literal, Paren]


@dataclass(frozen=True)
class Command:
    args: tuple[Arg, ...]
    pos: Pos


@dataclass(frozen=True)
class Pipe:
    decl: tuple[str, ...]
    is_assign: bool
    cmds: tuple[Command, ...]
    pos: Pos


@dataclass(frozen=True)
class Action:
    pipe: Pipe


@dataclass(frozen=True)
class If:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class With:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class Range:
    pipe: Pipe
    body: tuple[Node, ...]
    else_body: tuple[Node, ...] | None


@dataclass(frozen=True)
class Break:
    pos: Pos


@dataclass(frozen=True)
class Continue:
    pos: Pos


Node = Union[Text, Action, If, With, Range, Break, Continue]
