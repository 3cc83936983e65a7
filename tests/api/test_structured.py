"""Structured output with the official `openai` client in strict mode: `response_format`
`json_schema` on a random-weight model still returns JSON that validates against the schema (a
grammar masks every token that cannot continue it), `client.chat.completions.parse` with a
pydantic model succeeds, `json_object` gives a JSON object, and a schema that cannot compile is
a 400 naming `response_format`."""

import json

import openai
import pytest
from pydantic import BaseModel, Field

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


def valid(doc):
    assert set(doc) == {"name", "age", "pets"}, doc
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 12
    assert isinstance(doc["age"], int) and 0 <= doc["age"] <= 150
    assert isinstance(doc["pets"], list) and len(doc["pets"]) <= 3
    assert all(p in ("cat", "dog") for p in doc["pets"])


def test_json_schema_is_enforced_on_a_random_model(client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for seed in range(4):
        r = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Describe someone."}], max_tokens=120,
            temperature=1.0, seed=seed, response_format=fmt,
        )
        assert r.choices[0].finish_reason == "stop", r
        valid(json.loads(r.choices[0].message.content))
    # Streamed too.
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Someone else."}], max_tokens=120,
        temperature=1.0, seed=9, response_format=fmt, stream=True,
    )
    valid(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)))


def test_parse_with_a_pydantic_model(client, model_name):
    r = client.chat.completions.parse(
        model=model_name, messages=[{"role": "user", "content": "Who?"}], max_tokens=120, temperature=0.8,
        seed=3, response_format=Person,
    )
    p = r.choices[0].message.parsed
    assert isinstance(p, Person) and len(p.name) <= 12 and 0 <= p.age <= 150


def test_json_object_and_refusals(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "JSON please."}], max_tokens=60, temperature=0,
        response_format={"type": "json_object"},
    )
    content = r.choices[0].message.content
    assert content.startswith("{"), content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    for fmt in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
                {"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": "xml"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}],
                                           max_tokens=4, response_format=fmt)
        assert e.value.body["param"] == "response_format", e.value.body
