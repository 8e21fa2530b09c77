"""Full JSON schemas for `format` (engine.contract.json_schema, json_regex, json_grammar): what pydantic v2
emits for ordinary models. Property-style: random walks through the recogniser (every character drawn
from what it allows) must produce documents pydantic's validator accepts, and valid documents built by
pydantic must be accepted, compact or indented."""

from __future__ import annotations

import enum
import json
import random
import zlib
from typing import Literal, Optional, Union
from uuid import UUID

import pytest
from pydantic import BaseModel, Field, TypeAdapter

from engine.contract.json_grammar import MAX_PATHS, JsonRecognizer, SchemaError, compile_format
from engine.contract.json_regex import compile_regex


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Item(BaseModel):
    name: str = Field(min_length=2, max_length=8)
    qty: int = Field(ge=1, le=250)
    price: float = Field(gt=0, le=1000)


class Address(BaseModel):
    street: str = Field(max_length=10)
    zip: Optional[str] = Field(default=None, pattern=r"^\d{5}$")


class Person(BaseModel):
    name: str = Field(min_length=2, max_length=10)
    nick: Optional[str] = Field(default=None, max_length=6)
    age: int = Field(ge=0, le=130)
    kind: Literal["a", "b"]
    color: Color
    address: Address
    items: list[Item] = Field(max_length=3)
    scores: dict[str, int]
    tags: tuple[int, bool]


class Tree(BaseModel):
    value: int = Field(ge=-5, lt=5)
    children: list["Tree"] = Field(default=[], max_length=2)


class Cat(BaseModel):
    pet: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    pet: Literal["dog"]
    good: bool


class Owner(BaseModel):
    animal: Union[Cat, Dog] = Field(discriminator="pet")
    other: Union[Cat, Dog, None] = None
    code: Optional[UUID] = None
    when: Optional[str] = Field(default=None, json_schema_extra={"format": "date"})
    sku: str = Field(pattern=r"^[A-Z]{2}-\d{2,4}(x|yz)?$")
    ratio: float = Field(ge=-1.5, lt=2.25)
    odd: Union[int, str]


MODELS = [Person, Tree, Owner, Item, Address]

# Characters the walk draws from: JSON's structure, digits, letters, escapes, a few non-ASCII.
ALPHABET = (list('{}[]",:- \n0123456789.eE+') + [chr(c) for c in range(ord("a"), ord("z") + 1)]
            + list("ABXYZ\\/_éß😀\t") + ["\u2028"])
CLOSERS = set('"}],')


def walk(schema, rng: random.Random, limit: int = 4000) -> str | None:
    """A random document the recogniser allows (closers favoured so values end), or None."""
    r = JsonRecognizer(compile_format(schema))
    out = []
    for _ in range(limit):
        if r.done():
            return "".join(out)
        ok = [c for c in ALPHABET if r.clone().advance(c)]
        if not ok:
            assert r.is_complete(), f"dead end after {''.join(out)!r}"
            return "".join(out)
        if r.is_complete() and rng.random() < 0.3:
            return "".join(out)
        closers = [c for c in ok if c in CLOSERS]
        c = rng.choice(closers if closers and rng.random() < 0.35 else ok)
        assert r.advance(c)
        out.append(c)
    return None


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_random_walks_validate_with_pydantic(model):
    schema = model.model_json_schema()
    rng = random.Random(zlib.crc32(model.__name__.encode()))  # hash() of a str changes per process
    finished = 0
    for _ in range(60):
        doc = walk(schema, rng)
        if doc is None:
            continue
        finished += 1
        model.model_validate_json(doc)  # raises on any violation
    assert finished >= 40


def accepted(schema, text: str) -> bool:
    r = JsonRecognizer(compile_format(schema))
    return r.advance(text) and r.is_complete()


