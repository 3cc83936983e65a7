"""strata serve through the official `openai` client in strict response validation mode."""

import json
import re
import time
from pathlib import Path
import urllib.error
import urllib.request

import openai
import pytest

from conftest import Server, run_cli


def chat(client, model, content="Hello there", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **kw)


def test_models_and_health(server, client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    with urllib.request.urlopen(server.url + "/health") as r:
        assert r.status == 200


def test_chat_non_streaming(client, model_name):
    r = chat(client, model_name, max_tokens=6, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_with_usage(client, model_name):
    chunks = list(
        chat(client, model_name, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert all(c.usage is None for c in with_choices)
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    whole = chat(client, model_name, max_tokens=5, temperature=0)
    assert text == whole.choices[0].message.content


def test_completions_streamed_and_not(server, client, model_name):
    r = client.completions.create(model=model_name, prompt="Once upon", max_tokens=7, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    # The SDK parses streamed completions with its `Completion` type, whose `finish_reason` must be
    # set, while OpenAI's API (and every server) sends null until the last chunk; so strict
    # validation cannot pass on any conforming stream. Check those chunks by hand instead.
    loose = server.client(strict=False)
    chunks = list(
        loose.completions.create(
            model=model_name, prompt="Once upon", max_tokens=7, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7


def test_max_tokens_gives_length(client, model_name):
    r = client.completions.create(model=model_name, prompt="a", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    r = chat(client, model_name, max_completion_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def test_seed_determinism_and_n(client, model_name):
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95, extra_body={"ignore_eos": True})
    a = chat(client, model_name, seed=1234, **kw)
    b = chat(client, model_name, seed=1234, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    r = chat(client, model_name, seed=1234, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.choices[0].message.content == a.choices[0].message.content
    assert len({c.message.content for c in r.choices}) > 1, "n=3 choices should differ when sampling"
    assert r.usage.completion_tokens == 36


def test_logprobs_chat_and_completions(client, model_name):
    r = chat(client, model_name, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 3
        assert tops[0].logprob >= tops[1].logprob >= tops[2].logprob
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(tops[0].logprob)
        assert entry.logprob <= 0
    r = client.completions.create(model=model_name, prompt="Hi", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_logit_bias_forces_a_token(server, client, model_name):
    base = client.completions.create(model=model_name, prompt="Hi", max_tokens=4, temperature=0)
    # A whole-word token the model did not choose.
    for word in (" the", " and", " function", " data"):
        ids = run_cli("tokenize", "--model", str(server.model), "--text", word)["ids"]
        if len(ids) == 1:
            break
    forced = ids[0]
    text = run_cli("detokenize", "--model", str(server.model), "--ids", str(forced))["text"]
    r = client.completions.create(
        model=model_name, prompt="Hi", max_tokens=4, temperature=0, logit_bias={str(forced): 100}, logprobs=1,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].logprobs.tokens == [text] * 4
    assert r.choices[0].text == text * 4 != base.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt="Hi", max_tokens=1, logit_bias={"99999999": 5})


def test_stop_strings_including_one_spanning_two_tokens(server, client, model_name):
    loose = server.client(strict=False)  # streamed completions: see test_completions_streamed_and_not
    base = client.completions.create(
        model=model_name, prompt="The", max_tokens=12, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    toks = base.choices[0].logprobs.tokens
    text = base.choices[0].text
    # A stop made of the end of one token and the start of the next.
    k = next(i for i in range(1, len(toks) - 1) if len(toks[i]) >= 1 and len(toks[i + 1]) >= 1 and "\ufffd" not in toks[i] + toks[i + 1])
    stop = toks[k][-1:] + toks[k + 1][:1]
    at = text.find(stop)
    assert at >= 0
    for stream in (False, True):
        kw = dict(model=model_name, prompt="The", max_tokens=12, temperature=0, stop=[stop, "never-seen"], extra_body={"ignore_eos": True})
        if stream:
            chunks = list(loose.completions.create(stream=True, **kw))
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
        else:
            r = client.completions.create(**kw)
            got, finish = r.choices[0].text, r.choices[0].finish_reason
        assert got == text[:at], (stream, stop, got, text)
        assert finish == "stop"
    # chat too, a single string
    whole = chat(client, model_name, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}).choices[0].message.content
    if len(whole) > 3:
        stop = whole[2:4]
        r = chat(client, model_name, max_tokens=10, temperature=0, stop=stop, extra_body={"ignore_eos": True})
        assert r.choices[0].message.content == whole[: whole.find(stop)]
        assert r.choices[0].finish_reason == "stop"


def test_greedy_output_equals_strata_run(server, client, model_name):
    ids = [5, 17, 42, 99, 7]
    cli = run_cli(
        "run", "--model", str(server.model), "--ids", ",".join(map(str, ids)), "--max-tokens", "16",
        "--temperature", "0", "--ignore-eos", "--output", "json",
    )
    r = client.completions.create(
        model=model_name, prompt=ids, max_tokens=16, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == cli["text"]
    want = [run_cli("detokenize", "--model", str(server.model), "--ids", str(i))["text"] for i in cli["token_ids"]]
    assert r.choices[0].logprobs.tokens == want
    # Chat through the template, the same way `strata run --chat` renders it.
    cli = run_cli(
        "run", "--model", str(server.model), "--chat", "--prompt", "Why is the sky blue?", "--max-tokens", "12",
        "--temperature", "0", "--ignore-eos", "--output", "json",
    )
    r = chat(
        client, model_name, content="Why is the sky blue?", max_tokens=12, temperature=0, logprobs=True,
        extra_body={"ignore_eos": True},
    )
    # Token for token: the server's logprobs list the tokens it generated.
    want = [run_cli("detokenize", "--model", str(server.model), "--ids", str(i))["text"] for i in cli["token_ids"]]
    assert [e.token for e in r.choices[0].logprobs.content] == want
    assert r.usage.completion_tokens == len(cli["token_ids"])


def test_api_key_required_when_set(fixtures_dir):
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--api-key", "sekrit")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        # No Authorization header at all.
        req = urllib.request.Request(s.url + "/v1/models")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 401
        assert json.loads(e.value.read())["error"]["code"] == "invalid_api_key"
        assert s.client(api_key="sekrit").models.list().data
        with urllib.request.urlopen(s.url + "/health?token=sekrit") as r:
            assert r.status == 200
        client = s.client(api_key="sekrit")
        model = client.models.list().data[0].id
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
            extra_body={"ignore_eos": True},
        )
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
            stream=True, extra_body={"ignore_eos": True},
        )
        assert len([c for c in stream if c.choices and c.choices[0].delta.content is not None]) >= 1
        # A line per request (method, path, status, time; tokens and time to the first token
        # for generation, written once the response is sent), never a key nor a query.
        deadline = time.time() + 5
        while "completion 4 tokens" not in Path(s.log.name).read_text() and time.time() < deadline:
            time.sleep(0.05)
        log = Path(s.log.name).read_text()
        assert re.search(r"strata::access: POST /v1/chat/completions 200 [0-9.]+ s \| prompt \d+ completion 3 tokens \| first token [0-9.]+ s", log), log
        assert re.search(r"strata::access: POST /v1/chat/completions 200 [0-9.]+ s \| prompt \d+ completion 4 tokens", log), log
        assert "strata::access: GET /v1/models 401" in log, log
        assert "strata::access: GET /v1/models 200" in log, log
        assert "strata::access: GET /health 200" in log, log
        assert "sekrit" not in log, log
    finally:
        s.stop()


def test_tool_call_round_trip(tools_model):
    """Tools render through the real Qwen3 template; a tool call and its result go back in."""
    s = Server(tools_model)
    try:
        c = s.client()
        model = tools_model.name
        tools = [{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }]
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        plain = c.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0)
        with_tools = c.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=2, temperature=0)
        assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, "tools were not rendered"
        none = c.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice="none", max_tokens=2, temperature=0)
        assert none.choices[0].message.tool_calls is None
        # The model's (here: a scripted) tool call and the tool's answer go back into the conversation.
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ]
        after = c.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=3, temperature=0)
        assert after.usage.prompt_tokens > with_tools.usage.prompt_tokens
        assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
        streamed = list(c.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=3, temperature=0, stream=True))
        assert streamed[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        s.stop()


def test_kimi_k3_chat_through_xtml(fixtures_dir):
    """K3 has no Jinja template: the prompt is XTML, and its think/response structure is parsed."""
    model = fixtures_dir / "kimi-k3-tiny"
    s = Server(model)
    try:
        c = s.client()
        cli = run_cli(
            "run", "--model", str(model), "--chat", "--prompt", "Why stream experts?", "--max-tokens", "10",
            "--temperature", "0", "--ignore-eos", "--output", "json",
        )
        r = c.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "Why stream experts?"}], max_tokens=10,
            temperature=0, logprobs=True, extra_body={"ignore_eos": True},
        )
        want = [run_cli("detokenize", "--model", str(model), "--ids", str(i))["text"] for i in cli["token_ids"]]
        assert [e.token for e in r.choices[0].logprobs.content] == want
        msg = r.choices[0].message
        for text in (msg.content or "", getattr(msg, "reasoning_content", None) or ""):
            assert "<|open|>" not in text and "<|sep|>" not in text
        # The generation prompt opened a think element: what comes first is reasoning.
        assert getattr(msg, "reasoning_content", None) or msg.content is not None
        # vLLM's name for it too.
        assert getattr(msg, "reasoning", None) == getattr(msg, "reasoning_content", None)
    finally:
        s.stop()
