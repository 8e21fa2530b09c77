"""JSON Schema -> compiled :class:`Node` graph, the half of ``format`` that reads the schema.

Covers what pydantic v2 emits for ordinary models, with llama.cpp's ``json-schema-to-grammar``
semantics where JSON Schema leaves a choice to the generator:

* ``type`` (one or a list, ``"null"`` for nullable), ``enum`` / ``const`` of any JSON value (written
  compactly), annotations (``title``, ``description``, ``default``, ``examples``, ``discriminator``,
  ``x-*`` vendor keys, ...) ignored;
* ``$defs`` / ``definitions`` with local ``$ref`` (JSON pointers into the document, recursion
  included; the recogniser's nesting cap bounds it), ``anyOf`` / ``oneOf`` as alternatives (``oneOf``
  as ``anyOf``, as llama.cpp does: pydantic's ``oneOf`` unions are disjoint by their tag), ``allOf``
  with one entry, or several object entries merged (properties and required joined);
* objects: keys in ``properties`` order, any subset that holds the ``required`` ones (and as many
  keys as ``minProperties`` / ``maxProperties`` allow);
  ``additionalProperties`` as a schema (or ``true`` on an object without ``properties``) allows
  extra keys, other than the listed ones, after them (llama.cpp's rule); an object without
  ``properties`` and without ``additionalProperties: false`` is any object;
* arrays: ``items`` (``false`` too), ``prefixItems``, ``minItems`` / ``maxItems``; ``uniqueItems:
  true`` is refused (a character automaton cannot compare elements);
* strings: ``minLength`` / ``maxLength`` (characters after unescaping, a surrogate pair being one),
  ``pattern`` (``engine.contract.json_regex``'s subset), ``format`` ``date``, ``time``, ``date-time``,
  ``uuid`` (other formats are annotations, as in llama.cpp);
* numbers: ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum``, exact for
  integers and for numbers (which then go without an exponent).

Anything else is refused with :class:`SchemaError` naming the keyword and where it is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

from engine.contract.json_regex import FORMATS, Regex, compile_regex

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples",
                         "deprecated", "readOnly", "writeOnly", "discriminator", "contentEncoding",
                         "contentMediaType", "$defs", "definitions"})
OBJECT_KW = frozenset({"properties", "required", "additionalProperties", "minProperties", "maxProperties"})
ARRAY_KW = frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})
STRING_KW = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KW = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
KEYWORDS = (frozenset({"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"})
            | OBJECT_KW | ARRAY_KW | STRING_KW | NUMBER_KW)


class SchemaError(ValueError):
    pass


@dataclass(frozen=True)
class StrSpec:
    """What a constrained string must satisfy (lengths in characters after unescaping)."""

    min_len: int = 0
    max_len: int | None = None
    regex: Regex | None = None


@dataclass(frozen=True)
class Bounds:
    """Numeric bounds; ``lo_closed`` False for an exclusive minimum. Integers use ``ilo``/``ihi``."""

    lo: Fraction | None
    lo_closed: bool
    hi: Fraction | None
    hi_closed: bool

    @property
    def ilo(self) -> int | None:
        if self.lo is None:
            return None
        c = math.ceil(self.lo)
        return c + 1 if (c == self.lo and not self.lo_closed) else c

    @property
    def ihi(self) -> int | None:
        if self.hi is None:
            return None
        f = math.floor(self.hi)
        return f - 1 if (f == self.hi and not self.hi_closed) else f

    def contains(self, v: Fraction) -> bool:
        if self.lo is not None and (v < self.lo or (v == self.lo and not self.lo_closed)):
            return False
        return not (self.hi is not None and (v > self.hi or (v == self.hi and not self.hi_closed)))


class Node:
    """A compiled schema. ``types`` None = any type; ``alts``: alternatives (anyOf) instead of the rest."""

    __slots__ = ("additional", "alts", "bounds", "cands", "items", "literals", "max_items", "max_props", "min_items",
                 "min_props", "names", "prefix", "props", "required", "string", "types")

    def __init__(self, types: frozenset[str] | None = None):
        self.types = types
        self.literals: tuple[str, ...] | None = None  # compact JSON texts (enum / const)
        self.alts: tuple[Node, ...] | None = None
        self.props: tuple[tuple[str, str, Node], ...] = ()  # (name, compact JSON spelling, schema)
        self.names: frozenset[str] = frozenset()
        self.required: frozenset[str] = frozenset()
        self.additional: Node | None = None  # extra keys' values; None: only the listed keys
        self.min_props, self.max_props = 0, None
        self.prefix: tuple[Node, ...] = ()
        self.items: Node | None = None  # None: no items after the prefix
        self.min_items, self.max_items = 0, None
        self.string: StrSpec | None = None
        self.bounds: Bounds | None = None
        self.cands: dict[int, tuple[int, ...]] = {}

    def candidates(self, nxt: int) -> tuple[int, ...]:
        """Indexes of the properties that may come next: in order, skipping no required one."""
        hit = self.cands.get(nxt)
        if hit is None:
            out = []
            for i in range(nxt, len(self.props)):
                out.append(i)
                if self.props[i][0] in self.required:
                    break
            hit = self.cands[nxt] = tuple(out)
        return hit

    def item(self, i: int) -> Node | None:
        return self.prefix[i] if i < len(self.prefix) else self.items


ANY = Node()
ANY.items = ANY
ANY.additional = ANY


def compact(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "?")


class _Compiler:
    def __init__(self, root: Any):
        self.root = root
        self.refs: dict[str, Node] = {}

    def compile(self, s: Any, path: str) -> Node:
        if s is True or s == {}:
            return ANY
        if not isinstance(s, dict):
            raise SchemaError(f"{path}: a schema must be an object, got {compact(s)}")
        for k in s:
            if k not in KEYWORDS and k not in ANNOTATIONS and not k.startswith("x-"):  # x-*: vendor annotations
                raise SchemaError(f'unsupported JSON schema keyword "{k}" at {path}')
        for kw in ("$ref", "anyOf", "oneOf", "allOf"):
            if kw in s:
                return self._composite(kw, s, path)
        if "const" in s or "enum" in s:
            return self._literals(s, path)
        node = Node(self._types(s, path))
        if node.types is None or "object" in node.types:
            self._object(node, s, path)
        if node.types is None or "array" in node.types:
            self._array(node, s, path)
        if node.types is None or "string" in node.types:
            self._string(node, s, path)
        if node.types is None or node.types & {"number", "integer"}:
            self._number(node, s, path)
        return node

    # -- composition -------------------------------------------------------------------------
    def _composite(self, kw: str, s: dict, path: str) -> Node:
        extra = [k for k in s if k != kw and k not in ANNOTATIONS and not k.startswith("x-")]
        if kw == "allOf":
            return self._all_of(s, path)
        if kw == "$ref":
            if extra:  # the target and its siblings both apply: one schema if they share no keyword
                return self.compile(self._intersect(self._deref(s, path), s, kw, path), path)
            return self._ref(s["$ref"], path)
        alts = s[kw]
        if not isinstance(alts, list) or not alts:
            raise SchemaError(f"{path}.{kw} must be a non-empty array")
        if extra:  # {"anyOf": [A, B], "format": ...} is anyOf [A and format, B and format]
            alts = [self._intersect(self._deref(a, path), s, kw, path) for a in alts]
        nodes = [self.compile(a, f"{path}.{kw}[{i}]") for i, a in enumerate(alts)]
        if len(nodes) == 1:
            return nodes[0]
        node = Node()
        node.alts = tuple(nodes)
        return node

    def _all_of(self, s: dict, path: str) -> Node:
        entries = s["allOf"]
        if not isinstance(entries, list) or not entries:
            raise SchemaError(f"{path}.allOf must be a non-empty array")
        rest = {k: v for k, v in s.items() if k != "allOf" and k not in ANNOTATIONS and not k.startswith("x-")}
        if len(entries) == 1 and not rest:  # pydantic's wrapper around a $ref with a default
            return self.compile(entries[0], f"{path}.allOf[0]")
        # Several entries: llama.cpp merges object entries (properties and required joined).
        props: dict[str, Any] = {}
        required: list[str] = []
        for i, e in enumerate(entries + ([rest] if rest else [])):
            e = self._deref(e, f"{path}.allOf[{i}]")
            bad = [k for k in e if k not in ANNOTATIONS and not k.startswith("x-")
                   and k not in ("type", "properties", "required")]
            if bad or e.get("type", "object") != "object":
                raise SchemaError(f'unsupported JSON schema keyword "allOf" at {path} '
                                  "(only a single entry, or object schemas to merge)")
            props.update(e.get("properties") or {})
            required += [r for r in e.get("required") or [] if r not in required]
        return self.compile({"type": "object", "properties": props, "required": required}, path)

    def _intersect(self, target: Any, s: dict, kw: str, path: str) -> Any:
        """``target`` with the keywords next to ``kw`` in ``s`` added (they must not overlap)."""
        siblings = {k: v for k, v in s.items() if k != kw and k not in ANNOTATIONS and not k.startswith("x-")}
        if target is True or target == {}:
            return siblings
        if not isinstance(target, dict):
            raise SchemaError(f"{path}: a schema must be an object, got {compact(target)}")
        clash = [k for k in siblings if k in target or (k in ("anyOf", "oneOf", "allOf", "$ref") and
                                                        any(x in target for x in ("anyOf", "oneOf", "allOf", "$ref")))]
        if clash:
            raise SchemaError(f'unsupported JSON schema keyword "{clash[0]}" next to "{kw}" at {path}')
        merged = {k: v for k, v in target.items() if k not in ("$defs", "definitions")}
        merged.update(siblings)
        return merged

    def _deref(self, s: Any, path: str) -> Any:
        seen = set()
        while isinstance(s, dict) and "$ref" in s:
            ref = s["$ref"]
            if ref in seen:
                raise SchemaError(f"circular $ref {compact(ref)} at {path}")
            seen.add(ref)
            s = self._target(ref, path)
        return s

    def _target(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"unsupported $ref {compact(ref)} at {path} (only local references, #/...)")
        target = self.root
        frag = unquote(ref[1:])
        for part in frag.split("/")[1:] if frag else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(f"$ref {compact(ref)} at {path} does not resolve")
        return target

    def _ref(self, ref: Any, path: str) -> Node:
        if isinstance(ref, str) and ref in self.refs:
            return self.refs[ref]
        target = self._target(ref, path)
        placeholder = Node()
        self.refs[ref] = placeholder
        node = self.compile(target, ref)
        if node is placeholder:
            raise SchemaError(f"circular $ref {compact(ref)} at {path}")
        for slot in Node.__slots__:  # fill in place: recursive references already point here
            setattr(placeholder, slot, getattr(node, slot))
        return placeholder

    # -- values ------------------------------------------------------------------------------
    def _types(self, s: dict, path: str) -> frozenset[str] | None:
        t = s.get("type")
        if t is None:  # inferred from the keywords, so {"properties": ...} is an object schema
            inferred = set()
            for kws, names in ((OBJECT_KW, ("object",)), (ARRAY_KW, ("array",)), (STRING_KW - {"format"}, ("string",)),
                               (NUMBER_KW, ("number",))):
                if any(k in s for k in kws):
                    inferred.update(names)
            return frozenset(inferred) or None
        tl = t if isinstance(t, list) else [t]
        if not tl:
            raise SchemaError(f"{path}.type must not be empty")
        for x in tl:
            if x not in TYPES:
                raise SchemaError(f"{path}.type: unknown type {compact(x)}")
        return frozenset(tl)

    def _literals(self, s: dict, path: str) -> Node:
        vals = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(vals, list) or not vals:
            raise SchemaError(f"{path}.enum must be a non-empty array")
        types = self._types(s, path)
        if types is not None:
            vals = [v for v in vals if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)]
            if not vals:
                raise SchemaError(f"{path}: no enum value has the schema's type")
        node = Node()
        node.literals = tuple(dict.fromkeys(compact(v) for v in vals))
        return node

    def _count(self, s: dict, kw: str, path: str) -> int | None:
        v = s.get(kw)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise SchemaError(f"{path}.{kw} must be a non-negative integer")
        return v

    def _object(self, node: Node, s: dict, path: str) -> None:
        raw = s.get("properties") or {}
        if not isinstance(raw, dict):
            raise SchemaError(f"{path}.properties must be an object")
        req = s.get("required") or []
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise SchemaError(f"{path}.required must be an array of strings")
        props = [(k, self.compile(v, f"{path}.properties.{k}")) for k, v in raw.items()]
        props += [(r, ANY) for r in dict.fromkeys(req) if r not in raw]  # required but not described
        node.props = tuple((k, compact(k), n) for k, n in props)
        node.names = frozenset(k for k, _ in props)
        node.required = frozenset(req)
        ap = s.get("additionalProperties")
        if isinstance(ap, dict):
            node.additional = self.compile(ap, f"{path}.additionalProperties")
        elif ap is True:
            # llama.cpp: true allows extra keys; with listed properties we emit only those (which
            # conforms, and a model gains nothing from inventing keys); without, any object.
            node.additional = None if props else ANY
        elif ap is None:
            node.additional = None if (props or "required" in s) else ANY
        elif ap is not False:
            raise SchemaError(f"{path}.additionalProperties must be a boolean or a schema")
        node.min_props = self._count(s, "minProperties", path) or 0
        node.max_props = self._count(s, "maxProperties", path)
        if node.types == frozenset({"object"}) and (
                (node.max_props is not None and len(node.required) > node.max_props)
                or (node.additional is None and len(props) < node.min_props)):
            raise SchemaError(f"{path}: minProperties/maxProperties leave no object that can conform")

    def _array(self, node: Node, s: dict, path: str) -> None:
        if s.get("uniqueItems") is True:
            raise SchemaError(f'unsupported JSON schema keyword "uniqueItems" at {path} '
                              "(element uniqueness cannot be enforced while generating)")
        prefix = s.get("prefixItems")
        items = s.get("items", True)
        if isinstance(items, list):  # draft-07 tuple form
            prefix, items = items, False
        if prefix is not None:
            if not isinstance(prefix, list):
                raise SchemaError(f"{path}.prefixItems must be an array")
            node.prefix = tuple(self.compile(p, f"{path}.prefixItems[{i}]") for i, p in enumerate(prefix))
        node.items = None if items is False else self.compile(items, f"{path}.items")
        node.min_items = self._count(s, "minItems", path) or 0
        node.max_items = self._count(s, "maxItems", path)
        if node.items is None:
            node.max_items = len(node.prefix) if node.max_items is None else min(node.max_items, len(node.prefix))
        if node.max_items is not None and node.min_items > node.max_items and node.types == frozenset({"array"}):
            raise SchemaError(f"{path}: minItems > maxItems, no array can conform")

    def _string(self, node: Node, s: dict, path: str) -> None:
        lo = self._count(s, "minLength", path) or 0
        hi = self._count(s, "maxLength", path)
        regex = None
        pattern = s.get("pattern")
        fmt = s.get("format")
        if pattern is not None and isinstance(fmt, str) and fmt in FORMATS:
            raise SchemaError(f'unsupported JSON schema keyword "pattern" together with format "{fmt}" at {path}')
        if pattern is not None:
            if not isinstance(pattern, str):
                raise SchemaError(f"{path}.pattern must be a string")
            try:
                regex = compile_regex(pattern)
            except ValueError as e:
                raise SchemaError(f'unsupported JSON schema keyword "pattern" at {path}: {e}') from None
        elif isinstance(fmt, str) and fmt in FORMATS:
            regex = compile_regex(FORMATS[fmt])
        if lo or hi is not None or regex is not None:
            if hi is not None and lo > hi:
                raise SchemaError(f"{path}: minLength > maxLength, no string can conform")
            node.string = StrSpec(lo, hi, regex)

    def _number(self, node: Node, s: dict, path: str) -> None:
        def num(kw: str) -> Fraction | None:
            v = s.get(kw)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SchemaError(f"{path}.{kw} must be a number")
            return Fraction(v)

        lo, xlo, hi, xhi = num("minimum"), num("exclusiveMinimum"), num("maximum"), num("exclusiveMaximum")
        if lo is None and xlo is None and hi is None and xhi is None:
            return
        lo_closed, hi_closed = True, True
        if xlo is not None and (lo is None or xlo >= lo):
            lo, lo_closed = xlo, False
        if xhi is not None and (hi is None or xhi <= hi):
            hi, hi_closed = xhi, False
        b = Bounds(lo, lo_closed, hi, hi_closed)
        integer_only = node.types is not None and "number" not in node.types
        empty = (b.ilo is not None and b.ihi is not None and b.ilo > b.ihi) if integer_only else (
            lo is not None and hi is not None and (lo > hi or (lo == hi and not (lo_closed and hi_closed))))
        if empty:
            raise SchemaError(f"{path}: the bounds leave no number that can conform")
        node.bounds = b


def compile_schema(schema: Any) -> Node:
    return _Compiler(schema).compile(schema, "schema")