def valid_documents():
    yield Person, Person(name="Al", age=3, kind="a", color="red", address={"street": "x", "zip": "12345"},
                         items=[{"name": "ab", "qty": 3, "price": 1.5}], scores={"x": 1, "y\"": -2}, tags=(1, True))
    yield Person, Person(name="Bob", nick="b", age=130, kind="b", color="blue", address={"street": "s"},
                         items=[], scores={}, tags=(-7, False))
    yield Tree, Tree(value=1, children=[Tree(value=2, children=[Tree(value=-5)]), Tree(value=4)])
    yield Owner, Owner(animal={"pet": "cat", "lives": 9}, sku="AB-12x", ratio=-1.5, odd="z",
                       code="123e4567-e89b-12d3-a456-426614174000", when="2024-02-29")
    yield Owner, Owner(animal={"pet": "dog", "good": True}, other={"pet": "cat", "lives": 1}, sku="ZZ-1234",
                       ratio=2.2, odd=-12)


@pytest.mark.parametrize("model,value", list(valid_documents()))
def test_valid_documents_are_accepted(model, value):
    schema = model.model_json_schema()
    compact = value.model_dump_json(exclude_none=False)
    assert accepted(schema, compact), compact
    assert accepted(schema, json.dumps(json.loads(compact), indent=2))
    assert accepted(schema, json.dumps(json.loads(compact), ensure_ascii=True))


def test_optional_properties_any_subset_in_order():
    schema = Owner.model_json_schema()
    base = {"animal": {"pet": "dog", "good": False}, "sku": "AB-12", "ratio": 0, "odd": 1}
    assert accepted(schema, json.dumps(base))
    assert not accepted(schema, json.dumps({"sku": "AB-12", **base}))  # properties order
    assert not accepted(schema, json.dumps({k: v for k, v in base.items() if k != "sku"}))  # required


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"abc"', '"\\u00e9\\n"', '"😀x"',
                                                         '"\\ud83d\\ude00x"'], ['"a"', '"abcd"', '""']),
    ({"type": "integer", "minimum": -12, "maximum": 105}, ["-12", "0", "-0", "105", "99", "7"],
     ["-13", "106", "1000", "-120", "1.0"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, ["1", "9"], ["0", "10", "-1"]),
    ({"type": "integer", "minimum": 1000}, ["1000", "9999999"], ["999", "0", "-1"]),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 1}, ["0.5", "0.75", "0.999"], ["0.4", "1", "1.0", "5e-1"]),
    ({"type": "number", "exclusiveMinimum": -2}, ["-1.99", "0", "12.5"], ["-2", "-2.0", "-3"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, ["[1, 2]", "[1,2,3]"],
     ["[]", "[1]", "[1,2,3,4]"]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "null"}], "items": False}, ['["a", null]', '["a"]'],
     ['[null]', '["a", null, 1]']),
    ({"type": "string", "pattern": "^(ab|cd)+$"}, ['"abcd"', '"ab"'], ['""', '"abc"', '"ba"']),
    ({"type": "string", "pattern": "[0-9]"}, ['"x1y"', '"5"'], ['"xy"']),
    ({"type": "string", "format": "date-time"}, ['"2024-01-05T12:00:00Z"', '"2024-01-05T23:59:59.5+02:00"'],
     ['"2024-01-05"', '"2024-02-30T12:00:00Z"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567"']),
    ({"type": "string", "format": "email"}, ['"anything"'], []),  # an annotation, as in llama.cpp
    ({"type": "integer", "x-order": 3, "anyOf": [{"maximum": 2}], "x-ui": {}}, ["2"], ["3"]),  # x-*: annotations
    ({"type": ["string", "null"], "maxLength": 1}, ['"a"', "null"], ['"ab"', "1"]),
    ({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}}, "required": ["b"]}]},
     ['{"a": 1}', '{"a": "x", "b": null}', '{"b": null}'], ['{"a": 1, "b": null}', '{"a": "x"}', "{}"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}},
     ['{"a": 1, "x": true, "y": false}', '{"z": true}', "{}"], ['{"x": true, "a": 1}', '{"a": 1, "a": true}', '{"x": 1}']),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
     ['{"a": 1}', '{"a": 1, "b": 2}'], ["{}", '{"a": 1, "b": 2, "c": 3}']),
    ({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}},
      "required": ["c"], "maxProperties": 2}, ['{"a": null, "c": null}', '{"c": null}'], ['{"a": null, "b": null}']),
    ({"const": {"k": [1, None]}}, ['{"k":[1,null]}'], ['{"k": [1, null]}', "{}"]),
    ({"enum": ["x", 1.5, None, True]}, ['"x"', "1.5", "null", "true"], ["false", '"y"']),
    ({"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"type": "integer", "maximum": 3}}}, ["3"], ["4"]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}}]}, ['{"a": 1, "b": "x"}', '{"a": 1}'], ['{"b": "x"}']),
    ({"definitions": {"N": {"type": ["integer", "array"], "items": {"$ref": "#/definitions/N"}}}, "$ref": "#/definitions/N"},
     ["[1, [2, [[]]]]", "3"], ['["x"]']),
])
def test_keywords(schema, good, bad):
    for text in good:
        assert accepted(schema, text), (schema, text)
    for text in bad:
        assert not accepted(schema, text), (schema, text)


