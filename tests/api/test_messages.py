"""`/v1/messages` (Anthropic's Messages API) through the official `anthropic` client: plain,
streamed (events in Anthropic's order), a system prompt, a tool-use round trip, count_tokens,
`x-api-key`, and errors in Anthropic's shape; greedy text equal to the OpenAI endpoint's for
the same conversation."""

import json

import anthropic
import pytest

from conftest import Server

TOOLS = [{
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in TOOLS]


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def thinking_of(message):
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def openai_answer(s, model, messages, **kw):
    r = s.client().chat.completions.create(model=model, messages=messages, temperature=0, **kw)
    m = r.choices[0].message
    return m.content or "", getattr(m, "reasoning_content", None) or "", r.usage.prompt_tokens


@pytest.fixture(scope="module")
def tools_server(tools_model):
    s = Server(tools_model)
    yield s, tools_model.name
    s.stop()


def test_plain_streamed_and_system_equal_the_openai_endpoint(tools_server):
    s, model = tools_server
    a = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
    for system in (None, "Be brief."):
        kw = {"system": system} if system else {}
        msgs = [{"role": "user", "content": "Why stream experts?"}]
        r = a.messages.create(model=model, max_tokens=12, messages=msgs, extra_body={"temperature": 0}, **kw)
        assert r.type == "message" and r.role == "assistant" and r.model == model
        assert r.stop_reason in ("end_turn", "max_tokens")
        oa_msgs = ([{"role": "system", "content": system}] if system else []) + msgs
        content, reasoning, prompt_tokens = openai_answer(s, model, oa_msgs, max_tokens=12)
        assert (text_of(r), thinking_of(r)) == (content, reasoning)
        assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == prompt_tokens
        # Streamed: the same text, events in Anthropic's order.
        with a.messages.stream(model=model, max_tokens=12, messages=msgs, extra_body={"temperature": 0}, **kw) as st:
            streamed = "".join(st.text_stream)
            final = st.get_final_message()
        assert streamed == text_of(r) and text_of(final) == text_of(r)
        events = [e.type for e in a.messages.create(model=model, max_tokens=12, messages=msgs, extra_body={"temperature": 0},
                                                     stream=True, **kw)]
        assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"], events
        assert events.count("content_block_start") == events.count("content_block_stop") >= 1, events
        # count_tokens: the prompt the conversation renders to.
        n = a.messages.count_tokens(model=model, messages=msgs, **kw).input_tokens
        assert n == prompt_tokens


def test_a_tool_use_round_trip(tools_server):
    s, model = tools_server
    a = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]},
    ]
    r = a.messages.create(model=model, max_tokens=6, messages=msgs, extra_body={"temperature": 0}, tools=TOOLS)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for b in r.content:
        if b.type == "tool_use":
            assert b.name and isinstance(b.input, dict)
    oa_msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"}, separators=(",", ":"))}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"},
    ]
    content, _, prompt_tokens = openai_answer(s, model, oa_msgs, max_tokens=6, tools=OPENAI_TOOLS)
    assert a.messages.count_tokens(model=model, messages=msgs, tools=TOOLS).input_tokens == prompt_tokens
    if not any(b.type == "tool_use" for b in r.content):
        assert text_of(r) == content


def test_keys_and_errors_in_anthropic_shape(fixtures_dir):
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--api-key", "sekrit")
    try:
        model = s.model.name
        good = anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        assert good.messages.create(model=model, max_tokens=2, messages=msgs).content
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model=model, max_tokens=2, messages=msgs)
        with pytest.raises(anthropic.NotFoundError):
            good.messages.create(model="nope", max_tokens=2, messages=msgs)
        with pytest.raises(anthropic.BadRequestError) as e:
            good.messages.create(model=model, max_tokens=2,
                                 messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
        assert e.value.body["type"] == "error" and "image" in e.value.body["error"]["message"]
        with pytest.raises(anthropic.BadRequestError):
            good.messages.create(model=model, max_tokens=2, messages=[{"role": "robot", "content": "hi"}])
    finally:
        s.stop()
