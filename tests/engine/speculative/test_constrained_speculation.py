"""Constrained decoding (`format`) with speculation, through the real engine on tiny random GGUFs.

Greedy constrained output with speculation equals greedy constrained output without it, token for
token, with every drafter kind (a draft model that is the target itself, an unrelated draft model, the
n-gram drafter, an MTP head); sampled constrained output always validates; acceptance is reported."""

from __future__ import annotations

import json
from typing import Optional

import pytest
from pydantic import BaseModel, Field

from tests.engine.speculative.test_speculation import generate, load_engine, write_model

# draft_copy is on by default, so a request drafting with the model reports the model with its copy cursor
REPORTED_DRAFTER = {"none": "none", "model": "model+suffix", "ngram": "ngram"}


class Pet(BaseModel):
    kind: str = Field(max_length=6)
    age: int = Field(ge=0, le=30)


class Person(BaseModel):
    name: str = Field(min_length=8, max_length=16)
    nick: Optional[str] = Field(default=None, max_length=5)
    pets: list[Pet] = Field(min_length=1, max_length=2)
    score: float = Field(ge=0, lt=10)


# Long enough outputs on a random model: a drafter has something to draft.
LONG = {"type": "object", "properties": {"a": {"type": "string", "minLength": 20, "maxLength": 30},
                                         "b": {"type": "array", "items": {"type": "integer"}, "minItems": 4}},
        "required": ["a", "b"]}
SCHEMAS = {"long": LONG, "person": Person.model_json_schema()}
GREEDY = dict(temperature=0, num_predict=250)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cspec")
    return {"target": write_model(d, "target", 0), "self": write_model(d, "self", 0),
            "random": write_model(d, "random", 3), "mtp": write_model(d, "mtp", 0, mtp="random")}


@pytest.fixture(scope="module")
def engines(paths):
    return {"self": load_engine(paths["target"], paths["self"]), "random": load_engine(paths["target"], paths["random"]),
            "mtp": load_engine(paths["mtp"])}


def conforms(name: str, text: str) -> None:
    out = json.loads(text)
    if name == "long":
        assert 20 <= len(out["a"]) <= 30 and len(out["b"]) >= 4 and all(type(x) is int for x in out["b"])
    if name == "person":
        Person.model_validate_json(text)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_greedy_constrained_speculation_equals_plain(engines, name):
    fmt = SCHEMAS[name]
    plain = generate(engines["self"], request={"format": fmt}, **GREEDY, drafter="none")
    conforms(name, plain.text)
    assert plain.result.done_reason == "stop" and plain.spec.drafter == "none"
    cases = [("self", "model"), ("random", "model"), ("self", "ngram")]
    for engine, drafter in cases:
        run = generate(engines[engine], request={"format": fmt}, **GREEDY, drafter=drafter,
                       draft_num_predict=4, draft_schedule="fixed")
        assert run.tokens == plain.tokens, (engine, drafter)
        # draft_copy is on by default: the model's rounds share the request with copy rounds
        assert run.spec.drafter == REPORTED_DRAFTER[drafter]
        assert run.result.done_reason == "stop"
        assert run.spec.draft_rounds > 0 and run.spec.draft_n > 0, (engine, drafter)  # drafts survived the cut
    mtp_plain = generate(engines["mtp"], request={"format": fmt}, **GREEDY, drafter="none")
    mtp = generate(engines["mtp"], request={"format": fmt}, **GREEDY, drafter="mtp", draft_num_predict=4,
                   draft_schedule="fixed")
    assert mtp.tokens == mtp_plain.tokens and mtp.spec.drafter == "mtp+suffix"


def test_a_perfect_drafter_gets_drafts_accepted_under_the_constraint(engines):
    """The target itself as drafter: its unconstrained drafts are cut where the schema disagrees, and
    what survives the cut is accepted (acceptance reported, > 0)."""
    run = generate(engines["self"], request={"format": SCHEMAS["person"]}, **GREEDY, drafter="model",
                   draft_num_predict=4, draft_schedule="fixed")
    assert run.spec.draft_n_accepted > 0
    assert 0 < run.spec.acceptance_rate <= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("engine,drafter", [("self", "model"), ("random", "model"), ("self", "ngram")])
def test_sampled_constrained_speculation_conforms(engines, engine, drafter, seed):
    for name, fmt in SCHEMAS.items():
        # a fixed depth and no drafts from earlier outputs: the seed then fixes the sample (the adaptive depth
        # follows the clock, the store what the module's other tests wrote), and this one finishes its JSON
        run = generate(engines[engine], request={"format": fmt}, temperature=1.0, seed=seed, top_k=100,
                       num_predict=300, drafter=drafter, draft_num_predict=3, draft_schedule="fixed",
                       draft_suffix=False)
        assert run.result.done_reason == "stop", run.text
        conforms(name, run.text)
