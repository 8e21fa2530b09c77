"""Constrained decoding for `format` (engine.contract.json_grammar, engine.sampling.constrain): the JSON recogniser, the token filter, and
end to end with a random tiny model, whose output must still parse."""

from __future__ import annotations

import json

import pytest
import torch

from engine.contract.options import Options
from engine.contract.protocol import (
    EngineError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
)
from engine.sampling.constrain import TokenConstraint, TokenPieces
from engine.sampling.sampler import Distribution
from engine.contract.json_grammar import JsonRecognizer, SchemaError, compile_format

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def feed(text: str, fmt="json") -> JsonRecognizer | None:
    r = JsonRecognizer(compile_format(fmt))
    return r if r.advance(text) else None


def complete(text: str, fmt="json") -> bool:
    r = feed(text, fmt)
    return r is not None and r.is_complete()


@pytest.mark.parametrize("text", [
    '{"a": [1, -2.5e+3, 0, 0.25, 1E-2, true, false, null], "b": {"c": {}}, "d": []}',
    '"tab\\t quote\\" slash\\/ back\\\\ \\u00e9\\uD83D\\ude00 é 😀"',
    '[[[]], [{}], [[1], [2, [3]]]]',
    '{\n  "a": 1,\n\t"b": 2\n}',
    "-0", "12", "-12.5e10", "0.0", "true", "null",
])
def test_valid_documents_are_complete(text):
    assert complete(text), text
    json.loads(text)


@pytest.mark.parametrize("text", [
    "01", "--1", "1..", "1e+-", ".5", "+1", "1.e3", "trux", "nulls", "True",
    '"\\x"', '"\\u12G4"', '"a\nb"', "[1,]", "[,1]", '{"a":1,}', "{,}", '{"a" 1}', "{a:1}", "{'a':1}",
    '[1 2]', '{"a":1 "b":2}', "}", "]", "[1]]", "{\r}", "[  1]", "x",
])
def test_invalid_prefixes_are_refused(text):
    assert feed(text) is None, text


@pytest.mark.parametrize("text", ['{"a": [1, {"b": "x', '"abc\\u00', "[", "-1.5e", "-", "1.", "1e+", '{"k"', "tr", "[\n\t\t"])
def test_valid_prefixes_are_accepted_but_incomplete(text):
    r = feed(text)
    assert r is not None and not r.is_complete() and not r.done()


def test_number_completion_and_done():
    r = feed("12")
    assert r.is_complete() and not r.done()  # a top-level number may go on
    assert r.advance(" ") and r.done()
    r = feed('{"a":1}')
    assert r.done() and r.advance("\n") and not r.clone().advance("x")
    assert feed("true").done()  # nothing can extend a literal


def test_digit_runs_and_whitespace_are_capped():
    assert feed("1" * 16) and not feed("1" * 17)
    assert feed("1." + "5" * 16) and not feed("1." + "5" * 17)
    assert feed("[\n" + " " * 20) and not feed("[\n" + " " * 21)
    assert not feed("[  ")  # one space, or a newline and indentation, as llama.cpp's grammar


def test_clone_is_independent():
    r = feed('{"a": [1')
    c = r.clone()
    assert c.advance("]}") and c.done()
    assert not r.done() and r.advance(", 2]}") and r.done()


def test_schema_object_required_and_order():
    assert complete('{"name": "Bo", "age": 3}', PERSON)
    assert complete('{"name":"\\u0042o","age":-3}', PERSON)
    assert feed('{"age": 3', PERSON) is None  # properties come in the schema's order
    assert feed('{"name": "Bo"}', PERSON) is None  # age is required
    assert feed('{"name": "Bo", "age": 3.5', PERSON) is None  # integer
    assert feed('{"name": 1', PERSON) is None  # string
    assert feed('{"name": "Bo", "age": 3, "x"', PERSON) is None  # only listed properties
    assert feed('{"nick"', PERSON) is None
    assert feed('{"na', PERSON) is not None


