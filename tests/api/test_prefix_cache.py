"""The prefix cache: a 3-turn chat through the API, where turns 2 and 3 take at least the
whole previous prompt from the cache (`usage.prompt_tokens_details.cached_tokens` and the
metrics say so) and answer exactly as a server with the cache off does; for an attention model
(Qwen3-MoE) and for models with a recurrent state (Kimi Linear, Kimi K3), whose state is kept
as each prompt is fed (at each prefill chunk's end and the prompt's end), so two conversations
that share a system prompt share its state up to a chunk's end. With `--prefix-cache-dir` the
states are also kept on disk: a restarted server resumes from them, and files it cannot use are
removed, never trusted."""

import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import Server, fixtures


def chat(server, turns=3, replay=()):
    client = server.client()
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    out = []
    for t in range(turns):
        if t < len(replay):
            # Earlier turns as a client replays them (this server did not answer them).
            messages += [{"role": "assistant", "content": replay[t]}, {"role": "user", "content": f"And then {t}?"}]
            continue
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
        )
        content = r.choices[0].message.content or ""
        out.append((content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"And then {t}?"}]
    return out


def metric(server, name):
    with urllib.request.urlopen(server.url + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"strata_{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.parametrize("name", ["qwen3-moe-tiny", "kimi-linear-tiny", "kimi-k3-tiny"])
def test_later_turns_reuse_the_conversation_and_answer_the_same(name):
    on = Server(fixtures() / name)
    off = Server(fixtures() / name, "--prefix-cache", "off")
    try:
        got, want = chat(on), chat(off)
        hits, tokens = metric(on, "prefix_cache_hits_total"), metric(on, "prefix_cache_tokens_total")
    finally:
        on.stop()
        off.stop()
    assert [c for c, _, _ in got] == [c for c, _, _ in want]
    assert [c for _, _, c in want] == [0, 0, 0]
    assert got[0][2] == 0
    for prev, turn in zip(got, got[1:]):
        # At least the whole previous prompt comes from the cache; something is new.
        assert prev[1] <= turn[2] < turn[1], got
    assert hits >= 2 and tokens == got[1][2] + got[2][2], (hits, tokens, got)


SYSTEM = "You are a weather assistant. Answer in a few words, politely, and never ask questions back."


def ask(server, question):
    client = server.client()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "kimi-k3-tiny"])
def test_a_recurrent_state_is_shared_up_to_a_chunk_end(name):
    chunk = 4
    on = Server(fixtures() / name, "--prefill-chunk", str(chunk))
    off = Server(fixtures() / name, "--prefill-chunk", str(chunk), "--prefix-cache", "off")
    try:
        got = [ask(on, q) for q in ("Rain in Oslo today?", "Sun in Rome tomorrow?")]
        want = [ask(off, q) for q in ("Rain in Oslo today?", "Sun in Rome tomorrow?")]
    finally:
        on.stop()
        off.stop()
    assert [c for c, _, _ in got] == [c for c, _, _ in want]
    (_, n1, c1), (_, n2, c2) = got
    assert c1 == 0
    # The system prompt's tokens, up to a chunk's end, and not the question.
    assert 0 < c2 < n2 and c2 % chunk == 0, got
    assert c2 > len(SYSTEM.split()), got


@pytest.mark.parametrize("name", ["qwen3-moe-tiny", "kimi-linear-tiny"])
def test_a_restarted_server_resumes_from_the_disk_and_drops_broken_files(name):
    with tempfile.TemporaryDirectory(prefix="strata-prefix-") as folder:
        off = Server(fixtures() / name, "--prefix-cache", "off")
        try:
            want = chat(off)
        finally:
            off.stop()
        first = Server(fixtures() / name, "--prefix-cache-dir", folder)
        try:
            got = chat(first, turns=1)
        finally:
            first.stop()  # SIGTERM: the stop waits for the state being written
        # A broken file and a stranger beside the good one: removed, never read as state.
        [good] = list(Path(folder).glob("*/*.pc"))
        assert not list(Path(folder).glob("*/*.tmp"))
        torn = good.with_name("0123456789abcdef.pc")
        torn.write_bytes(good.read_bytes()[:-9])
        stranger = good.with_name("stranger.pc")
        stranger.write_bytes(b"STRATAPC" + b"\xff" * 40)
        second = Server(fixtures() / name, "--prefix-cache-dir", folder)
        try:
            got += chat(second, replay=[got[0][0]])
            hits = metric(second, "prefix_cache_disk_hits_total")
            assert metric(second, "prefix_cache_disk_bytes") > 0
        finally:
            second.stop()
        assert not stranger.exists()
        assert [c for c, _, _ in got] == [c for c, _, _ in want]
        # Turn 2, the first on the new server, took at least turn 1's prompt from the disk.
        assert got[0][1] <= got[1][2] < got[1][1] and hits >= 1, (got, hits)


def test_a_prefix_cache_folder_needs_the_cache_and_a_usable_folder():
    from conftest import strata_bin

    model = str(fixtures() / "qwen3-moe-tiny")
    with tempfile.TemporaryDirectory() as folder:
        r = subprocess.run(
            [strata_bin(), "serve", "--model", model, "--prefix-cache", "off", "--prefix-cache-dir", folder],
            capture_output=True, text=True, timeout=60,
        )
        assert r.returncode != 0 and "--prefix-cache-dir" in r.stderr, r.stderr
        blocker = Path(folder) / "a-file"
        blocker.write_text("not a folder")
        r = subprocess.run(
            [strata_bin(), "serve", "--model", model, "--port", "0", "--prefix-cache-dir", str(blocker)],
            capture_output=True, text=True, timeout=60,
        )
        assert r.returncode != 0 and "--prefix-cache-dir" in r.stderr and "a-file" in r.stderr, r.stderr


def test_a_client_that_leaves_leaves_its_state_for_the_next_request():
    server = Server(fixtures() / "qwen3-moe-tiny")
    try:
        client = server.client()
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": "Tell me a long story about a king."}]
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=500, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()  # the client goes away mid-answer
        deadline = time.time() + 10
        while metric(server, "running_sequences") and time.time() < deadline:
            time.sleep(0.05)
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0)
        # The whole prompt but its last token comes from what the cancelled request left.
        assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1, r.usage
    finally:
        server.stop()
