"""JSON Schema ``pattern`` (and the string ``format``s) compiled into a character automaton.

A practical subset of ECMA-262 regular expressions, as llama.cpp's schema converter supports it:
literals and escapes, classes ``[...]`` / ``[^...]`` with ranges, ``\\d \\w \\s`` (and their negations),
``.``, the quantifiers ``? * + {m} {m,} {m,n}`` (lazy forms too: same language), groups ``(...)``,
``(?:...)``, ``(?<name>...)``, alternation and the anchors ``^`` / ``$`` at the ends of the pattern's
top-level alternatives. A side without an anchor matches anywhere, as JSON Schema's ``pattern``
searches the string (llama.cpp refuses unanchored patterns; here they get the ``.*`` they mean).
Backreferences, lookarounds, word boundaries and inline flags cannot be compiled into the automaton
and raise ``ValueError`` (the schema compiler turns it into a refusal naming ``pattern``).

Class shorthands use their ASCII sets when positive (``\\d`` = ``[0-9]``) and the Unicode-wide
complement when negated, so every string produced matches in ECMA, Python and Rust regex engines
alike. The automaton is a Thompson NFA run as a set of states; steps are memoised per (set, char).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STATES = 20000  # a pattern bigger than this (e.g. huge counted repeats) is refused
MAX_REPEAT = 1000

_DIGIT = (("0", "9"),)
_WORD = (("0", "9"), ("A", "Z"), ("_", "_"), ("a", "z"))
_SPACE = ((" ", " "), ("\t", "\r"))  # \t \n \v \f \r
_LINE_ENDS = "\n\r\u2028\u2029"


@dataclass(frozen=True)
class CharSet:
    """Ranges (inclusive) plus shorthand classes; ``negated`` flips the whole set."""

    ranges: tuple[tuple[str, str], ...] = ()
    classes: tuple[str, ...] = ()  # 'd' 'w' 's' 'D' 'W' 'S'
    negated: bool = False

    def matches(self, c: str) -> bool:
        hit = any(lo <= c <= hi for lo, hi in self.ranges) or any(_class(k, c, self.negated) for k in self.classes)
        return hit != self.negated


def _class(k: str, c: str, wide: bool) -> bool:
    """Membership in a shorthand. ``wide``: inside a negated class, so use the Unicode-wide set (its
    complement is then the narrow one). Negated shorthands are the complement of the wide set."""
    if k == "d":
        return c.isdecimal() if wide else "0" <= c <= "9"
    if k == "w":
        return (c.isalnum() or c == "_") if wide else any(lo <= c <= hi for lo, hi in _WORD)
    if k == "s":
        return c.isspace() or c == "\ufeff" if wide else c in " \t\n\r\x0b\x0c"
    return not _class(k.lower(), c, not wide)


DOT = CharSet(ranges=tuple((c, c) for c in _LINE_ENDS), negated=True)
ANY_CHAR = CharSet(negated=True)


# ----------------------------------------------------------------------------------------------
# parsing: pattern -> tree of ('set', CharSet) | ('cat', [..]) | ('alt', [..]) | ('rep', t, m, n)
# ----------------------------------------------------------------------------------------------

_ESC = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"{what} (at offset {self.i} of /{self.p}/)")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        c = self.p[self.i]
        self.i += 1
        return c

    def top(self):
        """Top level: alternatives, each with optional ``^`` / ``$`` at its ends."""
        alts = []
        while True:
            start = self.peek() == "^"
            if start:
                self.i += 1
            seq = self.seq()
            end = False
            if self.peek() == "$":
                self.i += 1
                end = True
            if not start:
                seq = ("cat", [("rep", ("set", ANY_CHAR), 0, None), seq])
            if not end:
                seq = ("cat", [seq, ("rep", ("set", ANY_CHAR), 0, None)])
            alts.append(seq)
            if self.peek() == "|":
                self.i += 1
                continue
            if self.peek() is not None:
                raise self.error("unbalanced ')'" if self.peek() == ")" else "anchors are only supported at the ends")
            return ("alt", alts)

    def alt(self):
        alts = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.seq())
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def seq(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)$":
            c = self.peek()
            if c == "^":
                raise self.error("anchors are only supported at the ends")
            items.append(self.quantified(self.atom()))
        return ("cat", items)

    def atom(self):
        c = self.take()
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?<", self.i) and not self.p.startswith(("?<=", "?<!"), self.i):
                close = self.p.find(">", self.i)
                if close < 0:
                    raise self.error("unterminated group name")
                self.i = close + 1
            elif self.peek() == "?":
                raise self.error("lookarounds and inline flags are not supported")
            inner = self.alt()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.i += 1
            return inner
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            return ("set", DOT)
        if c == "\\":
            return ("set", self.escape(in_class=False))
        if c in "*+?{":
            if c == "{" and not self._counted_ahead():
                return ("set", CharSet(ranges=((c, c),)))
            raise self.error(f"nothing to repeat before '{c}'")
        if c == ")":
            raise self.error("unbalanced ')'")
        return ("set", CharSet(ranges=((c, c),)))

    def _counted_ahead(self) -> bool:
        j = self.p.find("}", self.i)
        body = self.p[self.i:j] if j >= 0 else ""
        return j >= 0 and body != "" and all(ch.isdigit() or ch == "," for ch in body) and body[0] != ","

    def quantified(self, atom):
        while True:
            c = self.peek()
            if c == "*":
                self.i += 1
                atom = ("rep", atom, 0, None)
            elif c == "+":
                self.i += 1
                atom = ("rep", atom, 1, None)
            elif c == "?":
                self.i += 1
                atom = ("rep", atom, 0, 1)
            elif c == "{" and (self.i + 1 < len(self.p)) and self._counted_after_brace():
                close = self.p.index("}", self.i)
                body = self.p[self.i + 1:close]
                self.i = close + 1
                lo_s, _, hi_s = body.partition(",")
                lo = int(lo_s)
                hi = lo if "," not in body else (int(hi_s) if hi_s else None)
                if (hi is not None and hi < lo) or lo > MAX_REPEAT or (hi or 0) > MAX_REPEAT:
                    raise self.error(f"bad or too large repeat {{{body}}}")
                atom = ("rep", atom, lo, hi)
            else:
                return atom
            if self.peek() == "?":  # lazy: same language
                self.i += 1
            if self.peek() in ("*", "+", "?"):
                raise self.error("nested quantifier")

    def _counted_after_brace(self) -> bool:
        save = self.i
        self.i += 1
        ok = self._counted_ahead()
        self.i = save
        return ok

    def escape(self, in_class: bool) -> CharSet:
        if self.peek() is None:
            raise self.error("trailing backslash")
        c = self.take()
        if c in "dwsDWS":
            return CharSet(classes=(c,))
        if c.isdigit() and c != "0":
            raise self.error("backreferences are not supported")
        if c in "bB" and not in_class:
            raise self.error("word boundaries are not supported")
        if c == "b":
            return CharSet(ranges=(("\b", "\b"),))
        if c in "kpP":
            raise self.error(f"\\{c} is not supported")
        if c in _ESC:
            ch = _ESC[c]
        elif c == "x":
            ch = self._hex(2)
        elif c == "u":
            if self.peek() == "{":
                close = self.p.find("}", self.i)
                if close < 0:
                    raise self.error("bad \\u{...}")
                ch = chr(int(self.p[self.i + 1:close], 16))
                self.i = close + 1
            else:
                ch = self._hex(4)
        elif c == "c":
            raise self.error("\\c is not supported")
        else:
            ch = c  # an escaped punctuation character stands for itself
        return CharSet(ranges=((ch, ch),))

    def _hex(self, n: int) -> str:
        h = self.p[self.i:self.i + n]
        if len(h) != n or any(x not in "0123456789abcdefABCDEF" for x in h):
            raise self.error("bad hex escape")
        self.i += n
        return chr(int(h, 16))

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[str, str]] = []
        classes: list[str] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.error("unterminated character class")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self._class_char(classes)
            if lo is None:
                continue
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self._class_char(classes)
                if hi is None or hi < lo:
                    raise self.error("bad range in character class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return CharSet(tuple(ranges), tuple(classes), negated)

    def _class_char(self, classes: list[str]) -> str | None:
        c = self.take()
        if c != "\\":
            return c
        s = self.escape(in_class=True)
        if s.classes:
            classes.extend(s.classes)
            return None
        return s.ranges[0][0]


# ----------------------------------------------------------------------------------------------
# Thompson NFA
# ----------------------------------------------------------------------------------------------


@dataclass
class Regex:
    """A compiled pattern: ``start`` state set, ``step(states, c)``, ``accepts(states)``."""

    sets: list[CharSet | None] = field(default_factory=list)  # per state: its char test, or None (epsilon)
    nexts: list[list[int]] = field(default_factory=list)  # per state: following states
    final: int = -1
    start: frozenset = frozenset()
    _memo: dict = field(default_factory=dict, repr=False)

    def _new(self, cs: CharSet | None = None) -> int:
        if len(self.sets) >= MAX_STATES:
            raise ValueError("pattern too large to compile")
        self.sets.append(cs)
        self.nexts.append([])
        return len(self.sets) - 1

    def _build(self, t) -> tuple[int, int]:
        """Fragment for ``t``: (entry, exit) states, both epsilon states."""
        kind = t[0]
        a = self._new()
        if kind == "set":
            s = self._new(t[1])
            b = self._new()
            self.nexts[a].append(s)
            self.nexts[s].append(b)
            return a, b
        if kind == "cat":
            cur = a
            for sub in t[1]:
                x, y = self._build(sub)
                self.nexts[cur].append(x)
                cur = y
            return a, cur
        if kind == "alt":
            b = self._new()
            for sub in t[1]:
                x, y = self._build(sub)
                self.nexts[a].append(x)
                self.nexts[y].append(b)
            return a, b
        _, sub, lo, hi = t
        cur = a
        for _ in range(lo):
            x, y = self._build(sub)
            self.nexts[cur].append(x)
            cur = y
        if hi is None:
            x, y = self._build(sub)
            self.nexts[cur].append(x)
            self.nexts[y].append(x)  # loop
            b = self._new()
            self.nexts[y].append(b)
            self.nexts[cur].append(b)
            return a, b
        b = self._new()
        for _ in range(hi - lo):
            x, y = self._build(sub)
            self.nexts[cur].append(x)
            self.nexts[cur].append(b)
            cur = y
        self.nexts[cur].append(b)
        return a, b

    def _closure(self, states) -> frozenset:
        out, todo = set(), list(states)
        while todo:
            s = todo.pop()
            if s in out:
                continue
            out.add(s)
            if self.sets[s] is None:
                todo.extend(self.nexts[s])
        # Only char states and the final state matter for stepping and accepting.
        return frozenset(s for s in out if self.sets[s] is not None or s == self.final)

    def step(self, states: frozenset, c: str) -> frozenset:
        key = (states, c)
        hit = self._memo.get(key)
        if hit is None:
            nxt = [n for s in states if (cs := self.sets[s]) is not None and cs.matches(c) for n in self.nexts[s]]
            hit = self._closure(nxt)
            if len(self._memo) < 100_000:
                self._memo[key] = hit
        return hit

    def accepts(self, states: frozenset) -> bool:
        return self.final in states


def compile_regex(pattern: str) -> Regex:
    """Compile a JSON Schema ``pattern``; ``ValueError`` for what the subset does not cover."""
    tree = _Parser(pattern).top()
    r = Regex()
    a, b = r._build(tree)
    r.final = b
    r.start = r._closure([a])
    return r


def _year() -> str:
    return "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"


def _date() -> str:
    """A real calendar date (leap years included): what pydantic's and Python's date parsers accept.
    llama.cpp's rule allows 02-31; a constraint must not produce a string its validator refuses."""
    day31 = "(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
    day30 = "(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    feb = "02-(0[1-9]|1[0-9]|2[0-8])"
    leap = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
    return f"({_year()}-({day31}|{day30}|{feb})|{leap}-02-29)"


_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_HEX = "[0-9a-fA-F]"

#: The string formats enforced (llama.cpp's set); any other ``format`` is an annotation, as there.
FORMATS = {
    "date": f"^{_date()}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_date()}T{_TIME}$",
    "uuid": f"^{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}$",
}
for _v in "12345":
    FORMATS[f"uuid{_v}"] = f"^{_HEX}{{8}}-{_HEX}{{4}}-{_v}{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}$"