def test_schema_optional_properties_may_be_skipped():
    schema = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "boolean"},
                                               "c": {"type": "number"}}, "required": ["c"]}
    for text in ['{"c": 1}', '{"a": null, "c": 1.5}', '{"b": true, "c": 0}', '{"a": null, "b": false, "c": 2}']:
        assert complete(text, schema), text
    assert feed("{}", schema) is None and feed('{"c": 1, "a"', schema) is None


def test_schema_enum_const_items_and_type_lists():
    color = {"enum": ["red", "green", 3, None]}
    assert complete('"red"', color) and complete("3", color) and complete("null", color)
    assert feed('"blue"', color) is None and feed("4", color) is None
    assert complete('"x"', {"const": "x"}) and feed('"y"', {"const": "x"}) is None
    arr = {"type": "array", "items": {"type": ["integer", "null"]}}
    assert complete("[1, null, 3]", arr) and complete("[]", arr)
    assert feed("[1.5", arr) is None and feed('["a"', arr) is None and feed("{", arr) is None
    assert complete('{"any": [1, {"x": null}]}', {"type": "object"})  # no properties: any object
    assert complete("{}", {"type": "object", "additionalProperties": False})
    assert feed('{"k"', {"type": "object", "additionalProperties": False}) is None
    assert complete('"x"', {"title": "T", "description": "d", "type": "string"})  # annotations ignored


@pytest.mark.parametrize("fmt,message", [
    ({"type": "string", "pattern": "(a)\\1"}, 'unsupported JSON schema keyword "pattern" at schema'),
    ({"type": "object", "properties": {"a": {"anyOf": []}}}, "schema.properties.a.anyOf must be a non-empty array"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
     'unsupported JSON schema keyword "uniqueItems" at schema.properties.a'),
    ({"type": "date"}, "unknown type"),
    ("xml", 'invalid format: "xml"'),
    (5, "invalid format: 5"),
])
def test_unsupported_schemas_are_refused(fmt, message):
    with pytest.raises(SchemaError) as e:
        compile_format(fmt)
    assert message in str(e.value)


def test_no_format():
    assert compile_format(None) is None and compile_format("") is None and compile_format({}) is None


# ----------------------------------------------------------------------------------------------
# the token filter
# ----------------------------------------------------------------------------------------------


class FakeTokenizer:
    def __init__(self, pieces: list[bytes], control=()):
        self.pieces, self.control = pieces, set(control)

    def token_to_piece(self, i: int) -> bytes:
        return self.pieces[i]

    def is_control(self, i: int) -> bool:
        return i in self.control


PIECES = [b"{", b"}", b'"', b"a", b"hello", b"\xc3", b"", b"<eos>", b"1", b" ", b"]"]
EOS = 7


def dist(ids: list[int], probs: list[float], logits: list[float] | None = None, greedy=False) -> Distribution:
    order = sorted(range(len(ids)), key=lambda j: ids[j])
    raw = torch.tensor([logits or [0.0] * len(PIECES)])
    return Distribution(torch.tensor([[ids[j] for j in order]]), torch.tensor([[probs[j] for j in order]]),
                        raw, len(PIECES), greedy=greedy)


def test_filter_keeps_valid_candidates_renormalised():
    c = TokenConstraint(compile_format("json"), TokenPieces(FakeTokenizer(PIECES, {EOS})), {EOS})
    d = c.filter(dist([0, 3, 4, 5, 6, 7, 8], [0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.2]))
    kept = d.cand_probs[0] > 0  # rows keep their width; disallowed candidates get probability 0
    assert d.cand_ids[0][kept].tolist() == [0, 8]  # '{' and '1'; not text, partial UTF-8, empty, or EOS
    assert torch.allclose(d.cand_probs[0][kept], torch.tensor([1 / 3, 2 / 3]))
    assert torch.allclose(d.probs[0, [0, 8]], torch.tensor([1 / 3, 2 / 3])) and abs(float(d.probs[0].sum()) - 1) < 1e-6
    c.advance_token(8)  # "1": complete, so EOS is allowed now
    d = c.filter(dist([7, 3], [0.5, 0.5]))
    assert d.cand_ids[0][d.cand_probs[0] > 0].tolist() == [7]


