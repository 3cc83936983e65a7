#!/usr/bin/env python3
"""Time to first token of a chat's second turn with the server's prefix cache on and off, side by
side: for each round, one server of each kind (the same binary, model and flags but
`--prefix-cache`), each running the same two-turn conversation through the streaming API.

    scripts/prefix-ttft.py BIN MODEL [--rounds 3] [--system-words 300] [--disk DIR] [-- SERVE FLAGS...]

With `--disk DIR` the cached server keeps its states in DIR (`--prefix-cache-dir`) and is
restarted between the turns, so turn 2 reads its state back from the disk tier.

Prints one JSON line per run and a summary: turn 2's prompt tokens, the tokens the cache gave,
and its time to first token with and without the cache. Needs only Python's standard library.
"""

import argparse
import pathlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_stream(url, body):
    """(time to the first content chunk, text, usage) of a streamed chat completion."""
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                delta = c.get("delta", {}).get("content")
                if delta:
                    first = first or time.time() - t0
                    text += delta
    return first, text, usage


def start(binary, model, flags):
    """A healthy server and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "serve", model, "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(6000):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return proc, url


def stop(proc):
    proc.terminate()
    proc.wait()


def run(binary, model, flags, cache, system_words, disk=None):
    if disk:
        pathlib.Path(disk).mkdir(parents=True, exist_ok=True)
        disk = tempfile.mkdtemp(dir=disk)  # a fresh folder per run: nothing from earlier rounds
    extra = ["--prefix-cache", cache] + (["--prefix-cache-dir", disk] if disk and cache != "off" else [])
    proc, url = start(binary, model, extra + flags)
    try:
        name = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        system = " ".join(f"rule{i}" for i in range(system_words))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "First question?"}]
        body = {"model": name, "messages": msgs, "max_tokens": 8, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        ttft1, answer, u1 = post_stream(url, body)
        if "--prefix-cache-dir" in extra:
            # The state is written by a thread: wait for it, then restart.
            for _ in range(600):
                if list(pathlib.Path(disk).rglob("*.pc")):
                    break
                time.sleep(0.1)
            stop(proc)
            proc, url = start(binary, model, extra + flags)
        msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Second question?"}]
        ttft2, _, u2 = post_stream(url, {**body, "messages": msgs})
        return {"prefix_cache": cache, "turn1_ttft_s": round(ttft1, 3), "turn2_ttft_s": round(ttft2, 3),
                "turn2_prompt_tokens": u2["prompt_tokens"],
                "turn2_cached_tokens": u2.get("prompt_tokens_details", {}).get("cached_tokens", 0)}
    finally:
        stop(proc)


def main():
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--disk", help="keep states in this folder and restart between the turns")
    a = ap.parse_args(argv)
    results = {"auto": [], "off": []}
    for _ in range(a.rounds):
        for cache in ("auto", "off"):
            r = run(a.binary, a.model, flags, cache, a.system_words, a.disk)
            print(json.dumps(r), flush=True)
            results[cache].append(r)
    for cache, rs in results.items():
        t = sorted(r["turn2_ttft_s"] for r in rs)
        print(f"prefix cache {cache}: turn 2 time to first token {t[0]}-{t[-1]} s "
              f"({rs[0]['turn2_cached_tokens']} of {rs[0]['turn2_prompt_tokens']} prompt tokens from the cache)")


if __name__ == "__main__":
    main()
