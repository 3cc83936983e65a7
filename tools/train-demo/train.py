#!/usr/bin/env python3
"""Trains the demo model (model.py) on the corpus (corpus.py) with the tokenizer (tokenizer.py),
on one GPU, for a wall-clock budget, and saves a Hugging Face folder: config.json,
generation_config.json, BF16 safetensors in shards of at most 12 MB (the device returns files of
at most 16 MiB), the tokenizer files, and train.json (steps, tokens, losses). A checkpoint
(weights, optimiser, step) is written every `--save-every` seconds to `--checkpoint`, and
`--resume` continues from it.

    python3 tools/train-demo/train.py --corpus DIR --tokenizer DIR --out DIR [--minutes 8]

Balancing is DeepSeek-V3's auxiliary-loss-free one: after each step every router's correction
bias moves by `--bias-rate` towards an even load (up for experts below the mean, down above).
"""

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer

from model import CONFIG, DemoModel, cosine, parameters_m

SHARD_BYTES = 12 << 20


def tokens(tok, path):
    """Every document's ids, each followed by <|endoftext|>, as one stream."""
    eot = tok.token_to_id("<|endoftext|>")
    docs = path.read_text().split("\n\n")
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


def batch(stream, size, length, gen):
    starts = torch.randint(0, len(stream) - length - 1, (size,), generator=gen)
    x = torch.stack([stream[s:s + length + 1] for s in starts.tolist()])
    return x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, stream, length, device):
    """Mean loss over the whole held-out stream, in windows of `length`."""
    model.eval()
    total, count = 0.0, 0
    n = (len(stream) - 1) // length
    for i in range(0, n, 64):
        rows = [stream[j * length:(j + 1) * length + 1] for j in range(i, min(n, i + 64))]
        x = torch.stack(rows).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total, count = total + float(loss), count + x[:, 1:].numel()
    model.train()
    return total / count


def save_folder(model, tok_dir, out, log, bare):
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu") for k, v in model.hf_state_dict().items()}
    state = {k: (v.to(torch.float32) if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
             for k, v in state.items()}
    shards, current, size = [], {}, 0
    for k in sorted(state):
        nbytes = state[k].numel() * state[k].element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[k], size = state[k], size + nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(v.numel() * v.element_size() for v in state.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    (out / "train.json").write_text(json.dumps(log, indent=1) + "\n")
    if bare:
        return  # the weights alone (the device returns 8 files at most)
    (out / "config.json").write_text(json.dumps({**CONFIG, "bos_token_id": 4091, "eos_token_id": 4095}, indent=2) + "\n")
    gen = {"bos_token_id": 4091, "eos_token_id": [4095, 4091]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out / f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=0, help="a fixed step count instead of the time budget")
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/demo-checkpoint.pt"))
    ap.add_argument("--save-every", type=float, default=120.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bare", action="store_true", help="write the weights, their index and train.json only")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(str(a.tokenizer / "tokenizer.json"))
    train, valid = tokens(tok, a.corpus / "train.txt"), tokens(tok, a.corpus / "valid.txt")
    print(f"{len(train) / 1e6:.2f} M training tokens, {len(valid) / 1e6:.3f} M held out", flush=True)
    model = DemoModel().to(device)
    print(f"{parameters_m(model):.1f} M parameters on {device}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    plain = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=device == "cuda")
    gen = torch.Generator().manual_seed(a.seed)
    step, spent, log = 0, 0.0, {"losses": []}
    if a.resume and a.checkpoint.exists():
        ck = torch.load(a.checkpoint, map_location=device)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, spent, log = ck["step"], ck["spent"], ck["log"]
        gen.set_state(ck["gen"])
        print(f"resumed at step {step} ({spent:.0f} s spent)", flush=True)
    budget = a.minutes * 60
    # Steps for the schedule: measured from the first 20 steps' rate when timed.
    total = a.steps or None
    t0, last_save = time.time() - spent, time.time()
    while True:
        spent = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and spent >= budget):
            break
        if total is None and step == 20:
            total = int(budget / (spent / 20))
            print(f"{spent / 20 * 1000:.0f} ms a step: {total} steps in {a.minutes} min", flush=True)
        lr = cosine(step, total or 10**9, 200, a.lr, a.lr / 10)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, a.batch, a.length, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for moe in model.moe_layers():
                load = moe.load.float()
                moe.gate.e_score_correction_bias += a.bias_rate * torch.sign(load.mean() - load)
        step += 1
        if step % 100 == 0:
            log["losses"].append((step, round(float(loss), 4)))
            print(f"step {step} loss {float(loss):.3f} lr {lr:.2e} {time.time() - t0:.0f} s", flush=True)
        if time.time() - last_save > a.save_every:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "spent": time.time() - t0,
                        "log": log, "gen": gen.get_state()}, a.checkpoint)
            last_save = time.time()
    val = evaluate(model, valid, a.length, device)
    log.update(steps=step, tokens=step * a.batch * a.length, seconds=round(time.time() - t0, 1),
               valid_loss=round(val, 4), valid_ppl=round(math.exp(val), 2),
               parameters_m=round(parameters_m(model), 2), device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
    print(json.dumps({k: v for k, v in log.items() if k != "losses"}), flush=True)
    save_folder(model, a.tokenizer, a.out, log, a.bare)


if __name__ == "__main__":
    main()
