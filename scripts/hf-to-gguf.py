#!/usr/bin/env python3
"""Write a Hugging Face model folder (safetensors) as one GGUF file with the `gguf` package,
the way llama.cpp's converter lays one out: its tensor names (`gguf.get_tensor_name_map`), each
layer's experts stacked into one `[n_expert, ...]` tensor per projection, Llama's q and k rows
permuted for its rope, norms and routers in F32, the other matrices in the type asked for (`--outtype`), the vocabulary (a byte-level BPE:
tokens, token types, merges, pre-tokenizer name), special ids and chat template.

It streams: every tensor's name, shape and type first, then one tensor at a time (a layer's
experts stacked only when written, quantized a chunk of rows at a time), so a model larger than
RAM converts. The tests (`tests/gguf`) make their GGUF files from the fixtures with it; it is also how to make
one of a model `strata synth` wrote, to run llama.cpp and strata side by side on the same weight
bytes (BF16 stays BF16; a folder without `tokenizer.json` gets a placeholder vocabulary, one token
per id, enough for `llama-bench`).

Usage: python3 scripts/hf-to-gguf.py MODEL_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0|q4_k|...]
(the quantized types by `gguf` or, for those it cannot write, `gguf_quants.py`'s one-pass
quantizers: valid blocks for tests and benchmarks, not llama.cpp's quality).
Needs `gguf` and `numpy` (tests/gguf/requirements.txt).
"""

import argparse
import json
import re
import struct
import math
import sys
from pathlib import Path

import numpy as np

import gguf
import gguf_quants

# Hugging Face `model_type` -> (GGUF architecture, llama.cpp's pre-tokenizer name).
ARCHES = {
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "deepseek_v3": gguf.MODEL_ARCH.DEEPSEEK2,
    "kimi_k2": gguf.MODEL_ARCH.DEEPSEEK2,
    "kimi_linear": gguf.MODEL_ARCH.KIMI_LINEAR,
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mistral": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
}

