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


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Sum of two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]


def check_call(call, name=None):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args in ({"city": "Paris"}, {"city": "Oslo"}), args
    else:
        assert call.function.name == "add" and set(args) == {"a", "b"}, (call.function.name, args)
        assert all(isinstance(args[k], int) and 0 <= args[k] <= 9 for k in args)
    assert name is None or call.function.name == name


@pytest.mark.parametrize("model", ["tools", "deepseek-v3-tiny", "kimi-k2-tiny"])
def test_tool_choice_required_and_named_always_give_valid_calls(model, tools_model, fixtures_dir):
    from conftest import Server

    path = tools_model if model == "tools" else fixtures_dir / model
    s = Server(path)
    try:
        c = s.client()
        name = c.models.list().data[0].id
        msgs = [{"role": "user", "content": "Weather in Paris, or 2 + 3?"}]
        for seed in range(3):
            r = c.chat.completions.create(model=name, messages=msgs, tools=TOOLS, tool_choice="required",
                                          parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=seed)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, (model, choice)
            check_call(choice.message.tool_calls[0])
        # Parallel calls: one or more, at most 8, each valid (a random model may also call until
        # the token limit, which only a real model's EOS prevents).
        r = c.chat.completions.create(model=name, messages=msgs, tools=TOOLS, tool_choice="required",
                                      max_tokens=200, temperature=1.0, seed=7)
        choice = r.choices[0]
        if choice.finish_reason == "tool_calls":
            assert 1 <= len(choice.message.tool_calls) <= 8, (model, choice)
            for call in choice.message.tool_calls:
                check_call(call)
        else:
            assert choice.finish_reason == "length", (model, choice)
        named = {"type": "function", "function": {"name": "add"}}
        r = c.chat.completions.create(model=name, messages=msgs, tools=TOOLS, tool_choice=named,
                                      parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=4)
        calls = r.choices[0].message.tool_calls
        assert calls and len(calls) == 1, (model, r.choices[0])
        check_call(calls[0], "add")
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=name, messages=msgs, tools=TOOLS, max_tokens=4,
                                      tool_choice={"type": "function", "function": {"name": "nope"}})
    finally:
        s.stop()
