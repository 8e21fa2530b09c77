"""Constrained decoding for Ollama's ``format``, the text layer: the JSON recogniser.

``format: "json"`` constrains the output to one JSON value of any kind (llama.cpp's JSON grammar
allows any value at the root; in practice models answer with an object). ``format: {schema}``
constrains it to JSON conforming to the schema, compiled by ``engine.contract.json_schema`` (what is
supported is listed there; the rest is refused with :class:`SchemaError` naming the keyword).

This module is torch-free so that the server validates a ``format`` before anything is loaded:
:func:`compile_format` and :class:`JsonRecognizer`, a character-level pushdown automaton with
``clone`` / ``advance(text) -> bool`` / ``is_complete`` / ``done``. It is nondeterministic: a *path*
is a stack of frames (one per open value), and alternatives (``anyOf``) fork a path per alternative
at the value's first character, so alternatives that share prefixes (two object shapes, ``string``
and ``null``) are followed at once; paths that fail drop out, identical paths merge.
``engine.sampling.constrain.TokenConstraint`` is the token layer: it filters next-token
distributions to the tokens whose text keeps the recogniser valid.

Limits that keep a weak model from running on forever (llama.cpp's grammars have the first two):
whitespace outside strings is one space or a newline plus at most ``WS_CAP`` spaces/tabs; a digit
run in a number has at most 16 digits; objects and arrays nest at most ``MAX_DEPTH`` deep (which also
bounds recursive ``$ref``s). At most ``MAX_PATHS`` alternatives are followed at once (beyond that the
later ones are dropped: the output still conforms, it just cannot take those shapes).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from engine.contract.json_schema import ANY, Bounds, Node, SchemaError, StrSpec, compact, compile_schema

__all__ = ["ANY", "MAX_DEPTH", "JsonRecognizer", "Node", "SchemaError", "compile_format"]

WS = " \t\n\r"
WS_CAP = 20
MAX_DEPTH = 32  # open objects/arrays at once: keeps a degenerate model from nesting forever
MAX_PATHS = 64
HEX = frozenset("0123456789abcdefABCDEF")
UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def compile_format(fmt: Any) -> Node | None:
    """``format`` as Ollama accepts it: None/""/{} (no constraint), "json", or a schema dict."""
    if fmt is None or fmt == "" or fmt == {}:
        return None
    if fmt == "json":
        return ANY
    if isinstance(fmt, dict):
        return compile_schema(fmt)
    raise SchemaError(f'invalid format: {compact(fmt)}; expected "json" or a JSON schema')


LOOKAHEAD = 8  # levels below the cap within which fits() checks the containers a value cannot do without


def fits(node: Node, depth: int, seen: frozenset = frozenset()) -> bool:
    """Whether a value for ``node`` can be written whole at stack depth ``depth``: beyond ``MAX_DEPTH``
    only scalars and literals can, and near it a container only if the values it cannot do without
    (required properties, the first of ``minItems``) fit one level deeper. A key or an item whose value
    cannot fit is not started: it would be a dead end (nothing could follow it). Far from the cap
    everything fits; the check looks ``LOOKAHEAD`` levels ahead, enough for real schemas' chains of
    required containers."""
    if depth < MAX_DEPTH - LOOKAHEAD or node.literals is not None:
        return True
    if node.alts is not None:
        if id(node) in seen:
            return False
        return any(fits(a, depth, seen | {id(node)}) for a in node.alts)
    t = node.types
    if t is None or not t <= {"object", "array"}:
        return True  # a scalar will do
    if depth > MAX_DEPTH:
        return False
    if "object" in t and all(fits(n, depth + 1) for k, _, n in node.props if k in node.required):
        return True
    return "array" in t and (not node.min_items or fits(node.item(0) or ANY, depth + 1))


# ----------------------------------------------------------------------------------------------
# frames
# ----------------------------------------------------------------------------------------------
# A frame's feed(c, m) returns OK (consumed), BAD (not a valid prefix), POP (the frame is complete
# and c belongs to its parent) or FORK (m.forks holds replacement frames, one per alternative, each
# to be fed c on its own copy of the path). Frames may push children onto m.stack or replace
# themselves. key() identifies a frame's state, so identical paths can merge.

OK, BAD, POP, FORK, CLOSE = 0, 1, 2, 3, 4


class Value:
    """Before a value: skip whitespace, then dispatch on the first character."""

    __slots__ = ("node",)

    def __init__(self, node: Node):
        self.node = node

    def copy(self):
        return self  # stateless

    def key(self):
        return (0, id(self.node))

    def can_end(self) -> bool:
        return False

    def feed(self, c: str, m: _Path) -> int:
        if c in WS:
            return m.ws(c)
        node = self.node
        if node.alts is not None:
            m.forks = [Value(a) for a in node.alts]
            return FORK
        if node.literals is not None:
            m.stack[-1] = Literal(node.literals)
            return m.stack[-1].feed(c, m)
        t = node.types
        depth = len(m.stack)
        if c == "{" and (t is None or "object" in t):
            # Room for the object and for the values it cannot do without.
            if depth > MAX_DEPTH or not all(fits(n, depth + 1) for k, _, n in node.props if k in node.required):
                return BAD
            m.stack[-1] = Object(node)
        elif c == "[" and (t is None or "array" in t):
            if depth > MAX_DEPTH or (node.min_items and not fits(node.item(0) or ANY, depth + 1)):
                return BAD
            m.stack[-1] = Array(node)
        elif c == '"' and (t is None or "string" in t):
            m.stack[-1] = String(node.string)
        elif (c == "-" or "0" <= c <= "9") and (t is None or "number" in t or "integer" in t):
            m.stack[-1] = Number(node.bounds, integer=t is not None and "number" not in t)
            return m.stack[-1].feed(c, m)
        elif c in "tf" and (t is None or "boolean" in t):
            m.stack[-1] = Literal(("true", "false"))
            return m.stack[-1].feed(c, m)
        elif c == "n" and (t is None or "null" in t):
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

    def key(self):
        return (1, id(self.options), self.text)

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
    """Inside a string, after the opening quote. ``esc``: 0 chars, 1 after '\\', 2..5 in \\uXXXX
    (``code`` accumulates); ``hi``: a pending high surrogate (only its low half may follow: JSON
    with a lone surrogate is refused by strict parsers). With a :class:`StrSpec`, ``n`` counts the
    decoded characters and ``rx`` is the pattern automaton's state set; ``text`` collects the decoded
    text when the caller needs it (an object's free key)."""

    __slots__ = ("code", "esc", "hi", "n", "rx", "spec", "text")

    def __init__(self, spec: StrSpec | None = None, esc: int = 0, code: int = 0, hi: int = 0, n: int = 0,
                 rx=None, text: str | None = None):
        self.spec, self.esc, self.code, self.hi, self.n, self.text = spec, esc, code, hi, n, text
        self.rx = rx if rx is not None or spec is None or spec.regex is None else spec.regex.start

    def copy(self):
        return String(self.spec, self.esc, self.code, self.hi, self.n, self.rx, self.text)

    def key(self):
        return (2, id(self.spec), self.esc, self.code, self.hi, self.n, self.rx, self.text)

    def can_end(self) -> bool:
        return False

    def feed(self, c: str, m) -> int:
        r = self.step(c)
        if r == CLOSE:
            m.stack.pop()
            return OK
        return r

    def step(self, c: str) -> int:
        """OK, BAD, or CLOSE (the closing quote)."""
        e = self.esc
        sp = self.spec
        if e == 0:
            if c == '"':
                if self.hi or (sp is not None and (self.n < sp.min_len or (sp.regex is not None
                                                                         and not sp.regex.accepts(self.rx)))):
                    return BAD
                return CLOSE
            if c == "\\":
                if sp is not None and not self.hi and (
                        (sp.max_len is not None and self.n >= sp.max_len)
                        or (sp.regex is not None and not any(sp.regex.step(self.rx, ch) for ch in UNESCAPE.values()))):
                    return BAD  # no escaped character could follow: a dead end
                self.esc = 1
                return OK
            if self.hi or ord(c) < 0x20:
                return BAD
            return self._char(c)
        if e == 1:
            if c == "u":
                if sp is not None and sp.regex is not None:
                    return BAD  # a partial \u escape could have no continuation the pattern allows
                self.esc, self.code = 2, 0
                return OK
            ch = UNESCAPE.get(c)
            if ch is None or self.hi:
                return BAD
            self.esc = 0
            return self._char(ch)
        if c not in HEX:
            return BAD
        code = self.code * 16 + int(c, 16)
        if e < 5:
            if e == 2 and self.hi and c not in "dD":  # the low half must be DC00..DFFF
                return BAD
            if e == 3 and self.hi and c.lower() not in "cdef":
                return BAD
            if e == 3 and not self.hi and self.code == 0xD and c.lower() in "cdef":
                return BAD  # a low half with no high half before it: refused now, not at its last digit
            self.esc, self.code = e + 1, code
            return OK
        self.esc = 0
        if 0xD800 <= code < 0xDC00:
            if self.hi or (sp is not None and sp.max_len is not None and self.n >= sp.max_len):
                return BAD
            self.hi = code
            return OK
        if 0xDC00 <= code < 0xE000:
            if not self.hi:
                return BAD
            ch = chr(0x10000 + ((self.hi - 0xD800) << 10) + (code - 0xDC00))
            self.hi = 0
            return self._char(ch)
        if self.hi:
            return BAD
        return self._char(chr(code))

    def _char(self, ch: str) -> int:
        sp = self.spec
        if sp is not None:
            if sp.max_len is not None and self.n >= sp.max_len:
                return BAD
            if sp.regex is not None:
                rx = sp.regex.step(self.rx, ch)
                if not rx:
                    return BAD
                self.rx = rx
            self.n += 1
        if self.text is not None:
            self.text += ch
        return OK


def _meets(a: Fraction, a_closed: bool, b: Fraction | None, b_closed: bool, bounds: Bounds) -> bool:
    """Whether the interval from ``a`` to ``b`` (None: unbounded above) meets ``bounds``."""
    lo, lo_c = a, a_closed
    if bounds.lo is not None and (bounds.lo > lo or (bounds.lo == lo and not bounds.lo_closed)):
        lo, lo_c = bounds.lo, bounds.lo_closed
    hi, hi_c = b, b_closed
    if bounds.hi is not None and (hi is None or bounds.hi < hi or (bounds.hi == hi and not bounds.hi_closed)):
        hi, hi_c = bounds.hi, bounds.hi_closed
    return hi is None or lo < hi or (lo == hi and lo_c and hi_c)


class Number:
    """JSON number (or integer). States: 0 start, 1 after '-', 2 after leading '0', 3 int digits,
    4 after '.', 5 frac digits, 6 after e/E, 7 after exponent sign, 8 exponent digits. Each digit run
    is capped at ``DIGITS`` (llama.cpp's schema grammar: ``[1-9] [0-9]{0,15}``), so it ends.

    With :class:`Bounds` the text so far is kept and every character must leave a value reachable
    within the bounds (exact: the set of numbers a prefix can still become is a union of intervals,
    checked against the bounds); bounded numbers go without an exponent."""

    __slots__ = ("bounds", "digits", "integer", "state", "text")
    ENDS = frozenset({2, 3, 5, 8})
    DIGITS = 16
    _NEXT = {3: 3, 4: 5, 5: 5, 6: 8, 7: 8, 8: 8}

    def __init__(self, bounds: Bounds | None, integer: bool, state: int = 0, digits: int = 0, text: str = ""):
        self.bounds, self.integer, self.state, self.digits, self.text = bounds, integer, state, digits, text

    def copy(self):
        return Number(self.bounds, self.integer, self.state, self.digits, self.text)

    def key(self):
        return (3, id(self.bounds), self.integer, self.state, self.digits, self.text)

    def can_end(self) -> bool:
        return self.state in self.ENDS and (self.bounds is None or self.bounds.contains(Fraction(self.text)))

    def feed(self, c: str, m) -> int:
        s, digit = self.state, "0" <= c <= "9"
        more = self.digits < self.DIGITS
        exp_ok = not self.integer and self.bounds is None
        nxt = None
        if s == 0 and c == "-":
            nxt = 1
        elif s in (0, 1) and digit:
            nxt = 2 if c == "0" else 3
        elif s in (2, 3) and c == "." and not self.integer:
            nxt = 4
        elif s in (2, 3, 5) and c in "eE" and exp_ok:
            nxt = 6
        elif s == 6 and c in "+-":
            nxt = 7
        elif digit and (s in (4, 6, 7) or (s in (3, 5, 8) and more)):
            nxt = self._NEXT[s]
        if nxt is not None and self.bounds is not None and not self._reachable(self.text + c, nxt):
            nxt = None
        if nxt is not None:
            self.digits = self.digits + 1 if digit and nxt == s else (1 if digit else 0)
            self.state = nxt
            if self.bounds is not None:
                self.text += c
            return OK
        return POP if self.can_end() else BAD

    def _reachable(self, text: str, state: int) -> bool:
        """Some number the text can still become lies within the bounds."""
        b = self.bounds
        neg = text.startswith("-")
        body = text[1:] if neg else text
        if not body:  # just '-'
            return _meets(Fraction(-10 ** self.DIGITS), True, Fraction(0), True, b)  # "-0" is 0
        whole, _, frac = body.partition(".")
        spans: list[tuple[Fraction, Fraction]] = []  # half-open [x, y) for numbers, closed for integers
        if state in (2, 3):
            if whole == "0":
                spans.append((Fraction(0), Fraction(0 if self.integer else 1)))
            else:
                d = int(whole)
                for k in range(self.DIGITS - len(whole) + 1):
                    base = d * 10 ** k
                    spans.append((Fraction(base), Fraction(base + 10 ** k - 1 if self.integer else base + 10 ** k)))
        else:  # in the fraction: the digits so far and at most DIGITS - len(frac) more
            v = Fraction(int(whole + frac), 10 ** len(frac)) if frac else Fraction(int(whole))
            room = self.DIGITS - len(frac)
            spans.append((v, v + Fraction(1, 10 ** len(frac)) if room > 0 else v))
        for x, y in spans:
            if self.integer or x == y:
                lo, lo_c, hi, hi_c = x, True, y, True
            else:
                lo, lo_c, hi, hi_c = x, True, y, False
            if neg:
                lo, lo_c, hi, hi_c = -hi, hi_c, -lo, lo_c
            if _meets(lo, lo_c, hi, hi_c, b):
                return True
        return False


class Array:
    """After '['. state: 0 expect value or ']', 1 after a value (',' or ']'), 2 after ','.
    ``count``: values so far (for prefixItems, minItems, maxItems)."""

    __slots__ = ("count", "node", "state")

    def __init__(self, node: Node, state: int = 0, count: int = 0):
        self.node, self.state, self.count = node, state, count

    def copy(self):
        return Array(self.node, self.state, self.count)

    def key(self):
        return (4, id(self.node), self.state, self.count)

    def can_end(self) -> bool:
        return False

    def _more(self, depth: int) -> bool:
        n = self.node
        item = n.item(self.count)
        return (n.max_items is None or self.count < n.max_items) and item is not None and fits(item, depth + 1)

    def feed(self, c: str, m) -> int:
        if c in WS:
            return m.ws(c)
        if self.state == 1:
            if c == "," and self._more(len(m.stack)):
                self.state = 2
                return OK
            if c == "]" and self.count >= self.node.min_items:
                m.stack.pop()
                return OK
            return BAD
        if c == "]" and self.state == 0:
            if self.count < self.node.min_items:
                return BAD
            m.stack.pop()
            return OK
        if not self._more(len(m.stack)):
            return BAD
        item = self.node.item(self.count)
        self.state, self.count = 1, self.count + 1
        m.stack.append(Value(item))
        return m.stack[-1].feed(c, m)


class Object:
    """After '{'. state: 0 expect key or '}', 1 in key, 2 after key (':'), 3 after a value
    (',' or '}'), 4 after ',' (key). ``nxt``: index of the next listed property allowed; in a key,
    ``key`` is its JSON text so far and ``hits`` the listed properties it still matches, while
    ``extra`` decodes it as an additional key (a free string not among the listed names), when the
    schema allows those here. ``value``: the schema of the value after ':'."""

    __slots__ = ("count", "extra", "hits", "key_text", "node", "nxt", "seen", "state", "value", "xdone")

    def __init__(self, node: Node, state: int = 0, nxt: int = 0, key_text: str = "", hits: tuple = (),
                 extra: String | None = None, seen: frozenset = frozenset(), value: Node | None = None,
                 xdone: bool = False, count: int = 0):
        self.node, self.state, self.nxt, self.key_text, self.hits = node, state, nxt, key_text, hits
        self.extra, self.seen, self.value, self.xdone, self.count = extra, seen, value, xdone, count

    def copy(self):
        return Object(self.node, self.state, self.nxt, self.key_text, self.hits,
                      self.extra.copy() if self.extra is not None else None, self.seen, self.value, self.xdone,
                      self.count)

    def key(self):
        return (5, id(self.node), self.state, self.nxt, self.key_text, self.hits,
                self.extra.key() if self.extra is not None else None, self.seen, id(self.value), self.xdone,
                self.count)

    def _spare(self) -> bool:
        """Room for a key that is not required (maxProperties minus the required keys still due)."""
        mx = self.node.max_props
        return mx is None or self.count + 1 + len(self.node.required - self.seen) <= mx

    def _next_keys(self, depth: int) -> tuple[tuple[int, ...], bool]:
        """(listed properties that may come next, whether an additional key may), for an object at
        stack depth ``depth`` (its values go one deeper)."""
        node = self.node
        hits = () if self.xdone else node.candidates(self.nxt)
        xok = self._extra_ok() and fits(node.additional, depth + 1)
        if depth >= MAX_DEPTH - LOOKAHEAD:
            hits = tuple(i for i in hits if fits(node.props[i][2], depth + 1))
        if self._spare():
            return hits, xok
        return tuple(i for i in hits if node.props[i][0] in node.required), False

    def can_end(self) -> bool:
        return False

    def _extra_ok(self) -> bool:
        """Additional keys come after every required one (llama.cpp: after the listed keys)."""
        return self.node.additional is not None and self.node.required <= self.seen

    def _may_close(self) -> bool:
        return self.node.required <= self.seen and self.count >= self.node.min_props

    def feed(self, c: str, m) -> int:
        s = self.state
        if s == 1:
            return self._key(c)
        if c in WS:
            return m.ws(c)
        if s in (0, 4):
            if c == "}" and s == 0 and self._may_close():
                m.stack.pop()
                return OK
            if c != '"':
                return BAD
            hits, xok = self._next_keys(len(m.stack))
            extra = String(text="") if xok else None
            if not hits and extra is None:
                return BAD
            self.state, self.key_text, self.hits, self.extra = 1, '"', hits, extra
            return OK
        if s == 2:
            if c != ":":
                return BAD
            self.state = 3
            m.stack.append(Value(self.value))
            return OK
        # s == 3: after a value
        if c == ",":
            hits, xok = self._next_keys(len(m.stack))
            if not hits and not xok:
                return BAD
            self.state = 4
            return OK
        if c == "}" and self._may_close():
            m.stack.pop()
            return OK
        return BAD

    def _key(self, c: str) -> int:
        props = self.node.props
        hits = self.hits
        if hits:
            t = self.key_text + c
            hits = tuple(i for i in hits if props[i][1].startswith(t))
            self.key_text, self.hits = t, hits
            for i in hits:
                if props[i][1] == t:  # a listed key, complete
                    self.nxt, self.seen, self.state, self.value = i + 1, self.seen | {props[i][0]}, 2, props[i][2]
                    self.count += 1
                    self.hits, self.extra, self.key_text = (), None, ""
                    return OK
        x = self.extra
        if x is not None:
            r = x.step(c)
            if r == CLOSE and x.text not in self.node.names:
                self.state, self.value, self.xdone = 2, self.node.additional, True
                self.count += 1
                self.hits, self.extra, self.key_text = (), None, ""
                return OK
            if r != OK:
                self.extra = x = None
        return OK if (hits or x is not None) else BAD


# ----------------------------------------------------------------------------------------------
# paths and the recogniser
# ----------------------------------------------------------------------------------------------


class _Path:
    """One way of reading the input: a stack of frames and the whitespace run."""

    __slots__ = ("forks", "stack", "ws_nl", "ws_run")

    def __init__(self, stack: list, ws_run: int = 0, ws_nl: bool = False):
        self.stack, self.ws_run, self.ws_nl = stack, ws_run, ws_nl
        self.forks = None

    def clone(self) -> _Path:
        return _Path([f.copy() for f in self.stack], self.ws_run, self.ws_nl)

    def key(self):
        return (tuple(f.key() for f in self.stack), self.ws_run, self.ws_nl)

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

    def feed(self, c: str, out: list) -> None:
        """Feed one character; append the surviving path(s) (this one and/or forks) to ``out``."""
        stack = self.stack
        while stack:
            r = stack[-1].feed(c, self)
            if r == POP:
                stack.pop()
                continue
            if r == FORK:
                alts, self.forks = self.forks, None
                for f in alts:
                    p = self.clone()
                    p.stack[-1] = f
                    p.feed(c, out)
                return
            if r == OK:
                if c not in WS:
                    self.ws_run = 0
                out.append(self)
            return
        if c in WS and self.ws(c) == OK:  # after the value: trailing whitespace only
            out.append(self)


class JsonRecognizer:
    """Incremental recogniser of one JSON value conforming to a compiled schema."""

    __slots__ = ("paths",)

    def __init__(self, node: Node = ANY, paths: list[_Path] | None = None):
        self.paths = paths if paths is not None else [_Path([Value(node)])]

    def clone(self) -> JsonRecognizer:
        return JsonRecognizer(paths=[p.clone() for p in self.paths])

    def advance(self, text: str) -> bool:
        """Feed ``text``; False if the input is no longer a valid prefix (the state is then undefined)."""
        paths = self.paths
        for c in text:
            if len(paths) == 1:
                out: list[_Path] = []
                paths[0].feed(c, out)
            else:
                out = []
                for p in paths:
                    p.feed(c, out)
            if len(out) > 1:
                out = _merge(out)
            paths = out
            if not paths:
                self.paths = paths
                return False
        self.paths = paths
        return True

    def is_complete(self) -> bool:
        """The input so far is a whole value (a top-level number may still go on)."""
        return any(all(f.can_end() for f in p.stack) for p in self.paths)

    def done(self) -> bool:
        """The value is closed: nothing but whitespace may follow."""
        return bool(self.paths) and all(not p.stack for p in self.paths)


def _merge(paths: list[_Path]) -> list[_Path]:
    """Drop duplicate paths (alternatives that reached the same state) and keep at most MAX_PATHS."""
    seen = set()
    out = []
    for p in paths:
        k = p.key()
        if k not in seen:
            seen.add(k)
            out.append(p)
            if len(out) == MAX_PATHS:
                break
    return out
