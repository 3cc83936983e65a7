#!/usr/bin/env python3
"""Turns a trained folder (train.py's weights) into the shipped demo model, with goldens from
transformers itself, the way `shared/tools/make_fixtures.py` made the fixtures (its goldens,
INT4 packing and checks are imported from it):

  1. the BF16 folder: config, tokenizer, weights; transformers' `DeepseekV3ForCausalLM` on it
     must give model.py's logits (the training math is transformers' math); its goldens go
     to BF16_DIR/golden.json;
  2. the shipped folder: the routed experts quantized to compressed-tensors INT4 (group 32,
     symmetric, BF16 scales), everything else BF16, in two shards; goldens from transformers
     on the exactly dequantized weights;
  3. perplexities on the held-out text: BF16, INT4, and a unigram model of the training text.

    .venv-fixtures/bin/python tools/train-demo/finish.py --weights DIR --tokenizer DIR --corpus DIR \
        --bf16 BF16_DIR --out crates/cli/default-model [--tools ../shared/tools]
"""

import argparse
import json
import math
import shutil
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from model import CONFIG, DemoModel  # noqa: E402

PROMPTS = ["The king said", "And it came to pass in those days"]
CHAT = 'What does "river" mean?'
SPEC = {"family": "deepseek"}
EOT = "<|endoftext|>"


def folder_files(weights, tokenizer, out):
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(weights).glob("*.safetensors"):
        shutil.copy(f, out / f.name)
    shutil.copy(Path(weights) / "model.safetensors.index.json", out / "model.safetensors.index.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer) / f, out / f)
    (out / "config.json").write_text(json.dumps({**CONFIG, "bos_token_id": 4091, "eos_token_id": 4095}, indent=2) + "\n")
    gen = {"bos_token_id": 4091, "eos_token_id": [4095, 4091], "temperature": 0.7, "top_p": 0.9, "do_sample": True}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def prompts(mf, tok, valid_ids):
    """Token ids: a plain prompt, the chat one, another plain one, and two held-out windows
    (64 and 200 tokens)."""
    chat = tok.apply_chat_template([{"role": "user", "content": CHAT}], tokenize=False, add_generation_prompt=True)
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:1]]
    ids.append(tok.encode(chat, add_special_tokens=False))
    ids += [valid_ids[1000:1064], valid_ids[3000:3200]]
    ids.insert(2, tok.encode(PROMPTS[1], add_special_tokens=False))
    return [[int(i) for i in p] for p in ids]


def stream(tok, path):
    eot = tok.convert_tokens_to_ids(EOT)
    ids = []
    for doc in Path(path).read_text().split("\n\n"):
        ids += tok.encode(doc, add_special_tokens=False) + [eot]
    return ids


def perplexity(mf, model, ids, length=256, most=32768):
    torch = mf.torch
    ids = ids[: most + 1]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids) - 1, length):
            x = torch.tensor([ids[i:i + length + 1]])
            if x.shape[1] < 2:
                break
            logits = model(input_ids=x[:, :-1], use_cache=False).logits[0].float()
            total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            count += x.shape[1] - 1
    return math.exp(total / count), count


def unigram_perplexity(train_ids, valid_ids, vocab, most=32768):
    counts = Counter(train_ids)
    n = len(train_ids)
    valid = valid_ids[1: most + 1]
    nll = -sum(math.log((counts[t] + 1) / (n + vocab)) for t in valid)
    return math.exp(nll / len(valid))


def quantize(mf, src, out):
    """The shipped folder: experts INT4, the rest as stored; returns the dequantized f32 weights."""
    sd, _ = mf.read_checkpoint(str(src))
    qsd, deq = {}, {}
    for k in sorted(sd):
        v = sd[k]
        if mf.is_int4_target(k):
            comp, d = mf.int4_compress(v.to(mf.torch.float32))
            base = k[: -len("weight")]
            for part in ("weight_packed", "weight_scale", "weight_shape"):
                qsd[base + part] = comp[part]
            deq[k] = d
        else:
            qsd[k] = v
            deq[k] = v.to(mf.torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("model-*.safetensors"):
        f.unlink()
    mf.write_sharded(str(out), qsd, 10 << 20)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = mf.int4_quant_config_dict()
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out / f)
    return deq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--bf16", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tools", default=str(HERE.parents[1].parent / "shared" / "tools"))
    a = ap.parse_args()
    sys.path.insert(0, a.tools)
    import make_fixtures as mf

    torch = mf.torch
    folder_files(a.weights, a.tokenizer, a.bf16)
    tok = mf.load_tokenizer(str(a.bf16))
    valid_ids = stream(tok, a.corpus / "valid.txt")
    ps = prompts(mf, tok, valid_ids)
    n_new = 24
    tg, cg = mf.tokenizer_goldens(tok), mf.chat_goldens(tok, "deepseek")

    sd, _ = mf.read_checkpoint(str(a.bf16))
    reference = mf.model_from_checkpoint_dict(str(a.bf16), {k: v.to(torch.float32) for k, v in sd.items()}, SPEC)
    ours = DemoModel().eval()
    ours.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=False)
    with torch.no_grad():
        x = torch.tensor([ps[4]])
        diff = float((ours(x) - reference(input_ids=x, use_cache=False).logits).abs().max())
    print(f"model.py against transformers: max |logit diff| {diff:.2e}", flush=True)
    assert diff < 1e-3, "the training math is not transformers' math"
    res, tensors = mf.compute_model_goldens(reference, ps, n_new)
    mf.write_golden(str(a.bf16), "strata-demo (bf16)", SPEC, 0, res, tensors, tg, cg)
    ppl_bf16, counted = perplexity(mf, reference, valid_ids)

    deq = quantize(mf, a.bf16, a.out)
    model = mf.model_from_checkpoint_dict(str(a.out), deq, SPEC)
    res, tensors = mf.compute_model_goldens(model, ps, n_new)
    mf.write_golden(str(a.out), "strata-demo", SPEC, 0, res, tensors, tg, cg, extra={
        "dtype_on_disk": "routed experts: int4 pack-quantized (weight_packed I32, weight_scale BF16, "
                         "weight_shape I64); everything else bfloat16",
        "dequantization": "W[i,j] = q[i,j] * float32(weight_scale[i, j // 32]), exact in float32; the "
                          "goldens use these weights",
    })
    ppl_int4, _ = perplexity(mf, model, valid_ids)
    train_ids = stream(tok, a.corpus / "train.txt")
    ppl_unigram = unigram_perplexity(train_ids, valid_ids, CONFIG["vocab_size"])
    report = {
        "held_out_tokens": counted,
        "perplexity_bf16": round(ppl_bf16, 2),
        "perplexity_int4": round(ppl_int4, 2),
        "perplexity_unigram": round(ppl_unigram, 1),
        "model_py_vs_transformers_max_logit_diff": diff,
        "train": json.loads((Path(a.weights) / "train.json").read_text()),
    }
    report["train"].pop("losses", None)
    (a.out / "demo_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