# The split patterns (in order) of the byte-level BPE pre-tokenizers llama.cpp names.
PRE_TOKENIZERS = {
    (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",): "qwen2",
    (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",): "llama-bpe",
    (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ): "deepseek-v3",
}

Q = gguf.GGMLQuantizationType
F = gguf.LlamaFileType
# --outtype -> (the type of the matrices, the file type recorded). q4_k_m is a Q4_K_M-like mix:
# Q6_K for attn_v, every ffn_down and the output matrix, Q4_K for the others (llama.cpp's own
# mix gives Q6_K to only some layers' ffn_down).
OUTTYPES = {
    "f32": (Q.F32, F.ALL_F32),
    "f16": (Q.F16, F.MOSTLY_F16),
    "bf16": (Q.BF16, F.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, F.MOSTLY_Q8_0),
    "q4_0": (Q.Q4_0, F.MOSTLY_Q4_0),
    "q4_1": (Q.Q4_1, F.MOSTLY_Q4_1),
    "q5_0": (Q.Q5_0, F.MOSTLY_Q5_0),
    "q5_1": (Q.Q5_1, F.MOSTLY_Q5_1),
    "q2_k": (Q.Q2_K, F.MOSTLY_Q2_K),
    "q3_k": (Q.Q3_K, F.MOSTLY_Q3_K_M),
    "q4_k": (Q.Q4_K, F.MOSTLY_Q4_K_S),
    "q5_k": (Q.Q5_K, F.MOSTLY_Q5_K_S),
    "q6_k": (Q.Q6_K, F.MOSTLY_Q6_K),
    "iq4_nl": (Q.IQ4_NL, F.MOSTLY_IQ4_NL),
    "iq4_xs": (Q.IQ4_XS, F.MOSTLY_IQ4_XS),
    "mxfp4": (Q.MXFP4, F.MOSTLY_MXFP4_MOE),
    "q4_k_m": (Q.Q4_K, F.MOSTLY_Q4_K_M),
}
MORE_BITS = ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight", "output.weight")

# The type llama.cpp writes instead when rows are not whole blocks of the one asked for.
FALLBACK = {Q.Q2_K: Q.IQ4_NL, Q.Q3_K: Q.IQ4_NL, Q.IQ4_XS: Q.IQ4_NL, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def read_tensors(folder):
    """name -> (array, safetensors dtype): BF16 as its raw uint16 bits, memory-mapped (no copy
    until a tensor is converted or stacked)."""
    out = {}
    index = Path(folder) / "model.safetensors.index.json"
    if index.exists():
        shards = sorted({Path(folder) / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        shards = [Path(folder) / "model.safetensors"]
    kinds = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}
    for shard in shards:
        with open(shard, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        data = np.memmap(shard, dtype=np.uint8, mode="r")
        for name, info in header.items():
            if info["dtype"] not in kinds:
                sys.exit(f"{shard}: tensor {name}: dtype {info['dtype']} is not converted by this script")
            lo, hi = info["data_offsets"]
            raw = data[8 + n + lo : 8 + n + hi].view(kinds[info["dtype"]]).reshape(info["shape"])
            out[name] = (raw, info["dtype"])
    return out


def as_f32(array, dtype):
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


class Stack:
    """A layer's experts of one projection, stacked into [E, ...] only when written (so the
    converter holds one such tensor at a time, whatever the model's size)."""

    def __init__(self, parts):
        self.parts = parts
        self.shape = (len(parts), *parts[0].shape)
        self.ndim = len(self.shape)

    def array(self):
        return np.stack(self.parts)


def stack_experts(tensors):
    """`...mlp.experts.E.proj.weight` -> one `...mlp.experts.proj.weight` of [E, ...] per layer
    (a `Stack`)."""
    pattern = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")
    groups = {}
    rest = {}
    for name, a in tensors.items():
        m = pattern.match(name)
        if m:
            groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = a
        else:
            rest[name] = a
    for (prefix, proj), experts in groups.items():
        parts = [experts[e] for e in sorted(experts)]
        rest[f"{prefix}.{proj}.weight"] = (Stack([a for a, _ in parts]), parts[0][1])
    return rest


def permute_rows(array, heads):
    """llama.cpp's permutation of Llama's q and k rows: within each head, row 2j takes row j and
    row 2j + 1 row j + head_dim / 2, so its adjacent-pair rope rotates what Hugging Face's
    half-split rope does."""
    rows = array.shape[0]
    return array.reshape(heads, 2, rows // heads // 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


def tensor_type(gguf_name, array, outtype, mix):
    """llama.cpp keeps 1-D tensors (norms, biases), the routers, Kimi Linear's convolution taps
    and every tensor not named `.weight` (its `ssm_a`) in F32; rows that are not whole blocks
    take the fallback type, else F16, as llama.cpp does."""
    if array.ndim == 1 or gguf_name.endswith(("ffn_gate_inp.weight", "exp_probs_b.bias")):
        return Q.F32
    if not gguf_name.endswith(".weight") or re.search(r"ssm_conv1d_[qkv]\.weight$", gguf_name):
        return Q.F32
    if mix and gguf_name.endswith(MORE_BITS):
        outtype = Q.Q6_K
    while array.shape[-1] % gguf.GGML_QUANT_SIZES[outtype][0]:
        outtype = FALLBACK.get(outtype, Q.F16)
    return outtype


def write_safetensors(path, tensors):
    """name -> float32 array, as one F32 safetensors file."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


def dequantized_copy(folder, out, arrays):
    """The folder with its weights replaced by what the GGUF holds, dequantized by `gguf` (F32)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("model.safetensors.index.json", "golden.json"):
            (out / f.name).write_bytes(f.read_bytes())
    write_safetensors(out / "model.safetensors", arrays)


def add_placeholder_vocab(w, cfg):
    """A folder without a tokenizer (`strata synth`): one token per id and one merge, enough for
    `llama-bench`, whose prompts are random ids."""
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"<{i}>" for i in range(vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["<0> <1>"])  # llama.cpp refuses a BPE vocabulary without merges
    w.add_bos_token_id(cfg.get("bos_token_id", 0))
    w.add_eos_token_id(cfg.get("eos_token_id", 1))


def pre_tokenizer(folder, tok):
    """llama.cpp's name for the tokenizer's split pattern."""
    pre = tok.get("pre_tokenizer") or {}
    splits = tuple(
        (p.get("pattern") or {}).get("Regex") for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"
    )
    if splits in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[splits]
    sys.exit(f"{folder}: the tokenizer's split patterns are not ones this script names")


def add_vocab(w, folder, vocab_size):
    tok = json.loads((Path(folder) / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE":
        sys.exit(f"{folder}: only byte-level BPE vocabularies are converted by this script")
    pre = pre_tokenizer(folder, tok)
    vocab = dict(tok["model"]["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    # As llama.cpp's converter: one token per row of the embedding, unused ids as [PADn].
    size = max(max(vocab.values()) + 1, vocab_size)
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        s = by_id.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif s in added:
            tokens.append(s)
            types.append(gguf.TokenType.CONTROL if added[s].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(s)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True)
    special.add_to_gguf(w)


def add_spm_vocab(w, model_file, vocab_size):
    """A SentencePiece model's vocabulary as llama.cpp's converter writes it (`llama`: pieces,
    scores, types; byte pieces as BYTE), padded with unused [PADn] to the embedding's rows."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def add_hparams(w, cfg, arch):
    """The keys llama.cpp's converter writes for the architecture."""
    if arch == gguf.MODEL_ARCH.KIMI_LINEAR:
        add_kimi_linear_hparams(w, cfg)
        return
    heads = cfg["num_attention_heads"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    if "num_experts_per_tok" in cfg:
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch == gguf.MODEL_ARCH.DEEPSEEK2:
        nope, rope, v, kv_lora = (cfg[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
        if cfg.get("q_lora_rank"):
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(kv_lora)
        # MLA as llama.cpp runs it (absorbed): keys and values in the latent; the heads' own
        # sizes in the `_mla` keys.
        w.add_key_length(kv_lora + rope)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
        w.add_rope_dimension_count(rope)
        w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
        w.add_expert_weights_scale(cfg.get("routed_scaling_factor", 1.0))
        w.add_expert_weights_norm(cfg.get("norm_topk_prob", False))
        gating = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
        w.add_expert_gating_func(gating[cfg.get("scoring_func", "softmax")])
        w.add_expert_group_count(cfg.get("n_group", 1))
        w.add_expert_group_used_count(cfg.get("topk_group", 1))
        scaling = cfg.get("rope_scaling") or {}
        if scaling.get("type", scaling.get("rope_type")) == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(scaling["factor"])
            w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
            w.add_rope_scaling_yarn_log_mul(0.1 * scaling.get("mscale_all_dim", 0.0))
            if "beta_fast" in scaling:
                w.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
            if "beta_slow" in scaling:
                w.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
        return
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    if "head_dim" in cfg:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if experts:
        w.add_expert_count(experts)
    if cfg.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if "moe_intermediate_size" in cfg:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])


def add_kimi_linear_hparams(w, cfg):
    """Kimi Linear's keys as llama.cpp's converter writes them: a layer's KV head count says its
    kind (0: KDA, 1: MLA, whose heads share one latent), the KDA sizes under `ssm`/`kda`, the MLA
    sizes as for `deepseek2`. Neither the renormalisation of the chosen experts' weights (always
    on) nor the KDA head count (`head_count`'s) has a key."""
    la = cfg["linear_attn_config"]
    layers = cfg["num_hidden_layers"]
    nope, rope, v, kv_lora = (cfg[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    w.add_block_count(layers)
    w.add_context_length(cfg.get("max_position_embeddings", cfg.get("model_max_length")))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv([1 if i + 1 in la["full_attn_layers"] else 0 for i in range(layers)])
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_token"])
    w.add_expert_group_used_count(cfg.get("topk_group", 1))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_ssm_conv_kernel(la["short_conv_kernel_size"])
    w.add_kda_head_dim(la["head_dim"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_rope_dimension_count(rope)
    w.add_key_length(kv_lora + rope)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("num_shared_experts", 1))
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    w.add_expert_weights_scale(cfg.get("routed_scaling_factor", 1.0))


def rope_freqs(cfg):
    """Llama 3's rope scaling as llama.cpp's converter stores it: a `rope_freqs` tensor of one
    divisor per frequency (1 for short wavelengths, the factor for long ones, a blend between),
    or None."""
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    theta = cfg.get("rope_theta", 10000.0)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * theta ** (i / dim)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def split_kv_b(array, cfg):
    """DeepSeek's kv_b as newer llama.cpp conversions store it: per head, k_b (the key part,
    transposed: [kv_lora, nope]) and v_b ([v, kv_lora])."""
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    kv_b = array.reshape(heads, nope + v, array.shape[-1])
    return np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)), np.ascontiguousarray(kv_b[:, nope:, :])


def back_to_hf(hf_name, stored, cfg, arch, gguf_name):
    """The Hugging Face tensors a written tensor came from (undoing the stacking and the
    permutation; split kv_b halves are joined by the caller)."""
    if arch == gguf.MODEL_ARCH.LLAMA and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg["num_attention_heads"] if gguf_name.endswith("attn_q.weight") else cfg["num_key_value_heads"]
        rows = stored.shape[0]
        stored = stored.reshape(heads, rows // heads // 2, 2, *stored.shape[1:]).swapaxes(1, 2).reshape(stored.shape)
    if hf_name.endswith("e_score_correction.bias"):
        hf_name = hf_name.replace("e_score_correction.bias", "e_score_correction_bias")
    if arch == gguf.MODEL_ARCH.KIMI_LINEAR:
        if hf_name.endswith(".A_log"):
            stored = np.log(-stored)
        if hf_name.endswith(".dt_proj.bias"):
            hf_name = hf_name.replace(".dt_proj.bias", ".dt_bias")
        if hf_name.endswith("_conv1d.weight"):
            stored = stored.reshape(stored.shape[1], 1, stored.shape[3])
    if hf_name.endswith("shared_expert_gate.weight"):
        stored = stored.reshape(1, -1)
    m = re.match(r"^(.*\.experts)\.(\w+)\.weight$", hf_name)
    if m and "shared_experts" not in hf_name:
        return [(f"{m.group(1)}.{e}.{m.group(2)}.weight", stored[e]) for e in range(stored.shape[0])]
    return [(hf_name, stored)]


def repeat_layers(tensors, have, cfg):
    """The tensors of cfg's `num_hidden_layers` decoder layers from a folder of `have`: layer i is
    the folder's layer i, and past its last a copy of one of its layers of the same kind (the
    first `first_k_dense_replace` dense ones stay first; the others repeat in turn)."""
    layers = cfg["num_hidden_layers"]
    if layers == have:
        return tensors
    first = min(cfg.get("first_k_dense_replace", 0), have - 1)

    def source(i):
        return i if i < first else first + (i - first) % (have - first)

    pattern = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
    copies = {}
    for i in range(layers):
        copies.setdefault(source(i), []).append(i)
    out = {}
    for name, a in tensors.items():
        m = pattern.match(name)
        if not m:
            out[name] = a
            continue
        for i in copies.get(int(m.group(1)), []):
            out[f"model.layers.{i}.{m.group(2)}"] = a
    return out


def hf_tensors(folder, cfg, arch, whole_kv_b, have):
    """(name, array, source dtype) in the order written, with the renames llama.cpp makes."""
    tensors = repeat_layers(read_tensors(folder), have, cfg)
    for hf_name, (array, source) in sorted(stack_experts(tensors).items()):
        if hf_name.endswith("e_score_correction_bias"):
            hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        if arch == gguf.MODEL_ARCH.KIMI_LINEAR:
            hf_name, array, source = kimi_linear_tensor(hf_name, array, source)
        mla = arch in (gguf.MODEL_ARCH.DEEPSEEK2, gguf.MODEL_ARCH.KIMI_LINEAR)
        if mla and hf_name.endswith("kv_b_proj.weight") and not whole_kv_b:
            k_b, v_b = split_kv_b(np.asarray(array), cfg)
            yield hf_name.replace("kv_b_proj", "k_b_proj"), k_b, source
            yield hf_name.replace("kv_b_proj", "v_b_proj"), v_b, source
            continue
        if hf_name.endswith("shared_expert_gate.weight"):
            array = np.asarray(array).reshape(-1)  # llama.cpp stores this (1, D) gate as a vector
        yield hf_name, array, source


def kimi_linear_tensor(hf_name, array, source):
    """llama.cpp's changes to Kimi Linear's KDA tensors: A_log stored as -exp(A_log), dt_bias
    named as a bias of dt_proj, the convolution taps [C, 1, K] as [1, C, 1, K]."""
    if hf_name.endswith(".A_log"):
        return hf_name, -np.exp(as_f32(np.asarray(array), source)), "F32"
    if hf_name.endswith(".dt_bias"):
        return hf_name.replace(".dt_bias", ".dt_proj.bias"), array, source
    if hf_name.endswith("_conv1d.weight"):
        channels, _, taps = array.shape
        return hf_name, np.asarray(array).reshape(1, channels, 1, taps), source
    return hf_name, array, source


def gguf_name(names, hf_name, folder, arch):
    base = hf_name.removesuffix(".weight").removesuffix(".bias")
    mapped = names.get_name(base)
    if mapped is None:
        sys.exit(f"{folder}: tensor {hf_name} has no GGUF name for {gguf.MODEL_ARCH_NAMES[arch]}")
    return mapped + hf_name[len(base) :]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=sorted(OUTTYPES), default="bf16")
    ap.add_argument(
        "--dequantized-copy",
        metavar="DIR",
        help="also write the model folder with F32 weights equal to what the GGUF stores (gguf's dequantize)",
    )
    ap.add_argument(
        "--spm-model",
        metavar="FILE",
        help="write this SentencePiece model's vocabulary (llama.cpp's `llama` type) instead of tokenizer.json's",
    )
    ap.add_argument(
        "--split-max-tensors",
        type=int,
        default=0,
        metavar="N",
        help="split the model into files of at most N tensors each (OUT-00001-of-0000K.gguf ...)",
    )
    ap.add_argument(
        "--layers",
        type=int,
        metavar="N",
        help="write N decoder layers, those past the folder's own copies of its layers (a model "
        "larger than RAM for benchmarks, from a small `strata synth` folder)",
    )
    ap.add_argument(
        "--whole-kv-b",
        action="store_true",
        help="DeepSeek, Kimi Linear: keep kv_b_proj whole (older conversions) instead of k_b and v_b",
    )
    args = ap.parse_args()
    folder = Path(args.model_dir)
    cfg = json.loads((folder / "config.json").read_text())
    model_type = cfg.get("model_type")
    if model_type not in ARCHES:
        sys.exit(f"{folder}: model_type {model_type!r} is not converted by this script (known: {sorted(ARCHES)})")
    arch = ARCHES[model_type]
    have = cfg["num_hidden_layers"]
    if args.layers:
        if args.dequantized_copy or args.layers < 1:
            sys.exit("--layers N: N >= 1, and not with --dequantized-copy")
        cfg["num_hidden_layers"] = args.layers
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])

    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch], split_max_tensors=args.split_max_tensors)
    w.add_name(folder.name)
    add_hparams(w, cfg, arch)
    outtype, file_type = OUTTYPES[args.outtype]
    w.add_file_type(file_type)
    if args.spm_model:
        add_spm_vocab(w, args.spm_model, cfg["vocab_size"])
    elif (folder / "tokenizer.json").exists():
        add_vocab(w, folder, cfg["vocab_size"])
    else:
        add_placeholder_vocab(w, cfg)

    # Two passes, so only one tensor is in memory at a time: every tensor's name, shape and type
    # first (the header), then each one's bytes, converted and written in the same order.
    mix = args.outtype == "q4_k_m"
    plan = []
    for hf_name, array, source in hf_tensors(folder, cfg, arch, args.whole_kv_b, have):
        name = gguf_name(names, hf_name, folder, arch)
        ty = tensor_type(name, array, outtype, mix)
        block, block_bytes = gguf.GGML_QUANT_SIZES[ty]
        nbytes = int(np.prod(array.shape[:-1])) * (array.shape[-1] // block) * block_bytes
        w.add_tensor_info(name, list(array.shape), np.float32, nbytes, raw_dtype=ty)
        plan.append((name, ty))
    freqs = rope_freqs(cfg)
    if freqs is not None:
        w.add_tensor_info("rope_freqs.weight", list(freqs.shape), np.float32, freqs.nbytes, raw_dtype=Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    dequantized = {}
    tensors = hf_tensors(folder, cfg, arch, args.whole_kv_b, have)
    for i, ((hf_name, array, source), (name, ty)) in enumerate(zip(tensors, plan)):
        if isinstance(array, Stack):
            array = array.array()
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg["num_attention_heads"] if name.endswith("attn_q.weight") else cfg["num_key_value_heads"]
            array = permute_rows(array, heads)
        if source == "BF16" and ty == Q.BF16:
            data = np.ascontiguousarray(array)  # the same bits
        else:
            data = gguf_quants.quantize(array, ty, lambda rows: as_f32(rows, source))
        w.write_tensor_data(data)
        if sys.stderr.isatty():
            print(f"\r{i + 1}/{len(plan)} tensors", end="", file=sys.stderr, flush=True)
        if args.dequantized_copy:
            stored = gguf.quants.dequantize(data, ty).reshape(array.shape)
            for hf, a in back_to_hf(hf_name, stored, cfg, arch, name):
                dequantized[hf] = a
        del array, data
    if freqs is not None:
        w.write_tensor_data(freqs)
    w.close()
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.dequantized_copy:
        k_b = {n: a for n, a in dequantized.items() if n.endswith("k_b_proj.weight")}
        for n, a in k_b.items():
            v_b = dequantized.pop(n.replace("k_b_proj", "v_b_proj"))
            dequantized.pop(n)
            kv_b = np.concatenate([a.transpose(0, 2, 1), v_b], axis=1)
            dequantized[n.replace("k_b_proj", "kv_b_proj")] = kv_b.reshape(-1, kv_b.shape[-1])
        dequantized_copy(folder, Path(args.dequantized_copy), dequantized)


if __name__ == "__main__":
    main()
