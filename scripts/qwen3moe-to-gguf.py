#!/usr/bin/env python3
"""Write a Qwen3-MoE safetensors folder (e.g. one from `strata synth --preset qwen3-moe`) as one
GGUF file with the same weight bytes, so llama.cpp and strata run side by side on identical
weights (docs/PERFORMANCE.md, "Prompt products"). BF16 tensors stay BF16; each layer's experts
are stacked into the `[n_expert, ...]` tensors llama.cpp reads. The vocabulary is a placeholder
(one token per id, one merge), enough for `llama-bench`, whose prompts are random token ids.
Norms and the router are stored as F32 (exactly their BF16 values), as llama.cpp's own
conversion stores them.

Usage: python3 scripts/qwen3moe-to-gguf.py MODEL_DIR OUT.gguf --gguf-py PATH/TO/llama.cpp/gguf-py
Needs numpy (and PyYAML, tqdm for gguf-py); not part of the test suite.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


class Tensors:
    """Every tensor of the folder's shards, memory-mapped (no copy until stacked)."""

    def __init__(self, folder):
        self.index = {}
        for shard in sorted(Path(folder).glob("*.safetensors")):
            header, base = read_header(shard)
            data = np.memmap(shard, dtype=np.uint8, mode="r")
            for name, info in header.items():
                self.index[name] = (data, base, info)

    def get(self, name):
        data, base, info = self.index[name]
        start, end = info["data_offsets"]
        raw = data[base + start : base + end]
        dtype = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}[info["dtype"]]
        return raw.view(dtype).reshape(info["shape"]), info["dtype"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf

    cfg = json.loads((Path(args.model) / "config.json").read_text())
    if cfg.get("model_type") != "qwen3_moe":
        sys.exit(f"{args.model}: model_type {cfg.get('model_type')!r}, not qwen3_moe")
    t = Tensors(args.model)
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    layers, experts = cfg["num_hidden_layers"], cfg["num_experts"]
    w.add_name("strata side-by-side")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"<{i}>" for i in range(vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["<0> <1>"])  # llama.cpp refuses a BPE vocabulary without merges
    w.add_bos_token_id(cfg.get("bos_token_id", 0))
    w.add_eos_token_id(cfg.get("eos_token_id", 1))

    def put(gguf_name, array, dtype):
        # Norms and the router as F32, as llama.cpp's own conversion stores them (exact: a
        # BF16 is the top half of an F32).
        if dtype == "BF16" and (array.ndim == 1 or gguf_name.endswith("ffn_gate_inp.weight")):
            array, dtype = (array.astype(np.uint32) << 16).view(np.float32), "F32"
        raw = gguf.GGMLQuantizationType.BF16 if dtype == "BF16" else None
        w.add_tensor(gguf_name, np.ascontiguousarray(array), raw_dtype=raw)

    def one(hf, name):
        put(name, *t.get(hf))

    one("model.embed_tokens.weight", "token_embd.weight")
    one("model.norm.weight", "output_norm.weight")
    one("lm_head.weight", "output.weight")
    for l in range(layers):
        p = f"model.layers.{l}."
        for hf, name in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("self_attn.q_norm", "attn_q_norm"),
            ("self_attn.k_norm", "attn_k_norm"),
            ("mlp.gate", "ffn_gate_inp"),
        ]:
            one(p + hf + ".weight", f"blk.{l}.{name}.weight")
        for hf, name in [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")]:
            parts = [t.get(f"{p}mlp.experts.{e}.{hf}.weight") for e in range(experts)]
            put(f"blk.{l}.{name}.weight", np.stack([a for a, _ in parts]), parts[0][1])
        print(f"layer {l + 1}/{layers}", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


if __name__ == "__main__":
    main()
