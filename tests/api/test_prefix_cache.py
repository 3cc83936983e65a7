"""The prefix cache: a 3-turn chat through the API, where turns 2 and 3 take at least the
whole previous prompt from the cache (`usage.prompt_tokens_details.cached_tokens` and the
metrics say so) and answer exactly as a server with the cache off does; for an attention model
(Qwen3-MoE) and for models with a recurrent state (Kimi Linear, Kimi K3), whose state is kept
as each prompt is all in."""

import urllib.request

import pytest

from conftest import Server, fixtures


def chat(server, turns=3):
    client = server.client()
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    out = []
    for t in range(turns):
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
