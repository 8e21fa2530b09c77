"""Execution and the template object: the executor walks the syntax tree with Go's semantics, GoTemplate
holds a parsed template and Ollama's two rewrites of it."""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .funcs import BUILTIN_FUNCS, _and, _builtins, _or
from .nodes import (Action, Arg, Break, Command, Continue, Dot, Field, Ident, If, Node, Paren, Pipe, Pos, Range, Text,
                    Variable, With)
from .parse import _parse_nodes
from .values import MISSING, GoStruct, TemplateError, _sorted_items, format_value, go_type_name, is_true

# ---------------------------------------------------------------------------------------------------
# Execution


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_NO_FINAL: Any = object()  # "no piped value": distinct from every template value, including nil


class _Exec:
    """One execution: the variable stack (Go's s.vars, with mark/pop per control structure) and output."""

    def __init__(self, funcs: Mapping[str, Callable[..., Any]], root: Any):
        self.funcs = funcs
        self.vars: list[list[Any]] = [["$", root]]
        self.out: list[str] = []
        self._arity: dict[str, inspect.Signature] = {}

    # -- statements --
    def walk(self, dot: Any, nodes: Sequence[Node]) -> None:
        for node in nodes:
            kind = type(node)
            if kind is Text:
                self.out.append(node.text)
            elif kind is Action:
                value = self.pipeline(dot, node.pipe)
                if not node.pipe.decl:
                    self.out.append(format_value(value))
            elif kind is If or kind is With:
                mark = len(self.vars)
                value = self.pipeline(dot, node.pipe)
                if is_true(value):
                    self.walk(value if kind is With else dot, node.body)
                elif node.else_body is not None:
                    self.walk(dot, node.else_body)
                del self.vars[mark:]
            elif kind is Range:
                self.range(dot, node)
            elif kind is Break:
                raise _Break
            elif kind is Continue:
                raise _Continue

    def range(self, dot: Any, node: Range) -> None:
        mark = len(self.vars)
        value = self.pipeline(dot, node.pipe)
        top = len(self.vars)
        decl = node.pipe.decl
        items = self.iteration(value, len(decl), node.pipe.pos)
        if items:
            for index, elem in items:
                inner = len(self.vars)
                if decl and node.pipe.is_assign:
                    if len(decl) > 1:
                        self.set_var(decl[0], index, node.pipe.pos)
                        self.set_var(decl[1], elem, node.pipe.pos)
                    else:
                        self.set_var(decl[0], elem, node.pipe.pos)
                elif decl:
                    self.vars[top - 1][1] = elem  # the last declared variable gets the element
                    if len(decl) > 1:
                        self.vars[top - 2][1] = index
                try:
                    self.walk(elem, node.body)
                except _Break:
                    break
                except _Continue:
                    pass
                finally:
                    del self.vars[inner:]
        elif node.else_body is not None:
            self.walk(dot, node.else_body)
        del self.vars[mark:]

    @staticmethod
    def iteration(value: Any, n_decl: int, pos: Pos) -> list[tuple[Any, Any]]:
        if value is None or value is MISSING:
            return []
        if isinstance(value, bool) or isinstance(value, (str, float)) or isinstance(value, GoStruct):
            raise TemplateError(f"range can't iterate over {format_value(value)}", *pos)
        if isinstance(value, int):  # Go 1.22: range over an integer
            if n_decl > 1:
                raise TemplateError(f"can't use {value} to iterate over more than one variable", *pos)
            return [(i, i) for i in range(value)]
        if isinstance(value, Mapping):
            return _sorted_items(value)
        if isinstance(value, (Sequence, bytes, bytearray)):
            return list(enumerate(value))
        raise TemplateError(f"range can't iterate over {format_value(value)}", *pos)

    # -- variables --
    def var(self, name: str, pos: Pos) -> Any:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                return self.vars[i][1]
        raise TemplateError(f"undefined variable: {name}", *pos)

    def set_var(self, name: str, value: Any, pos: Pos) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i][1] = value
                return
        raise TemplateError(f"undefined variable: {name}", *pos)

    # -- expressions --
    def pipeline(self, dot: Any, pipe: Pipe) -> Any:
        value = _NO_FINAL
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value)
        for name in pipe.decl:
            if pipe.is_assign:
                self.set_var(name, value, pipe.pos)
            else:
                self.vars.append([name, value])
        return value

    def command(self, dot: Any, cmd: Command, final: Any) -> Any:
        first, rest = cmd.args[0], cmd.args[1:]
        kind = type(first)
        if kind is Field:
            return self.field_chain(dot, dot, first.chain, rest, final, first.pos)
        if kind is Variable:
            value = self.var(first.name, first.pos)
            if not first.chain:
                self.not_a_function(cmd, final)
                return value
            return self.field_chain(dot, value, first.chain, rest, final, first.pos)
        if kind is Ident:
            return self.call(dot, first.name, rest, final, first.pos)
        if kind is Paren:
            if not first.chain:
                self.not_a_function(cmd, final)
                return self.pipeline(dot, first.pipe)
            value = self.pipeline(dot, first.pipe)
            return self.field_chain(dot, value, first.chain, rest, final, first.pos)
        self.not_a_function(cmd, final)
        if kind is Dot:
            return dot
        if first.value is None:
            raise TemplateError("nil is not a command", *first.pos)
        return first.value

    @staticmethod
    def not_a_function(cmd: Command, final: Any) -> None:
        if len(cmd.args) > 1 or final is not _NO_FINAL:
            raise TemplateError("can't give argument to non-function", *cmd.pos)

    def arg(self, dot: Any, node: Arg) -> Any:
        kind = type(node)
        if kind is Field:
            return self.field_chain(dot, dot, node.chain, (), _NO_FINAL, node.pos)
        if kind is Variable:
            value = self.var(node.name, node.pos)
            return self.field_chain(dot, value, node.chain, (), _NO_FINAL, node.pos) if node.chain else value
        if kind is Dot:
            return dot
        if kind is Ident:
            return self.call(dot, node.name, (), _NO_FINAL, node.pos)
        if kind is Paren:
            value = self.pipeline(dot, node.pipe)
            return self.field_chain(dot, value, node.chain, (), _NO_FINAL, node.pos) if node.chain else value
        return node.value

    def field_chain(
        self, dot: Any, receiver: Any, chain: tuple[str, ...], args: tuple[Arg, ...], final: Any, pos: Pos
    ) -> Any:
        for name in chain[:-1]:
            receiver = self.field(dot, receiver, name, (), _NO_FINAL, pos)
        return self.field(dot, receiver, chain[-1], args, final, pos)

    def field(self, dot: Any, receiver: Any, name: str, args: tuple[Arg, ...], final: Any, pos: Pos) -> Any:
        has_args = bool(args) or final is not _NO_FINAL
        if receiver is None or receiver is MISSING:
            value = MISSING
        elif isinstance(receiver, GoStruct):
            value = receiver.field(name)
        elif isinstance(receiver, Mapping):
            value = receiver.get(name, MISSING)
        elif isinstance(receiver, (str, bytes, bool, int, float, complex, Sequence)):
            raise TemplateError(f"can't evaluate field {name} in type {go_type_name(receiver)}", *pos)
        else:
            value = MISSING if name.startswith("_") else getattr(receiver, name, MISSING)
            if inspect.ismethod(value):  # a method: Go calls it, with the command's arguments
                argv = [self.arg(dot, a) for a in args] + ([] if final is _NO_FINAL else [final])
                return self.invoke(name, value, argv, pos)
        if has_args:
            raise TemplateError(f"{name} has arguments but cannot be invoked as function", *pos)
        return value

    def call(self, dot: Any, name: str, arg_nodes: tuple[Arg, ...], final: Any, pos: Pos) -> Any:
        fn = self.funcs.get(name)
        if fn is None:
            raise TemplateError(f'function "{name}" not defined', *pos)
        if fn is _and or fn is _or:
            return self.short_circuit(dot, fn is _or, name, arg_nodes, final, pos)
        argv = [self.arg(dot, a) for a in arg_nodes]
        if final is not _NO_FINAL:
            argv.append(final)
        return self.invoke(name, fn, argv, pos)

    def short_circuit(
        self, dot: Any, want: bool, name: str, arg_nodes: tuple[Arg, ...], final: Any, pos: Pos
    ) -> Any:
        # Go 1.18+: arguments are evaluated left to right only until the result is known, and the
        # deciding value itself (not a bool) is returned.
        thunks: list[Callable[[], Any]] = [lambda a=a: self.arg(dot, a) for a in arg_nodes]
        if final is not _NO_FINAL:
            thunks.append(lambda: final)
        if not thunks:
            raise TemplateError(f"wrong number of args for {name}: want at least 1 got 0", *pos)
        value = None
        for thunk in thunks:
            value = thunk()
            if is_true(value) == want:
                return value
        return value

    def invoke(self, name: str, fn: Callable[..., Any], argv: list[Any], pos: Pos) -> Any:
        sig = self._arity.get(name)
        if sig is None:
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                sig = None
            if sig is not None:
                self._arity[name] = sig
        if sig is not None:
            try:
                sig.bind(*argv)
            except TypeError:
                raise TemplateError(f"wrong number of args for {name}: got {len(argv)}", *pos) from None
        try:
            return fn(*argv)
        except (_Break, _Continue):
            raise
        except TemplateError as err:
            raise TemplateError(f"error calling {name}: {err.reason}", *pos) from None
        except Exception as err:  # a custom func failing is an execution error, as in Go
            raise TemplateError(f"error calling {name}: {err}", *pos) from err


