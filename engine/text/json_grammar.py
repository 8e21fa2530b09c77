"""Constrained decoding for Ollama's ``format``: JSON mode and a JSON-schema subset.

``format: "json"`` constrains the output to one JSON value of any kind (llama.cpp's JSON grammar
allows any value at the root; in practice models answer with an object). ``format: {schema}``
constrains it to JSON conforming to a subset of JSON Schema:

* ``type``: object, array, string, number, integer, boolean, null, or a list of those;
* ``properties`` / ``required``: the object's keys are emitted in the schema's ``properties``
  order, only keys listed there (like llama.cpp's schema grammar); required keys must appear,
  optional ones may be skipped; ``additionalProperties`` may be ``true``/``false`` (either way only
  the listed keys are emitted, which conforms to both); an object schema without ``properties``
  accepts any object;
* ``enum`` / ``const``: the value is one of the listed values, written compactly;
* ``items``: the schema of every array element;
* annotations (``title``, ``description``, ``$schema``, ``default``, ...) are ignored.

Any other keyword is refused with :class:`SchemaError` (the server answers 400 naming it).

This module is the text layer, torch-free so that the server validates a ``format`` before anything
is loaded: :func:`compile_format` and :class:`JsonRecognizer`, a character-level pushdown automaton (a
stack of frames, one per open value) with ``clone`` / ``advance(text) -> bool`` / ``is_complete`` /
``done``. ``engine.sampling.constrain.TokenConstraint`` is the token layer: it filters a next-token
distribution to the tokens whose text keeps the recogniser valid.

Limits that keep a weak model from running on forever (llama.cpp's grammars have the first two):
whitespace outside strings is one space or a newline plus at most ``WS_CAP`` spaces/tabs; a digit
run in a number has at most 16 digits; objects and arrays nest at most ``MAX_DEPTH`` deep.
"""

from __future__ import annotations

import json
from typing import Any

WS = " \t\n\r"
WS_CAP = 20
MAX_DEPTH = 32  # open objects/arrays at once: keeps a degenerate model from nesting forever
HEX = set("0123456789abcdefABCDEF")
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples",
                         "deprecated", "readOnly", "writeOnly"})
KEYWORDS = frozenset({"type", "properties", "required", "enum", "const", "items", "additionalProperties"})


class SchemaError(ValueError):
    pass


# ----------------------------------------------------------------------------------------------
# schema -> compiled nodes
# ----------------------------------------------------------------------------------------------


class Node:
    """A compiled schema: allowed types (None = any), literal values, object properties, items."""

    __slots__ = ("items", "literals", "props", "required", "types")

    def __init__(self, types=None, literals=None, props=None, required=frozenset(), items=None):
        self.types: frozenset[str] | None = types
        self.literals: tuple[str, ...] | None = literals  # compact JSON texts (enum / const)
        self.props: list[tuple[str, Node]] | None = props  # None: any keys and values
        self.required: frozenset[str] = required
        self.items: Node | None = items


ANY = Node()


