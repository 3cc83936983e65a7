"""Hostile and broken requests against one running `strata serve`, case by case: each gets its
clear 4xx or its bounded behaviour, and after EACH case /health is 200 and a normal greedy
request returns exactly the output it gave before any case ran.

The server runs on a copy of qwen3-moe-tiny whose chat template carries three traps (an
endless loop, a bad `strftime_now` format, an output bomb) behind trigger messages, with short
timeouts so slow clients are cut off within the test's time."""

import http.client
import json
import shutil
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import Server

TRAPS = (
    "{%- if messages[0]['content'] == '__loop__' -%}"
    "{%- for i in range(100000) -%}{%- for j in range(100000) -%}x{%- endfor -%}{%- endfor -%}"
    "{%- elif messages[0]['content'] == '__time__' -%}{{ strftime_now('%Q %Ez') }}"
    "{%- elif messages[0]['content'] == '__big__' -%}"
    "{%- for i in range(1000) -%}{{ 'x' * 100000 }}{%- endfor -%}"
    "{%- else -%}"
)
CASE_TIMEOUT = 2  # --header-timeout, --body-timeout, --stall-timeout of this server


@pytest.fixture(scope="module")
def hostile(fixtures_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3-hostile")
    for f in (fixtures_dir / "qwen3-moe-tiny").iterdir():
        if not f.name.startswith("golden"):
            shutil.copy(f, d / f.name)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TRAPS + cfg["chat_template"] + "{%- endif -%}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = str(CASE_TIMEOUT)
    s = Server(d, "--header-timeout", t, "--body-timeout", t, "--stall-timeout", t,
               "--max-connections", "24", "--max-concurrent", "16", "--max-queued", "64",
               "--ctx-size", "1024", "--state-tokens", "4096")
    yield s
    s.stop()


def request(server, method, path, body=b"", headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    h = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def chat(server, messages=None, **kw):
    body = {"messages": messages or [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 12, "temperature": 0, **kw}
    return request(server, "POST", "/v1/chat/completions", json.dumps(body).encode())


def greedy_text(server):
    status, data = chat(server)
    assert status == 200, data[:300]
    return json.loads(data)["choices"][0]["message"]["content"]


def healthy(server):
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        return r.status == 200


def raw(server, rcvbuf=None):
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect(("127.0.0.1", server.port))
    return s


def head(path, body_len, extra=""):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {body_len}\r\n\r\n").encode()


def read_until_closed(s, limit=30):
    s.settimeout(limit)
    got = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return got
            got += data
    except (ConnectionResetError, socket.timeout):
        return got


def error_of(data):
    err = json.loads(data)["error"]
    assert err["message"] and {"message", "type", "param", "code"} <= set(err), err
    return err


# Each case returns nothing; it asserts its own outcome.

def case_gap_id_in_logit_bias(server):
    # The model's vocabulary (config) is 1600, its tokenizer's 1554: ids 1554-1599 have no text.
    status, data = request(server, "POST", "/v1/completions",
                           json.dumps({"prompt": "Hi", "max_tokens": 3, "logit_bias": {"1599": 100}}).encode())
    assert status == 400 and "tokenizer" in error_of(data)["message"], data


def case_sampled_gap_ids(server):
    # At temperature 2 the 46 padded rows (logit 0) would be drawn within a few hundred tokens.
    for seed in range(4):
        status, data = chat(server, max_tokens=300, temperature=2.0, top_k=0, top_p=1.0, seed=seed,
                            ignore_eos=True)
        assert status == 200, data[:300]
        assert json.loads(data)["choices"][0]["finish_reason"] == "length"


def case_oversized_stop(server):
    status, data = chat(server, stop=["x" * 5000])
    assert status == 400 and error_of(data)["param"] == "stop", data


def case_n_bomb(server):
    status, data = chat(server, n=10000)
    assert status == 400 and error_of(data)["param"] == "n", data


def case_max_tokens_bomb(server):
    status, data = chat(server, max_tokens=2**62)
    assert status == 400 and "context" in error_of(data)["message"], data


def case_logprobs_bomb(server):
    status, data = chat(server, n=16, max_tokens=1000, logprobs=True, top_logprobs=20)
    assert status == 400 and "log-probabilities" in error_of(data)["message"], data


def case_decoding_state_bomb(server):
    # Each choice fits one context (1024) but 8 of them not the pool (--state-tokens 4096).
    status, data = request(server, "POST", "/v1/completions", json.dumps(
        {"prompt": [[5] * 1000] * 8, "max_tokens": 20}).encode())
    msg = error_of(data)["message"]
    assert status == 400 and "8160" in msg and "4096" in msg, msg


def case_requests_beyond_the_pool_wait_their_turn(server):
    # Six requests of ~1010 positions: four fit the pool at once, two wait, all finish, each
    # with exactly its solo output.
    import concurrent.futures
    body = lambda i: json.dumps({"prompt": [5 + i] * 1000, "max_tokens": 10, "temperature": 0}).encode()
    solo = [request(server, "POST", "/v1/completions", body(i)) for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        together = list(ex.map(lambda i: request(server, "POST", "/v1/completions", body(i)), range(6)))
    for (s1, d1), (s2, d2) in zip(solo, together):
        assert s1 == s2 == 200, (d1[:200], d2[:200])
        text = lambda d: json.loads(d)["choices"][0]["text"]
        assert text(d1) == text(d2)
    assert server.metrics()["strata_queue_length"] == 0


def case_long_prompt(server):
    ids = [5] * 150_000
    status, data = request(server, "POST", "/v1/completions",
                           json.dumps({"prompt": ids, "max_tokens": 1}).encode())
    msg = error_of(data)["message"]
    assert status == 400 and "150000" in msg and "1024" in msg, msg
    status, data = chat(server, messages=[{"role": "user", "content": "word " * 150_000}])
    assert status == 400 and "context" in error_of(data)["message"], data[:300]


def case_template_loop(server):
    t0 = time.time()
    status, data = chat(server, messages=[{"role": "user", "content": "__loop__"}])
    assert status == 400 and "template" in error_of(data)["message"], data[:300]
    assert time.time() - t0 < 60


def case_template_bad_strftime(server):
    status, data = chat(server, messages=[{"role": "user", "content": "__time__"}])
    assert status == 400 and "strftime_now" in error_of(data)["message"], data[:300]


def case_template_output_bomb(server):
    status, data = chat(server, messages=[{"role": "user", "content": "__big__"}])
    assert status == 400 and "larger than" in error_of(data)["message"], data[:300]


def case_template_kwargs_override(server):
    status, data = chat(server, chat_template_kwargs={"messages": []})
    assert status == 400 and error_of(data)["param"] == "chat_template_kwargs", data


def case_non_reading_stream(server):
    before = server.metrics()
    body = json.dumps({"messages": [{"role": "user", "content": "go"}], "max_tokens": 1000, "n": 4,
                       "stream": True, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}).encode()
    s = raw(server, rcvbuf=4096)
    s.sendall(head("/v1/chat/completions", len(body)) + body)
    # Never read: the server must give up on this client and free its sequences.
    deadline = time.time() + 60
    while time.time() < deadline:
        m = server.metrics()
        if m["strata_cancelled_total"] >= before["strata_cancelled_total"] + 4 and m["strata_running_sequences"] == 0:
            break
        time.sleep(0.2)
    s.close()
    m = server.metrics()
    assert m["strata_cancelled_total"] >= before["strata_cancelled_total"] + 4, m
    assert m["strata_running_sequences"] == 0
    generated = m["strata_generation_tokens_total"] - before["strata_generation_tokens_total"]
    assert generated < 4 * 1000, "every sequence ran to its end for a client that read nothing"


def case_cross_origin_text_plain(server):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    status, data = request(server, "POST", "/v1/chat/completions", body,
                           {"Content-Type": "text/plain", "Origin": "https://evil.example"})
    assert status == 403 and "evil.example" in error_of(data)["message"], data
    # The same page's preflight gets no CORS approval.
    status, _ = request(server, "OPTIONS", "/v1/chat/completions", b"",
                        {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert status == 403


def case_page_on_another_local_port(server):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    status, data = request(server, "POST", "/v1/chat/completions", body, {"Origin": "http://localhost:3000"})
    assert status == 403, data


def case_text_plain_without_origin(server):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    status, data = request(server, "POST", "/v1/chat/completions", body, {"Content-Type": "text/plain"})
    assert status == 415, data


def case_wrong_host(server):
    # DNS rebinding: a page's name resolved to 127.0.0.1 sends its own Host.
    status, data = request(server, "GET", "/v1/models", headers={"Host": f"evil.example:{server.port}"})
    assert status == 403 and "evil.example" in error_of(data)["message"], data


def case_slowloris(server):
    s = raw(server)
    t0 = time.time()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    closed = False
    for i in range(40):
        try:
            s.sendall(f"X-Slow-{i}: 1\r\n".encode())
        except OSError:
            closed = True
            break
        s.settimeout(0.25)
        try:
            if s.recv(4096) == b"":
                closed = True
                break
        except socket.timeout:
            pass
        except OSError:
            closed = True
            break
    s.close()
    assert closed, "a header trickled for 10 s kept its connection"
    assert time.time() - t0 < CASE_TIMEOUT + 5


def case_connection_flood(server):
    idle = [raw(server) for _ in range(24)]
    try:
        # A connection left from an earlier check may close meanwhile and free its place for
        # the first extra one: the next gets the 503.
        got = b""
        for _ in range(3):
            extra = raw(server)
            idle.append(extra)
            extra.settimeout(0.5)
            try:
                got = extra.recv(65536)
            except (ConnectionResetError, socket.timeout):
                got = b""
            if got:
                break
        assert got.startswith(b"HTTP/1.1 503"), got[:200]
    finally:
        for s in idle:
            s.close()
    # Idle ones are closed by the header timeout; the listener takes connections again.
    time.sleep(0.5)


def case_truncated_body(server):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    s = raw(server)
    s.sendall(head("/v1/chat/completions", len(body) + 100) + body)
    got = read_until_closed(s, limit=CASE_TIMEOUT + 10)
    s.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    # Cut off mid-body: the client closes its side.
    s = raw(server)
    s.sendall(head("/v1/chat/completions", len(body) + 100) + body[:10])
    s.shutdown(socket.SHUT_WR)
    got = read_until_closed(s, limit=CASE_TIMEOUT + 10)
    s.close()
    assert got.startswith(b"HTTP/1.1 400") or got == b"", got[:200]


def case_bad_json_shapes(server):
    for body in [b"", b"null", b"\"x\"", b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}",
                 b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [1, 2]}",
                 b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logit_bias\": {\"5\": 1e309}}",
                 json.dumps({"prompt": "x", "logit_bias": {str(i): 1 for i in range(5000)}}).encode()]:
        path = "/v1/completions" if b"prompt" in body else "/v1/chat/completions"
        status, data = request(server, "POST", path, body)
        assert status == 400, (body[:80], data[:300])
        error_of(data)


CASES = [
    case_gap_id_in_logit_bias,
    case_sampled_gap_ids,
    case_oversized_stop,
    case_n_bomb,
    case_max_tokens_bomb,
    case_logprobs_bomb,
    case_decoding_state_bomb,
    case_requests_beyond_the_pool_wait_their_turn,
    case_long_prompt,
    case_template_loop,
    case_template_bad_strftime,
    case_template_output_bomb,
    case_template_kwargs_override,
    case_non_reading_stream,
    case_cross_origin_text_plain,
    case_page_on_another_local_port,
    case_text_plain_without_origin,
    case_wrong_host,
    case_slowloris,
    case_connection_flood,
    case_truncated_body,
    case_bad_json_shapes,
]


@pytest.fixture(scope="module")
def reference(hostile):
    return greedy_text(hostile)


@pytest.mark.parametrize("case", CASES, ids=[c.__name__[5:] for c in CASES])
def test_case_then_the_server_is_unchanged(hostile, reference, case):
    case(hostile)
    assert healthy(hostile)
    assert greedy_text(hostile) == reference


def test_a_failing_sequence_ends_alone_beside_streams(fixtures_dir):
    """The engine fails every forward pass that feeds token 777 (fault injection): that request
    gets a 500 in OpenAI's shape, the streams running beside it are untouched."""
    model = fixtures_dir / "qwen3-moe-tiny"
    s = Server(model, env={"STRATA_FAULT_FAIL_ON_TOKEN": "777"})
    try:
        import concurrent.futures
        good = lambda: request(s, "POST", "/v1/completions", json.dumps(
            {"prompt": [11, 12, 13, 14], "max_tokens": 40, "temperature": 0, "ignore_eos": True}).encode())
        solo = good()
        assert solo[0] == 200
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            streams = [ex.submit(good) for _ in range(3)]
            time.sleep(0.05)
            bad = request(s, "POST", "/v1/completions", json.dumps(
                {"prompt": [11, 777, 13], "max_tokens": 5}).encode())
            results = [f.result() for f in streams]
        assert bad[0] == 500 and "injected" in error_of(bad[1])["message"], bad
        text = lambda d: json.loads(d)["choices"][0]["text"]
        for status, data in results:
            assert status == 200 and text(data) == text(solo[1])
        assert healthy(s)
    finally:
        s.stop()


def test_an_engine_that_dies_says_so_and_the_server_exits(fixtures_dir):
    """A panic inside the model (fault injection on token 777) stops the engine thread: the
    request gets an error, /health answers 503 until the process exits, and it exits non-zero
    instead of answering 500 forever."""
    s = Server(fixtures_dir / "qwen3-moe-tiny", env={"STRATA_FAULT_PANIC_ON_TOKEN": "777"})
    try:
        status, data = request(s, "POST", "/v1/completions", json.dumps({"prompt": [11, 777], "max_tokens": 3}).encode())
        assert status == 500 and "engine" in error_of(data)["message"], data
        saw = []
        deadline = time.time() + 30
        while time.time() < deadline and s.proc.poll() is None:
            try:
                with urllib.request.urlopen(s.url + "/health", timeout=2) as r:
                    saw.append(r.status)
            except urllib.error.HTTPError as e:
                saw.append(e.code)
            except OSError:
                pass
            time.sleep(0.05)
        assert s.proc.poll() is not None, "the server kept running without its engine"
        assert s.proc.returncode != 0
        assert 200 not in saw, saw
    finally:
        s.stop()


def test_cors_only_for_allowed_origins(fixtures_dir):
    s = Server(fixtures_dir / "qwen3-moe-tiny", "--allowed-origin", "https://chat.example")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        r = conn.getresponse()
        r.read()
        assert r.status == 204
        assert r.getheader("access-control-allow-origin") == "https://chat.example"
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Origin": "https://chat.example", "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("access-control-allow-origin") == "https://chat.example"
        # Other origins get neither the call nor the header.
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Origin": "https://evil.example", "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == 403 and r.getheader("access-control-allow-origin") is None
        conn.close()
    finally:
        s.stop()