def test_lone_surrogates_are_refused():
    assert not accepted("json", '"\\ud83d"') and not accepted("json", '"\\ude00"')
    assert not accepted("json", '"\\ud83dx"') and accepted("json", '"\\ud83d\\ude00"')
    # A low half with no high half is refused at its second digit: accepting the prefix would leave the
    # recogniser with no way on (a dead end a model could walk into).
    r = JsonRecognizer(compile_format("json"))
    assert r.clone().advance('"\\ud8') and not r.clone().advance('"\\udc') and not r.clone().advance('"\\uDF')


def test_recursion_is_bounded_by_the_nesting_cap():
    from engine.contract.json_grammar import MAX_DEPTH

    schema = Tree.model_json_schema()
    r = JsonRecognizer(compile_format(schema))
    deep = '{"value": 1, "children": [' * (MAX_DEPTH // 2)
    assert r.advance(deep) and not r.clone().advance('{"value": 1, "children": [')


def test_many_alternatives_stay_bounded():
    schema = {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "number"}, {"enum": [1, 2, 3]}]}}
    r = JsonRecognizer(compile_format(schema))
    assert r.advance("[" + ", ".join(["1"] * 50))
    assert len(r.paths) <= 3  # identical paths merged after every item
    assert r.advance("]") and r.done()
    assert MAX_PATHS >= 3


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "pattern": "(a)\\1"}, "pattern"),
    ({"type": "string", "pattern": "a(?=b)"}, "pattern"),
    ({"type": "string", "pattern": "\\bword"}, "pattern"),
    ({"type": "number", "multipleOf": 2}, "multipleOf"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "patternProperties": {"a": {}}}, "patternProperties"),
    ({"type": "object", "properties": {"a": {}}, "required": ["a"], "maxProperties": 0}, "maxProperties"),
    ({"if": {}, "then": {}}, "if"),
    ({"anyOf": [{"type": "string"}], "type": "string"}, "type"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"$ref": "#/$defs/Missing"}, "does not resolve"),
    ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}, "circular"),
])
def test_unenforceable_keywords_are_refused_by_name(schema, keyword):
    with pytest.raises(SchemaError) as e:
        compile_format(schema)
    assert keyword in str(e.value)


