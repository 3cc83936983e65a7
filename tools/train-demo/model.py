"""The demo model's math for training: DeepSeek-V3 as transformers' `DeepseekV3ForCausalLM`
computes it (MLA with q and kv low-rank projections and the interleaved rotary slice, sigmoid
routing whose choice adds the correction bias and whose weights are renormalised and scaled,
one shared expert, the first layer dense), written for speed on a GPU: scaled-dot-product
attention, experts run on their tokens only. Parameter names are the Hugging Face
checkpoint's, so `state_dict()` saves as one. `finish.py` checks the saved folder against
transformers itself.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 96,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_interleave": True,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "num_nextn_predict_layers": 0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_interleaved(x, cos, sin):
    """transformers' `apply_rotary_pos_emb_interleave`: pairs de-interleaved, then the halves
    rotated. x (B, H, T, d); cos, sin (T, d)."""
    b, h, t, d = x.shape
    x = x.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.nope, self.rope, self.v = (c["num_attention_heads"], c["qk_nope_head_dim"],
                                                c["qk_rope_head_dim"], c["v_head_dim"])
        d, qk = c["hidden_size"], c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.q_a_proj = nn.Linear(d, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
        self.q_b_proj = nn.Linear(c["q_lora_rank"], self.h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, c["kv_lora_rank"] + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(c["kv_lora_rank"], c["rms_norm_eps"])
        self.kv_b_proj = nn.Linear(c["kv_lora_rank"], self.h * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.h * self.v, d, bias=False)
        self.scale = qk ** -0.5

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, self.h, -1).transpose(1, 2)
        q_pass, q_rot = q.split([self.nope, self.rope], dim=-1)
        kv = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = kv.split([kv.shape[-1] - self.rope, self.rope], dim=-1)
        k_pass = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(b, t, self.h, -1).transpose(1, 2)
        k_pass, value = k_pass.split([self.nope, self.v], dim=-1)
        k_rot = k_rot.view(b, 1, t, self.rope)
        q_rot, k_rot = rope_interleaved(q_rot, cos, sin), rope_interleaved(k_rot, cos, sin)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot.expand(-1, self.h, -1, -1)), dim=-1)
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.v))


class Mlp(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c["n_routed_experts"], c["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(c["n_routed_experts"]))


class Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, inter = c["hidden_size"], c["moe_intermediate_size"]
        self.k, self.scale = c["num_experts_per_tok"], c["routed_scaling_factor"]
        self.gate = Router(c)
        self.experts = nn.ModuleList(Mlp(d, inter) for _ in range(c["n_routed_experts"]))
        self.shared_experts = Mlp(d, inter * c["n_shared_experts"])
        self.load = None  # tokens per expert in the last forward (for the bias update)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
        chosen = torch.topk(scores + self.gate.e_score_correction_bias, self.k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * self.scale
        self.load = torch.bincount(chosen.flatten(), minlength=len(self.experts)).detach()
        out = torch.zeros_like(x, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                y = expert(x[token]) * weights[token, slot, None]
                out.index_add_(0, token, y.float())
        return (out.to(x.dtype) + self.shared_experts(x)).view(shape)


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = Moe(c) if moe else Mlp(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c, l >= c["first_k_dense_replace"]) for l in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class DemoModel(nn.Module):
    def __init__(self, c=CONFIG):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = c["qk_rope_head_dim"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset()

    def reset(self):
        std = self.c["initializer_range"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=std)

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, Moe)]

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype))
        return self.lm_head(self.model.norm(x))

    def hf_state_dict(self):
        """The weights under the checkpoint's names (routers' correction biases included)."""
        return {k: v for k, v in self.state_dict().items() if k != "inv_freq"}


def parameters_m(model):
    return sum(p.numel() for p in model.parameters()) / 1e6


def cosine(step, total, warmup, peak, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))
