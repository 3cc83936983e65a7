"""What clients expect beyond the OpenAI schema: several served names (all accepted and listed),
`system_fingerprint`, `reasoning` beside `reasoning_content`, SSE comment keep-alives while a
prompt is processed (proxies with idle timeouts keep the stream), and llama-server's
`/tokenize` and `/detokenize`."""

import http.client
import json
import urllib.error
import urllib.request

import openai
import pytest

from conftest import Server, run_cli


def post(server, path, body):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_several_names_are_served_and_listed(fixtures_dir):
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--served-model-name", "first", "second")
    try:
        c = s.client()
        assert [m.id for m in c.models.list().data] == ["first", "second"]
        r = c.chat.completions.create(model="second", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.model == "first"
        assert r.system_fingerprint and r.system_fingerprint.startswith("strata-")
        assert c.models.retrieve("second").id == "second"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="third", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    finally:
        s.stop()


def test_a_long_prompt_keeps_the_stream_alive(fixtures_dir):
    # Each forward pass slowed to 400 ms (debug builds), comments after 100 ms of silence.
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--sse-keepalive", "0.1",
               env={"STRATA_FAULT_PASS_DELAY_MS": "400"})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        body = {"model": s.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "stream": True}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        text = conn.getresponse().read().decode()
        # Three passes of 400 ms (the prompt, two tokens), silent but for the comments.
        assert text.count(": keep-alive\n\n") >= 3, text
        assert text.rstrip().endswith("data: [DONE]")
    finally:
        s.stop()


def test_tokenize_and_detokenize_as_llama_server(fixtures_dir):
    model = fixtures_dir / "qwen3-moe-tiny"
    s = Server(model)
    try:
        text = "Hello world, strata"
        want = run_cli("tokenize", "--model", str(model), "--text", text)
        status, got = post(s, "/tokenize", {"content": text})
        assert status == 200 and got["tokens"] == want["ids"], (got, want)
        status, pieces = post(s, "/tokenize", {"content": text, "with_pieces": True})
        assert [p["id"] for p in pieces["tokens"]] == got["tokens"]
        assert "".join(p["piece"] for p in pieces["tokens"]) == text
        status, back = post(s, "/detokenize", {"tokens": got["tokens"]})
        assert status == 200 and back["content"] == text
        for path, body, field in [
            ("/tokenize", {}, "content"),
            ("/tokenize", {"content": 3}, "content"),
            ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
            ("/detokenize", {"tokens": ["a"]}, "tokens"),
            ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
        ]:
            status, err = post(s, path, body)
            assert status == 400 and err["error"]["param"] == field, (path, body, err)
    finally:
        s.stop()
