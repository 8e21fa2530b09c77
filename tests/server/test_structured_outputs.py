"""Structured outputs with the real client libraries against a real server thread: pydantic models
through langchain's `ChatOllama.with_structured_output` (its default json_schema method: Ollama's
`format`), openai's `chat.completions.parse` (`response_format` json_schema, strict) and the `ollama`
client. The tiny random model is the harshest test of the constraint: whatever it says must validate.
A real small model (SmolLM2, marked realmodel) must also answer with something meaningful."""

from __future__ import annotations

import enum
from typing import Literal, Optional

import httpx
import ollama
import openai
import pytest
from langchain_ollama import ChatOllama
from pydantic import BaseModel, Field

from tests.server_thread import ServerThread, make_store


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Item(BaseModel):
    name: str = Field(min_length=2, max_length=8)
    qty: int = Field(ge=1, le=99)


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip: Optional[str] = Field(default=None, pattern=r"^\d{5}$")


class Order(BaseModel):
    customer: str = Field(min_length=2, max_length=12)
    note: Optional[str] = Field(default=None, max_length=8)
    status: Literal["new", "paid", "shipped"]
    color: Color
    address: Address
    items: list[Item] = Field(max_length=3)
    priority: int = Field(ge=1, le=5)
    counts: dict[str, int] = Field(max_length=2)


PROMPT = "Make up an order as JSON."
OPTIONS = {"num_predict": 700, "seed": 11}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("structured"))) as server:
        yield server


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_langchain_with_structured_output(srv: ServerThread, temperature: float) -> None:
    llm = ChatOllama(model="tiny", base_url=srv.url, temperature=temperature, num_predict=OPTIONS["num_predict"],
                     seed=OPTIONS["seed"])
    chain = llm.with_structured_output(Order, include_raw=True)
    out = chain.invoke(PROMPT)
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], Order)
    Order.model_validate_json(out["raw"].content)


@pytest.mark.parametrize("seed", [1, 2])
def test_openai_parse(srv: ServerThread, seed: int) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="ignored", max_retries=0, timeout=300)
    c = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                      response_format=Order, max_tokens=OPTIONS["num_predict"], seed=seed,
                                      temperature=1.0)
    msg = c.choices[0].message
    assert isinstance(msg.parsed, Order) and c.choices[0].finish_reason == "stop"
    Order.model_validate_json(msg.content)
    spec = c.model_extra["speculative_decoding"]  # speculation stays on under the constraint
    assert spec["drafter"] == "model+suffix" and spec["draft_n"] > 0


def test_ollama_client_format(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url)
    r = client.chat(model="tiny", messages=[{"role": "user", "content": PROMPT}], format=Order.model_json_schema(),
                    options={"temperature": 0.8, **OPTIONS})
    Order.model_validate_json(r.message.content)
    r = client.generate(model="tiny", prompt=PROMPT, format=Order.model_json_schema(),
                        options={"temperature": 0, **OPTIONS})
    Order.model_validate_json(r.response)


def test_unenforceable_schema_is_a_400_naming_the_keyword(srv: ServerThread) -> None:
    class Tags(BaseModel):
        tags: set[str]  # pydantic: uniqueItems

    r = httpx.post(srv.url + "/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                "format": Tags.model_json_schema()}, timeout=60)
    assert r.status_code == 400
    assert r.json() == {"error": 'unsupported JSON schema keyword "uniqueItems" at schema.properties.tags '
                                 "(element uniqueness cannot be enforced while generating)"}
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="ignored", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "x"}], response_format=Tags)
    assert "uniqueItems" in e.value.body["message"]


# ------------------------------------------------------------------------------------------------
# a real small model: the answer must mean something, not only validate
# ------------------------------------------------------------------------------------------------


class Person(BaseModel):
    name: str = Field(min_length=2, max_length=20)
    age: int = Field(ge=0, le=120)
    city: Optional[str] = Field(default=None, max_length=20)


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    from blobs import BlobStore
    from importer import CreateRequest, create_model
    from tests.realmodels import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("SmolLM2 is not installed")
    store = BlobStore(tmp_path_factory.mktemp("smol") / "models")
    digest, _ = store.add_file(path)
    create_model(store, CreateRequest(model="smol", files={"smol.gguf": digest}))
    with ServerThread(store) as server:
        yield server


TEXT = "Extract the person: Alice is 34 years old and lives in Paris."


@pytest.mark.realmodel
def test_real_model_langchain_and_openai(smol: ServerThread) -> None:
    llm = ChatOllama(model="smol", base_url=smol.url, temperature=0, num_predict=120)
    person = llm.with_structured_output(Person).invoke(TEXT)
    assert isinstance(person, Person) and "Alice" in person.name
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="ignored", max_retries=0, timeout=300)
    c = client.chat.completions.parse(model="smol", messages=[{"role": "user", "content": TEXT}],
                                      response_format=Person, max_tokens=120, temperature=0)
    p = c.choices[0].message.parsed
    assert isinstance(p, Person) and "Alice" in p.name