def test_filter_falls_back_to_the_best_valid_token_by_raw_logit():
    c = TokenConstraint(compile_format("json"), TokenPieces(FakeTokenizer(PIECES, {EOS})), {EOS})
    logits = [0.0] * len(PIECES)
    logits[3], logits[2], logits[0] = 9.0, 5.0, 4.0  # 'a' (invalid) > '"' > '{'
    d = c.filter(dist([3], [1.0], logits, greedy=True))
    assert d.cand_ids[0].tolist() == [2] and d.cand_probs[0].tolist() == [1.0] and d.greedy
    c.advance_token(2)
    assert not c.done()
    c.advance_token(10)  # inside a string ']' is text
    c2 = TokenConstraint(compile_format("json"), TokenPieces(FakeTokenizer(PIECES, {EOS})), {EOS})
    with pytest.raises(ValueError):
        c2.advance_token(10)  # a value cannot start with ']'


# ----------------------------------------------------------------------------------------------
# end to end with a random tiny model
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine.runtime import ModelRuntime
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("constrain") / "tiny.gguf", TinySpec(arch="qwen2", seed=1))
    e = ModelRuntime.load(LoadSpec(model_path=str(path)))
    yield e
    e.close()


def run(engine, fmt, options, prompt="Reply in JSON:") -> tuple[str, GenerateResult]:
    parts, result = [], None
    for item in engine.generate(GenerateRequest(prompt=prompt, options=Options.from_map(options), format=fmt)):
        if isinstance(item, GenerateResult):
            result = item
        else:
            parts.append(item.text)
    return "".join(parts), result


OPTIONS = [{"temperature": 0, "num_predict": 200},
           {"temperature": 0.9, "seed": 42, "num_predict": 200},
           {"temperature": 1.5, "seed": 7, "top_k": 100, "num_predict": 200}]


@pytest.mark.parametrize("options", OPTIONS)
def test_json_mode_output_parses(engine, options):
    for prompt in ("Reply in JSON:", "List three colours as a JSON array:"):
        text, result = run(engine, "json", options, prompt)
        json.loads(text)
        # no DRAFT: the suffix drafter (drafts from the earlier answers, cut where the format refuses them)
        assert result.done_reason == "stop" and result.speculation.drafter == "suffix"


@pytest.mark.parametrize("options", OPTIONS)
def test_schema_output_parses_and_validates(engine, options):
    text, result = run(engine, PERSON, options)
    out = json.loads(text)
    assert list(out) == ["name", "age"] and isinstance(out["name"], str) and type(out["age"]) is int
    assert result.done_reason == "stop"
    arr = {"type": "array", "items": {"enum": ["red", "green", "blue"]}}
    text, _ = run(engine, arr, options)
    assert all(x in ("red", "green", "blue") for x in json.loads(text))


def test_same_seed_same_constrained_output(engine):
    a, _ = run(engine, PERSON, OPTIONS[1])
    b, _ = run(engine, PERSON, OPTIONS[1])
    assert a == b


def test_engine_refuses_a_bad_schema(engine):
    with pytest.raises(EngineError) as e:
        run(engine, {"type": "array", "uniqueItems": True}, OPTIONS[0])
    assert e.value.status == 400 and "uniqueItems" in str(e.value)


def test_nesting_is_capped():
    from engine.contract.json_grammar import MAX_DEPTH

    assert feed("[" * MAX_DEPTH) is not None and feed("[" * (MAX_DEPTH + 1)) is None
