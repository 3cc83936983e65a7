"""Quantized GGUF types: strata's logits on the GGUF against strata's logits on the safetensors
copy the converter writes from `gguf`'s own `dequantize` (the same weights in F32), so each
block type's decoding is checked against an independent implementation (ggml's reference, as
`gguf` has it). The two runs differ only in the order of f32 sums: a bound of 1e-5 of the
largest logit (measured: 3e-7).

The 32-weight block types run on every BF16 fixture. The 256-weight ones (the K-quants and
IQ4_XS) need rows of whole 256-weight blocks, which the fixtures' small matrices are not, so
they run on a Qwen3-MoE-shaped model of random weights this module writes with 256-wide matrices
(and the fixture's tokenizer). Each GGUF is checked to hold the type asked for, so a fallback
cannot make a case pass unseen.
"""

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import gguf

from helpers import CONVERTER, bf16_fixtures, csv, fixtures_dir, strata

SUM_TOLERANCE = 1e-5
BLOCK_32 = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
BLOCK_256 = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q4_k_m")
# The ggml types each --outtype must put into the file.
EXPECTED = {t: {t.upper()} for t in BLOCK_32 + BLOCK_256}
EXPECTED["q4_k_m"] = {"Q4_K", "Q6_K"}
FIXTURES = bf16_fixtures()


def write_bf16_safetensors(path, tensors):
    header, offset = {}, 0
    raw = {}
    for name, a in tensors.items():
        bits = (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        raw[name] = bits.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw[name])]}
        offset += len(raw[name])
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in raw.values():
            f.write(b)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A Qwen3-MoE-shaped folder whose every matrix has rows of 256 weights or more."""
    source = fixtures_dir() / "qwen3-moe-tiny"
    if not (source / "config.json").exists():
        pytest.skip(f"{source} is missing")
    folder = tmp_path_factory.mktemp("wide") / "qwen3-moe-wide"
    folder.mkdir()
    cfg = json.loads((source / "config.json").read_text())
    h, heads, kv, hd, inter, experts = 256, 2, 1, 128, 256, 4
    cfg.update(hidden_size=h, num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
               intermediate_size=inter, moe_intermediate_size=inter, num_experts=experts,
               num_experts_per_tok=2, num_hidden_layers=2, max_window_layers=2)
    vocab = cfg["vocab_size"]
    rng = np.random.default_rng(7)
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.05
    norm = lambda n: 1 + 0.1 * rng.standard_normal(n).astype(np.float32)
    t = {"model.embed_tokens.weight": w(vocab, h), "lm_head.weight": w(vocab, h), "model.norm.weight": norm(h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t[f"{p}.input_layernorm.weight"] = norm(h)
        t[f"{p}.post_attention_layernorm.weight"] = norm(h)
        t[f"{p}.self_attn.q_proj.weight"] = w(heads * hd, h)
        t[f"{p}.self_attn.k_proj.weight"] = w(kv * hd, h)
        t[f"{p}.self_attn.v_proj.weight"] = w(kv * hd, h)
        t[f"{p}.self_attn.o_proj.weight"] = w(h, heads * hd)
        t[f"{p}.self_attn.q_norm.weight"] = norm(hd)
        t[f"{p}.self_attn.k_norm.weight"] = norm(hd)
        t[f"{p}.mlp.gate.weight"] = w(experts, h)
        for e in range(experts):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = w(inter, h)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = w(inter, h)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = w(h, inter)
    write_bf16_safetensors(folder / "model.safetensors", t)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def cases():
    out = [(d, t) for d in FIXTURES for t in BLOCK_32]
    out += [("wide", t) for t in BLOCK_256]
    return out


@pytest.fixture(scope="module", params=cases(), ids=lambda p: f"{getattr(p[0], 'name', p[0])}-{p[1]}")
def quantized_model(request, tmp_path_factory):
    folder, outtype = request.param
    if folder == "wide":
        folder = request.getfixturevalue("wide_model")
    tmp = tmp_path_factory.mktemp("gguf-q")
    out, copy = tmp / f"{folder.name}-{outtype}.gguf", tmp / "dequantized"
    cmd = [sys.executable, str(CONVERTER), str(folder), str(out), "--outtype", outtype, "--dequantized-copy", copy]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return folder, outtype, out, copy


def prompts(folder):
    golden = folder / "golden.json"
    if golden.exists():
        return [p["ids"] for p in json.loads(golden.read_text())["prompts"]]
    return [[1, 2, 3, 4, 5, 6, 7, 8], [300, 17, 1200, 5, 5, 9]]


def test_the_file_holds_the_type_asked_for(quantized_model):
    folder, outtype, model, _ = quantized_model
    types = {t.tensor_type.name for t in gguf.GGUFReader(model).tensors}
    assert EXPECTED[outtype] <= types, f"{folder.name} {outtype}: the file holds {sorted(types)}"


def test_quantized_logits_equal_the_dequantized_copy(quantized_model):
    folder, outtype, model, copy = quantized_model
    for p, ids in enumerate(prompts(folder)):
        got = strata("logits", "--model", model, "--ids", csv(ids))
        want = strata("logits", "--model", copy, "--ids", csv(ids))
        absmax = max(abs(v) for v in want["last_logits"])
        worst = max(abs(a - b) for a, b in zip(got["last_logits"], want["last_logits"]))
        assert len(got["last_logits"]) == len(want["last_logits"])
        assert worst <= SUM_TOLERANCE * absmax, f"{folder.name} {outtype} prompt {p}: {worst} > {SUM_TOLERANCE} x {absmax}"
        assert len(got["argmax"]) == len(ids)
