"""Bad input gets its 4xx in OpenAI's shape and the server stays healthy; a client that leaves
mid-stream stops its generation."""

import http.client
import json
import socket
import time
import urllib.request

import pytest


def post(server, path, body: bytes, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def chat_body(**kw):
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}).encode()


BAD = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400),
    ("invalid UTF-8", "/v1/chat/completions", b'{"messages": "\xff\xfe"}', 400),
    ("messages wrong type", "/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400),
    ("empty messages", "/v1/chat/completions", json.dumps({"messages": []}).encode(), 400),
    ("missing messages", "/v1/chat/completions", json.dumps({"max_tokens": 3}).encode(), 400),
    ("unknown role", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
    ("content wrong type", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400),
    ("negative max_tokens", "/v1/chat/completions", chat_body(max_tokens=-1), 400),
    ("zero max_tokens", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
    ("huge max_tokens", "/v1/chat/completions", chat_body(max_tokens=10**12), 400),
    ("max_tokens wrong type", "/v1/chat/completions", chat_body(max_tokens="ten"), 400),
    ("temperature out of range", "/v1/chat/completions", chat_body(temperature=5), 400),
    ("top_p zero", "/v1/chat/completions", chat_body(top_p=0), 400),
    ("n too large", "/v1/chat/completions", chat_body(n=1000), 400),
    ("five stops", "/v1/chat/completions", chat_body(stop=["a", "b", "c", "d", "e"]), 400),
    ("logit_bias bad id", "/v1/chat/completions", chat_body(logit_bias={"x": 1}), 400),
    ("top_logprobs without logprobs", "/v1/chat/completions", chat_body(top_logprobs=2), 400),
    ("unknown model", "/v1/chat/completions", chat_body(model="gpt-9"), 404),
    ("prompt wrong type", "/v1/completions", json.dumps({"prompt": {"a": 1}}).encode(), 400),
    ("token id out of vocabulary", "/v1/completions", json.dumps({"prompt": [10**9]}).encode(), 400),
    ("prompt longer than the context", "/v1/completions", json.dumps({"prompt": [5] * 5000, "max_tokens": 1}).encode(), 400),
    ("10 MB body", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + b"a" * (10 << 20) + b'"}]}', 413),
]


@pytest.mark.parametrize("name,path,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clean_4xx(server, name, path, body, status):
    got, data = post(server, path, body)
    assert got == status, (name, data[:300])
    err = json.loads(data)["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert {"message", "type", "param", "code"} <= set(err)
    # The server stays healthy and serves the next request.
    with urllib.request.urlopen(server.url + "/health") as r:
        assert r.status == 200
    ok, data = post(server, "/v1/chat/completions", chat_body())
    assert ok == 200, data[:300]


def test_context_error_states_the_numbers(server):
    status, data = post(server, "/v1/completions", json.dumps({"prompt": [5] * 5000, "max_tokens": 1}).encode())
    msg = json.loads(data)["error"]["message"]
    assert status == 400 and "5000" in msg and "context" in msg


def test_unknown_route_is_404_in_openai_shape(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/v1/nothing")
    assert e.value.code == 404
    assert "error" in json.loads(e.value.read())


def test_disconnect_mid_stream_stops_generation(server):
    before = server.metrics()
    body = json.dumps({
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": 900, "stream": True, "ignore_eos": True,
    }).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    got = b""
    while got.count(b"data: ") < 4:
        data = s.recv(65536)
        assert data, got
        got += data
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = server.metrics()
        if m["strata_cancelled_total"] > before["strata_cancelled_total"] and m["strata_running_sequences"] == 0:
            break
        time.sleep(0.05)
    m = server.metrics()
    assert m["strata_cancelled_total"] == before["strata_cancelled_total"] + 1
    assert m["strata_running_sequences"] == 0
    generated = m["strata_generation_tokens_total"] - before["strata_generation_tokens_total"]
    assert generated < 900, "the generation ran to its end after the client left"
