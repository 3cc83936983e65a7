#!/usr/bin/env python3
"""Build the repository's own reference fixtures beside this script, the way
`shared/tools/make_fixtures.py` built the others (its tokenizer, weight init, goldens and checks,
imported from it):

  llama-dense-tiny   LlamaForCausalLM: GQA, Llama 3 rope scaling (`rope_type` llama3),
                     separate LM head, Mistral-style tokenizer and template
  qwen2-dense-tiny   Qwen2ForCausalLM: GQA with q/k/v biases, tied embeddings, ChatML
  qwen3-dense-tiny   Qwen3ForCausalLM: GQA with per-head q/k RMSNorm, tied embeddings, ChatML
  qwen2-moe-tiny     Qwen2MoeForCausalLM: GQA with q/k/v biases, softmax top-2 of 8 experts (not
                     renormalised), a shared expert scaled by sigmoid(shared_expert_gate . x)

Each folder holds config.json, generation_config.json, the bf16 safetensors, tokenizer files,
golden.json and golden.safetensors (transformers, float32, eager attention), and is reloaded
with from_pretrained and checked against its goldens before the script ends.

    python3 -m venv .venv-fixtures && .venv-fixtures/bin/pip install -r ../shared/tools/requirements-fixtures.txt
    .venv-fixtures/bin/python tests/data/make_fixtures.py [--tools ../shared/tools] [--seed 0]

Kept out of CI (it needs torch); the folders it writes are committed.
"""

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SPECS = {
    "llama-dense-tiny": dict(
        family="mistral", arch="llama", hidden=64, inter=128, layers=2, heads=4, kv_heads=2,
        rope_theta=500000.0, max_pos=1024, tie=False, shard="400KB",
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64)),
    "qwen2-dense-tiny": dict(
        family="qwen", arch="qwen2", hidden=64, inter=128, layers=2, heads=4, kv_heads=2,
        rope_theta=1000000.0, max_pos=1024, tie=True, shard="400KB"),
    "qwen3-dense-tiny": dict(
        family="qwen", arch="qwen3", hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32,
        rope_theta=1000000.0, max_pos=1024, tie=True, shard="400KB"),
    "qwen2-moe-tiny": dict(
        family="qwen", arch="qwen2_moe", hidden=64, inter=128, moe_inter=32, shared_inter=64, experts=8, topk=2,
        layers=2, heads=4, kv_heads=2, rope_theta=1000000.0, max_pos=1024, tie=False, shard="400KB"),
}

CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "qwen2_moe": "Qwen2MoeForCausalLM"}


def dense_config(mf, spec, vocab_size, tok_ids):
    """config.json in the style of the real checkpoints of each architecture."""
    arch = spec["arch"]
    qwen = spec["family"] == "qwen"
    cfg = {
        "architectures": [CLASSES[arch]],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok_ids["<|endoftext|>" if qwen else "<s>"],
        "eos_token_id": tok_ids["<|im_end|>" if qwen else "</s>"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["inter"],
        "max_position_embeddings": spec["max_pos"],
        "model_type": arch,
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": 1e-06 if qwen else 1e-05,
        "rope_scaling": spec.get("rope_scaling"),
        "rope_theta": spec["rope_theta"],
        "tie_word_embeddings": spec["tie"],
        "torch_dtype": "bfloat16",
        "transformers_version": mf.transformers.__version__,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    if arch == "llama":
        cfg["mlp_bias"] = False
        cfg["pretraining_tp"] = 1
    else:
        cfg.update(sliding_window=None, use_sliding_window=False, max_window_layers=spec["layers"])
    if arch in ("qwen2", "qwen2_moe"):
        del cfg["attention_bias"]  # q/k/v biases always (Qwen2-MoE: `qkv_bias`, true by default)
    if arch == "qwen2_moe":
        cfg.update(num_experts=spec["experts"], num_experts_per_tok=spec["topk"],
                   moe_intermediate_size=spec["moe_inter"], shared_expert_intermediate_size=spec["shared_inter"],
                   norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True,
                   output_router_logits=False, router_aux_loss_coef=0.001)
    if "head_dim" in spec:
        cfg["head_dim"] = spec["head_dim"]
    return cfg


def patch(mf):
    """Teaches make_fixtures the dense specs (those with an `arch`); the MoE ones are untouched."""
    real_style_config, build_model, init_weights = mf.real_style_config, mf.build_model, mf.init_weights
    router_classes = mf.router_class_names

    def config(name, spec, vocab_size, tok_ids):
        if "arch" not in spec:
            return real_style_config(name, spec, vocab_size, tok_ids)
        return dense_config(mf, spec, vocab_size, tok_ids)

    def model(folder, spec):
        if "arch" not in spec:
            return build_model(folder, spec)
        cfg = mf.transformers.AutoConfig.from_pretrained(folder)
        cls = getattr(mf.transformers, CLASSES[spec["arch"]])
        m = cls._from_config(cfg, attn_implementation="eager", dtype=mf.torch.float32,
                             **({"experts_implementation": "eager"} if "experts" in spec else {}))
        m.eval()
        return m

    def weights(model, spec, n_real_tokens, gen):
        init_weights(model, spec, n_real_tokens, gen)
        if spec.get("tie"):
            # The tied rows past the tokenizer's vocabulary give a logit of exactly 0, as the
            # separate heads' do.
            with mf.torch.no_grad():
                model.model.embed_tokens.weight[n_real_tokens:] = 0.0

    mf.real_style_config, mf.build_model, mf.init_weights = config, model, weights
    mf.router_class_names = lambda: router_classes() + ("Qwen2MoeTopKRouter",)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", default=str(HERE.parents[1].parent / "shared" / "tools"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE))
    a = ap.parse_args()
    sys.path.insert(0, a.tools)
    import make_fixtures as mf

    patch(mf)
    shared = mf.SPECS["shared"]
    base_tok = mf.train_tokenizer(shared["bpe_vocab"])
    lengths, n_new = shared["prompt_lengths"], shared["gen_new_tokens"]
    report = {}
    for mi, (name, spec) in enumerate(SPECS.items()):
        print(f"building {name}", flush=True)
        # Model indices after make_fixtures' own, so no weights repeat theirs.
        folder, model, *_ = mf.build_family_model(a.out, name, spec, a.seed, 100 + mi, base_tok, lengths, n_new)
        reloaded = mf.transformers.AutoModelForCausalLM.from_pretrained(
            folder, attn_implementation="eager", dtype=mf.torch.float32,
            **({"experts_implementation": "eager"} if "experts" in spec else {})).eval()
        report[name] = {"model": mf.check_against_golden(reloaded, folder),
                        "tokenizer": mf.check_tokenizer(folder)}
    with open(os.path.join(a.out, "verify_report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