def test_regex_subset():
    def match(p, s):
        r = compile_regex(p)
        st = r.start
        for c in s:
            st = r.step(st, c)
            if not st:
                return False
        return r.accepts(st)

    assert match(r"^\d{3}-[a-f]{1,2}$", "123-ab") and not match(r"^\d{3}-[a-f]{1,2}$", "123-abc")
    assert match(r"^(?:x|y)+z?$", "xyx") and match(r"^(?<n>a)b$", "ab") and not match(r"^.$", "\n")
    assert match(r"^[^\s]+$", "ab") and not match(r"^[^\s]+$", "a b") and match(r"^\w\W$", "a-")
    assert match("abc", "xxabcxx") and not match("^abc", "xabc") and not match("abc$", "abcx")
    assert match(r"^a{2,}$", "aaaa") and not match(r"^a{2,}$", "a") and match(r"^a*?b+?$", "aab")
    assert match(r"^\u00e9\x41\.$", "éA.") and match(r"^[\]\-]+$", "]-")


def test_pydantic_json_schema_speed():
    """A 50-property model: checking 40 candidate tokens per step over a whole document stays cheap."""
    import time

    from pydantic import create_model

    fields = {f"field_{i}": ((Optional[int] if i % 3 else str), None if i % 3 else ...) for i in range(50)}
    big = create_model("Big", **fields)
    schema = big.model_json_schema()
    doc = big(**{f"field_{i}": (i if i % 3 else "v") for i in range(50)}).model_dump_json()
    r = JsonRecognizer(compile_format(schema))
    pieces = [doc[i:i + 3] for i in range(0, len(doc), 3)]
    t0 = time.perf_counter()
    for p in pieces:
        for _ in range(40):  # 40 candidates checked per step
            r.clone().advance(p)
        assert r.advance(p)
    per_step = (time.perf_counter() - t0) / len(pieces)
    assert r.done()
    assert per_step < 0.05, f"{per_step * 1000:.1f} ms per step"


def test_type_adapter_schemas():
    for tp, good in [(list[Optional[int]], "[1, null]"), (dict[str, list[str]], '{"a": ["b"]}'),
                     (Union[int, list[int]], "[1]")]:
        schema = TypeAdapter(tp).json_schema()
        assert accepted(schema, good)


def test_no_dead_end_at_the_nesting_cap():
    """At the cap a key or item whose schema needs a container is not started (nothing could follow it)."""
    from engine.contract.json_grammar import MAX_DEPTH

    node = {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#"}}, "n": {"type": "null"}}}
    r = JsonRecognizer(compile_format(node))
    assert r.advance('{"c": [' * (MAX_DEPTH // 2))  # 32 open containers
    assert not r.clone().advance("{")  # no room for another object
    assert r.advance("]}")
    nested = {"type": "object", "properties": {"o": {"$ref": "#"}, "n": {"type": "null"}}}
    r = JsonRecognizer(compile_format(nested))
    assert r.advance('{"o": ' * (MAX_DEPTH - 1) + "{")  # the innermost object sits at the cap
    assert not r.clone().advance('"o"') and r.clone().advance('"n": null}')
    # Near the cap a key is not started when its value needs more levels than are left.
    chain = {"$defs": {"W": {"type": "object", "properties": {"a": {"type": "array", "minItems": 1,
                                                                    "items": {"type": "array"}}}, "required": ["a"]}},
             "type": "object", "properties": {"o": {"$ref": "#"}, "w": {"$ref": "#/$defs/W"}}}
    r = JsonRecognizer(compile_format(chain))
    assert r.advance('{"o": ' * (MAX_DEPTH - 3) + "{")  # object at 30: w at 31, a at 32, its item at 33
    assert not r.clone().advance('"w"') and r.clone().advance("}")
    r = JsonRecognizer(compile_format(chain))
    assert r.advance('{"o": ' * (MAX_DEPTH - 4) + '{"w": {"a": [[]]}}')  # one level more: fine
    rng = random.Random(5)
    for _ in range(10):
        doc = walk(Tree.model_json_schema(), rng, limit=20000)
        if doc is not None:
            Tree.model_validate_json(doc)