# ---------------------------------------------------------------------------------------------------
# Tree queries and the two rewrites Ollama applies to templates


def _pipe_args(pipe: Pipe) -> Iterator[Arg]:
    for cmd in pipe.cmds:
        for arg in cmd.args:
            yield arg
            if isinstance(arg, Paren):
                yield from _pipe_args(arg.pipe)


def _identifiers(nodes: Sequence[Node]) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, Text) or isinstance(node, (Break, Continue)):
            continue
        for arg in _pipe_args(node.pipe):
            if isinstance(arg, (Field, Variable, Paren)):
                yield from arg.chain
        if isinstance(node, (If, With, Range)):
            yield from _identifiers(node.body)
            if node.else_body is not None:
                yield from _identifiers(node.else_body)


def _cut_after(nodes: tuple[Node, ...], name: str) -> tuple[Node, ...]:
    """Ollama's deleteNode: keep everything up to and including the first `.<name>` field, drop the rest.

    Walk order and granularity follow Ollama (template.go): conditions of if/with/range are not
    searched, and once the field is seen every later node is deleted, wherever it sits.
    """
    cut = False

    def walk_arg(arg: Arg) -> Arg | None:
        nonlocal cut
        if cut:
            return None
        if isinstance(arg, Field) and name in arg.chain:
            cut = True
            return arg
        if isinstance(arg, Paren):
            pipe = walk_pipe(arg.pipe)
            return None if pipe is None else replace(arg, pipe=pipe)
        return arg

    def walk_pipe(pipe: Pipe) -> Pipe | None:
        if cut:
            return None
        cmds = []
        for cmd in pipe.cmds:
            args = tuple(a for a in map(walk_arg, cmd.args) if a is not None)
            if not args:
                return None
            cmds.append(replace(cmd, args=args))
        return replace(pipe, cmds=tuple(cmds))

    def walk(node: Node) -> Node | None:
        if cut:
            return None
        if isinstance(node, Action):
            pipe = walk_pipe(node.pipe)
            return None if pipe is None else Action(pipe)
        if isinstance(node, (If, With, Range)):
            body = walk_list(node.body)
            else_body = None if node.else_body is None else walk_list(node.else_body)
            return replace(node, body=body, else_body=else_body)
        return node

    def walk_list(items: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(n for n in map(walk, items) if n is not None)

    return walk_list(nodes)


@dataclass(frozen=True, eq=False)
class GoTemplate:
    """A parsed template.  Immutable: the rewrites return new templates."""

    source: str
    root: tuple[Node, ...]
    funcs: Mapping[str, Callable[..., Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, *, funcs: Mapping[str, Callable[..., Any]] | None = None) -> GoTemplate:
        """Parse `text`; `funcs` adds (or overrides) template functions, as Go's Template.Funcs does."""
        extra = dict(funcs or {})
        return cls(text, _parse_nodes(text, BUILTIN_FUNCS | frozenset(extra)), extra)

    def execute(self, data: Any, *, today: datetime.date | None = None) -> str:
        """Render with `data` as both dot and `$`; `today` fixes what currentDate returns."""
        funcs = {**_builtins(today), **self.funcs}
        ex = _Exec(funcs, data)
        try:
            ex.walk(data, self.root)
        except RecursionError:
            raise TemplateError("template nesting too deep") from None
        return "".join(ex.out)

    @functools.cached_property
    def _vars(self) -> frozenset[str]:
        return frozenset(name.lower() for name in _identifiers(self.root))

    def vars(self) -> set[str]:
        """Lower-cased field names the template mentions (Ollama's Template.Vars), e.g. {"messages", "role"}."""
        return set(self._vars)

    def has_field(self, name: str) -> bool:
        return name.lower() in self._vars

    def truncated_after_field(self, name: str) -> GoTemplate:
        """The template cut right after the first `.<name>` (Ollama renders a legacy final turn this way)."""
        return replace(self, root=_cut_after(self.root, name))

    def with_appended_field(self, name: str) -> GoTemplate:
        """The template with `{{ .<name> }}` appended (Ollama's Parse does this for .Response)."""
        pipe = Pipe((), False, (Command((Field((name,), (0, 0)),), (0, 0)),), (0, 0))
        return replace(self, root=self.root + (Action(pipe),))


def parse_template(text: str, *, funcs: Mapping[str, Callable[..., Any]] | None = None) -> GoTemplate:
    """Parse a TEMPLATE; raises TemplateError (Ollama's create answers 400 with it)."""
    return GoTemplate.parse(text, funcs=funcs)