def _compact(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def compile_schema(schema: Any, path: str = "schema") -> Node:
    if schema is True or schema == {}:
        return ANY
    if not isinstance(schema, dict):
        raise SchemaError(f"{path}: a schema must be an object, got {_compact(schema)}")
    for k in schema:
        if k not in KEYWORDS and k not in ANNOTATIONS:
            raise SchemaError(f'unsupported JSON schema keyword "{k}" at {path}')
    if "const" in schema or "enum" in schema:
        vals = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(vals, list) or not vals:
            raise SchemaError(f"{path}.enum must be a non-empty array")
        return Node(literals=tuple(dict.fromkeys(_compact(v) for v in vals)))
    t = schema.get("type")
    if t is None:
        types = frozenset({"object"}) if "properties" in schema else frozenset({"array"}) if "items" in schema else None
    else:
        tl = t if isinstance(t, list) else [t]
        for x in tl:
            if x not in TYPES:
                raise SchemaError(f"{path}.type: unknown type {_compact(x)}")
        types = frozenset(tl)
    ap = schema.get("additionalProperties", True)
    if not isinstance(ap, bool):
        raise SchemaError(f'unsupported JSON schema keyword "additionalProperties" (only true/false) at {path}')
    props = None
    required = frozenset()
    if "properties" in schema or "required" in schema or ap is False:
        raw = schema.get("properties") or {}
        if not isinstance(raw, dict):
            raise SchemaError(f"{path}.properties must be an object")
        req = schema.get("required") or []
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise SchemaError(f"{path}.required must be an array of strings")
        props = [(k, compile_schema(v, f"{path}.properties.{k}")) for k, v in raw.items()]
        props += [(r, ANY) for r in req if r not in raw]  # required but not described: any value
        required = frozenset(req)
    items = compile_schema(schema["items"], f"{path}.items") if "items" in schema else None
    return Node(types=types, props=props, required=required, items=items)


def compile_format(fmt: Any) -> Node | None:
    """``format`` as Ollama accepts it: None/""/{} (no constraint), "json", or a schema dict."""
    if fmt is None or fmt == "" or fmt == {}:
        return None
    if fmt == "json":
        return ANY
    if isinstance(fmt, dict):
        return compile_schema(fmt)
    raise SchemaError(f'invalid format: {_compact(fmt)}; expected "json" or a JSON schema')


# ----------------------------------------------------------------------------------------------
# the recogniser: frames on a stack
# ----------------------------------------------------------------------------------------------
# A frame's feed(c, m) returns OK (consumed), BAD (not a valid prefix) or POP (the frame is complete
# and c belongs to its parent). Frames may push children onto m.stack or replace themselves.

OK, BAD, POP = 0, 1, 2


class Value:
    """Before a value: skip whitespace, then dispatch on the first character."""

    __slots__ = ("node",)

    def __init__(self, node: Node):
        self.node = node

    def copy(self):
        return self  # stateless

    def can_end(self) -> bool:
        return False

    def feed(self, c: str, m: JsonRecognizer) -> int:
        if c in WS:
            return m.ws(c)
        node = self.node
        if node.literals is not None:
            m.stack[-1] = Literal(node.literals)
            return m.stack[-1].feed(c, m)
        t = node.types

        def ok(name: str) -> bool:
            return t is None or name in t

        if c in "{[" and len(m.stack) > MAX_DEPTH:
            return BAD
        if c == "{" and ok("object"):
            m.stack[-1] = Object(node)
        elif c == "[" and ok("array"):
            m.stack[-1] = Array(node.items or ANY)
        elif c == '"' and ok("string"):
            m.stack[-1] = String()
        elif (c == "-" or c.isdigit() and c.isascii()) and (ok("number") or ok("integer")):
            m.stack[-1] = Number(integer=not ok("number"))
            return m.stack[-1].feed(c, m)
        elif c in "tf" and ok("boolean"):
            m.stack[-1] = Literal(("true", "false"))
            return m.stack[-1].feed(c, m)
        elif c == "n" and ok("null"):
            m.stack[-1] = Literal(("null",))
            return m.stack[-1].feed(c, m)
        else:
            return BAD
        return OK


class Literal:
    """One of a set of fixed texts (true/false/null, enum and const values)."""

    __slots__ = ("options", "text")

    def __init__(self, options: tuple[str, ...], text: str = ""):
        self.options, self.text = options, text

    def copy(self):
        return Literal(self.options, self.text)

    def can_end(self) -> bool:
        return self.text in self.options

    def feed(self, c: str, m) -> int:
        if not self.text and c in WS:
            return m.ws(c)
        t = self.text + c
        if any(o.startswith(t) for o in self.options):
            self.text = t
            if t in self.options and not any(o != t and o.startswith(t) for o in self.options):
                m.stack.pop()  # nothing can extend it: the value is closed
            return OK
        return POP if self.can_end() else BAD


class String:
    """Inside a string, after the opening quote. state: 0 chars, 1 after '\\', 2..5 in \\uXXXX."""

    __slots__ = ("state",)

    def __init__(self, state: int = 0):
        self.state = state

    def copy(self):
        return String(self.state)

    def can_end(self) -> bool:
        return False

    def feed(self, c: str, m) -> int:
        s = self.state
        if s == 0:
            if c == '"':
                m.stack.pop()
            elif c == "\\":
                self.state = 1
            elif ord(c) < 0x20:
                return BAD
            return OK
        if s == 1:
            if c == "u":
                self.state = 2
            elif c in '"\\/bfnrt':
                self.state = 0
            else:
                return BAD
            return OK
        if c not in HEX:
            return BAD
        self.state = 0 if s == 5 else s + 1
        return OK


class Number:
    """JSON number (or integer). States: 0 start, 1 after '-', 2 after leading '0', 3 int digits,
    4 after '.', 5 frac digits, 6 after e/E, 7 after exponent sign, 8 exponent digits. Each digit run
    is capped at ``DIGITS`` (llama.cpp's schema grammar: ``[1-9] [0-9]{0,15}``), so it ends."""

    __slots__ = ("digits", "integer", "state")
    ENDS = frozenset({2, 3, 5, 8})
    DIGITS = 16

    def __init__(self, integer: bool, state: int = 0, digits: int = 0):
        self.integer, self.state, self.digits = integer, state, digits

    def copy(self):
        return Number(self.integer, self.state, self.digits)

    def can_end(self) -> bool:
        return self.state in self.ENDS

    def feed(self, c: str, m) -> int:
        s, digit = self.state, c.isascii() and c.isdigit()
        more = self.digits < self.DIGITS
        nxt = None
        if s == 0 and c == "-":
            nxt = 1
        elif s in (0, 1) and digit:
            nxt = 2 if c == "0" else 3
        elif s in (2, 3) and c == "." and not self.integer:
            nxt = 4
        elif s in (2, 3, 5) and c in "eE" and not self.integer:
            nxt = 6
        elif s == 6 and c in "+-":
            nxt = 7
        elif digit and (s in (4, 6, 7) or (s in (3, 5, 8) and more)):
            nxt = {3: 3, 4: 5, 5: 5, 6: 8, 7: 8, 8: 8}[s]
        if nxt is not None:
            self.digits = self.digits + 1 if digit and nxt == s else (1 if digit else 0)
            self.state = nxt
            return OK
        return POP if self.can_end() else BAD


class Array:
    """After '['. state: 0 expect value or ']', 1 after a value (',' or ']'), 2 after ','."""

    __slots__ = ("item", "state")

    def __init__(self, item: Node, state: int = 0):
        self.item, self.state = item, state

    def copy(self):
        return Array(self.item, self.state)

    def can_end(self) -> bool:
        return False

    def feed(self, c: str, m) -> int:
        if c in WS:
            return m.ws(c)
        if self.state == 1:
            if c == ",":
                self.state = 2
                return OK
            if c == "]":
                m.stack.pop()
                return OK
            return BAD
        if c == "]" and self.state == 0:
            m.stack.pop()
            return OK
        self.state = 1
        m.stack.append(Value(self.item))
        return m.stack[-1].feed(c, m)


class Object:
    """After '{'. state: 0 expect key or '}', 1 in key, 2 after key (':'), 3 after a value
    (',' or '}'), 4 after ',' (key). ``nxt``: index of the next schema property allowed; ``key``:
    the key text so far (for schema objects, matched against the allowed keys' JSON spellings)."""

    __slots__ = ("key", "node", "nxt", "seen", "state")

    def __init__(self, node: Node, state: int = 0, nxt: int = 0, key: str = "", seen: frozenset = frozenset()):
        self.node, self.state, self.nxt, self.key, self.seen = node, state, nxt, key, seen

    def copy(self):
        return Object(self.node, self.state, self.nxt, self.key, self.seen)

    def can_end(self) -> bool:
        return False

    def _candidates(self) -> list[int]:
        """Indexes of the properties that may come next: in order, skipping no required one."""
        props = self.node.props or []
        out = []
        for i in range(self.nxt, len(props)):
            out.append(i)
            if props[i][0] in self.node.required:
                break
        return out

    def _may_close(self) -> bool:
        return self.node.props is None or self.node.required <= self.seen

    def feed(self, c: str, m) -> int:
        s = self.state
        if s == 1:
            return self._key(c, m)
        if c in WS:
            return m.ws(c)
        if s in (0, 4):
            if c == "}" and s == 0 and self._may_close():
                m.stack.pop()
                return OK
            if c != '"' or (self.node.props is not None and not self._candidates()):
                return BAD
            self.state, self.key = 1, '"'
            if self.node.props is None:
                m.stack.append(String())  # a free key: any string
            return OK
        if s == 2:
            if c != ":":
                return BAD
            self.state = 3
            node = ANY
            if self.node.props is not None:
                node = self.node.props[self.nxt - 1][1]
            m.stack.append(Value(node))
            return OK
        # s == 3: after a value
        if c == ",":
            if self.node.props is not None and not self._candidates():
                return BAD
            self.state = 4
            return OK
        if c == "}" and self._may_close():
            m.stack.pop()
            return OK
        return BAD

    def _key(self, c: str, m) -> int:
        if self.node.props is None:  # the String child consumed the key; we see what follows it
            self.state = 2
            return self.feed(c, m)
        t = self.key + c
        props = self.node.props
        hits = [i for i in self._candidates() if _compact(props[i][0]).startswith(t)]
        if not hits:
            return BAD
        self.key = t
        done = [i for i in hits if _compact(props[i][0]) == t]
        if done:
            i = done[0]
            self.nxt, self.seen, self.state = i + 1, self.seen | {props[i][0]}, 2
        return OK


class JsonRecognizer:
    """Incremental recogniser of one JSON value conforming to a compiled schema."""

    __slots__ = ("stack", "ws_nl", "ws_run")

    def __init__(self, node: Node = ANY, stack: list | None = None, ws_run: int = 0, ws_nl: bool = False):
        self.stack = stack if stack is not None else [Value(node)]
        self.ws_run, self.ws_nl = ws_run, ws_nl

    def clone(self) -> JsonRecognizer:
        return JsonRecognizer(stack=[f.copy() for f in self.stack], ws_run=self.ws_run, ws_nl=self.ws_nl)

    def ws(self, c: str) -> int:
        """Whitespace between tokens, as llama.cpp's JSON grammars allow it: one space, or a newline
        followed by at most ``WS_CAP`` spaces/tabs (so a model cannot pad forever)."""
        if self.ws_run == 0:
            ok = c in " \n"
        else:
            ok = self.ws_nl and c in " \t" and self.ws_run <= WS_CAP
        if not ok:
            return BAD
        self.ws_nl = self.ws_nl if self.ws_run else c == "\n"
        self.ws_run += 1
        return OK

    def _feed(self, c: str) -> bool:
        while self.stack:
            r = self.stack[-1].feed(c, self)
            if r == POP:
                self.stack.pop()
                continue
            if r == OK and c not in WS:
                self.ws_run = 0
            return r == OK
        return c in WS and self.ws(c) == OK  # after the value: trailing whitespace only

    def advance(self, text: str) -> bool:
        """Feed ``text``; False if the input is no longer a valid prefix (the state is then undefined)."""
        return all(self._feed(c) for c in text)

    def is_complete(self) -> bool:
        """The input so far is a whole value (a top-level number may still go on)."""
        return all(f.can_end() for f in self.stack)

    def done(self) -> bool:
        """The value is closed: nothing but whitespace may follow."""
        return not self.stack


# ----------------------------------------------------------------------------------------------
# tokens
# ----------------------------------------------------------------------------------------------
