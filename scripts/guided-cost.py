#!/usr/bin/env python3
"""Decode time per token with and without a JSON-schema response_format, side by side on one
server: the cost of the per-token grammar mask. Usage: scripts/guided-cost.py BIN MODEL (a model with a tokenizer); prints one JSON line per run."""
import json, subprocess, time, urllib.request, socket, sys
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
port = free_port(); url = f"http://127.0.0.1:{port}"
proc = subprocess.Popen([sys.argv[1], "serve", sys.argv[2], "--port", str(port), "--mem", "6G", "--ctx-size", "1024", "--max-concurrent", "1", "--prefix-cache", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(600):
    try: urllib.request.urlopen(url + "/health", timeout=1); break
    except OSError: time.sleep(0.1)
schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 400, "maxLength": 400}}, "required": ["s"], "additionalProperties": False}
def go(guided):
    body = {"model": json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "temperature": 1.0, "seed": 1, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    if guided: body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.time(); first = None; n = 0
    with urllib.request.urlopen(req) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                c = json.loads(line[6:])
                if c.get("usage"): n = c["usage"]["completion_tokens"]
                elif c["choices"] and c["choices"][0]["delta"].get("content"):
                    first = first or time.time()
    t1 = time.time()
    return n, (t1 - first) / max(n - 1, 1)
for rnd in range(3):
    for g in (False, True):
        n, per = go(g)
        print(json.dumps({"guided": g, "tokens": n, "s_per_token_after_first": round(per, 4)}))
proc.terminate(); proc.wait()
