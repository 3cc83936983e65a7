"""Soak: 16 clients for STRATA_SOAK_SECONDS (default 60; the issue's run is 600) against one
`strata serve --mem 1G`, each mixing valid requests (streamed chat, whole completions),
invalid ones and streams it drops mid-way. Every valid request succeeds with exactly its solo
greedy output, nothing stays queued, the server's resident memory stays flat and within --mem.
The report (requests by kind, RSS at start/end/max) goes to target/api-soak.json; run under a
memory cap (`STRATA_SERVE_PREFIX="../shared/tools/capmem.sh 1G" CAPMEM_STATS=1`), the cgroup's
peak use goes to target/api-soak-capmem.txt."""

import json
import os
import random
import socket
import threading
import time
from pathlib import Path

from conftest import REPO, Server

CLIENTS = 16
MEM = 1 << 30


def rss_kib(pid):
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def stream_chat(client, model, prompt, max_tokens):
    chunks = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, extra_body={"ignore_eos": True})
    text = ""
    for c in chunks:
        if c.choices:
            text += c.choices[0].delta.content or ""
            text += getattr(c.choices[0].delta, "reasoning_content", None) or ""
    return text


def complete(client, model, prompt, max_tokens):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text


def invalid(server):
    body = random.choice([b'{"messages": [', b'{"messages": []}', b'{"prompt": "x", "max_tokens": -3}',
                          b'{"prompt": "x", "logit_bias": {"1599": 5}}', b'{"prompt": "x", "n": 99}'])
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while True:
        data = s.recv(65536)
        if not data:
            break
        got += data
    s.close()
    return int(got.split(b" ", 2)[1])


def drop_mid_stream(server, prompt):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 200,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        data = s.recv(65536)
        if not data:
            break
        got += data
    s.close()


def test_soak_mixed_clients(fixtures_dir):
    seconds = float(os.environ.get("STRATA_SOAK_SECONDS", "60"))
    server = Server(fixtures_dir / "qwen3-moe-tiny", "--mem", str(MEM), "--max-concurrent", "16",
                    "--max-queued", "64")
    try:
        model = server.model.name
        client = server.client()
        prompts = [f"Soak client {i}: a story about number {i * 13}." for i in range(CLIENTS)]
        ref_stream = [stream_chat(client, model, p, 16) for p in prompts]
        ref_complete = [complete(client, model, p, 12) for p in prompts]
        counts = {"stream": 0, "complete": 0, "invalid": 0, "dropped": 0}
        failures, mismatches = [], []
        lock = threading.Lock()
        rss_start = rss_kib(server.pid())[0]
        samples = [rss_start]
        stop_at = time.time() + seconds

        def worker(i):
            rng = random.Random(i)
            c = server.client()
            while time.time() < stop_at:
                kind = rng.choices(["stream", "complete", "invalid", "dropped"], [4, 3, 2, 1])[0]
                try:
                    if kind == "stream":
                        got, want = stream_chat(c, model, prompts[i], 16), ref_stream[i]
                    elif kind == "complete":
                        got, want = complete(c, model, prompts[i], 12), ref_complete[i]
                    elif kind == "invalid":
                        status = invalid(server)
                        got, want = status // 100, 4
                    else:
                        drop_mid_stream(server, prompts[i])
                        got = want = None
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    with lock:
                        failures.append((i, kind, repr(e)))
                    continue
                with lock:
                    counts[kind] += 1
                    if got != want:
                        mismatches.append((i, kind, got, want))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            samples.append(rss_kib(server.pid())[0])
        for t in threads:
            t.join()
        # Nothing stays queued or running once the clients are done.
        deadline = time.time() + 15
        while time.time() < deadline:
            m = server.metrics()
            if m["strata_queue_length"] == 0 and m["strata_running_sequences"] == 0:
                break
            time.sleep(0.1)
        m = server.metrics()
        rss_end, hwm = rss_kib(server.pid())
        settled = samples[len(samples) // 4]
        report = {
            "clients": CLIENTS, "seconds": seconds, "requests": counts,
            "failures": len(failures), "mismatches": len(mismatches),
            "rss_kib": {"start": rss_start, "quarter": settled, "end": rss_end, "max": max(samples), "peak_hwm": hwm},
            "mem_bytes": MEM, "prefix_cache_bytes": m["strata_prefix_cache_bytes"],
        }
        out = REPO / "target" / "api-soak.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print("\nsoak:", json.dumps(report))
        assert not failures, failures[:3]
        assert not mismatches, mismatches[:3]
        assert all(counts[k] > 0 for k in counts), counts
        assert m["strata_queue_length"] == 0 and m["strata_running_sequences"] == 0, m
        # Flat: once warm, RSS grows by less than 32 MiB for the rest of the run, besides what
        # the prefix cache holds (bounded by its share of --mem)...
        assert rss_end - settled < (32 << 10) + m["strata_prefix_cache_bytes"] / 1024, report
        # ... and the peak stays within --mem.
        assert hwm * 1024 <= MEM, report
    finally:
        server.stop()
        # Under $STRATA_SERVE_PREFIX="capmem.sh SIZE" with CAPMEM_STATS=1, the cgroup's peak.
        capped = [l for l in Path(server.log.name).read_text(errors="replace").splitlines() if l.startswith("capmem:")]
        if capped:
            print("\n" + capped[-1])
            out = REPO / "target" / "api-soak-capmem.txt"
            out.parent.mkdir(exist_ok=True)
            out.write_text(capped[-1] + "\n")
