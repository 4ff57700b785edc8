"""Logits of an exported model, computed in plain PyTorch from the layout the README documents.

Usage: iota_forward.py <model dir> <tokens.json> <out.json>

Reads `config.json` and `model.safetensors` as `iota-p2p export` writes them, with or without
IOTA bottlenecks, and runs the decoder by hand: byte embedding; per layer, pre-norm attention
(RMSNorm, q/k/v projections, rotary embeddings rotating the two halves of each head, with
Llama 3's frequency scaling when `rope_scaling` is set, causal
softmax attention in which each of the `num_key_value_heads` key-value heads serves that many
consecutive query heads, output projection) and a pre-norm SwiGLU MLP; at the end of every stage but
the last (`iota_stage_layers`) the boundary `y = h[..., :b] + down(rmsnorm(h))`,
`h = pad(y, d) + up(rmsnorm(y))`; final RMSNorm and LM head (the embedding when tied). Writes the logits, nested as
[batch][position][256], to `out.json`. The export test compares them with the Rust stages'.
"""

import json
import math
import sys

import torch
from safetensors.torch import load_file


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def main() -> None:
    model_dir, tokens_path, out_path = sys.argv[1:4]
    with open(f"{model_dir}/config.json") as f:
        cfg = json.load(f)
    w = load_file(f"{model_dir}/model.safetensors")
    d, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    hd = d // heads
    kv = cfg.get("num_key_value_heads", heads)
    b = cfg.get("iota_bottleneck", 0)
    ends = {end - 1: k for k, (_, end) in enumerate(cfg.get("iota_stage_layers", [])[:-1])}
    with open(tokens_path) as f:
        tokens = torch.tensor(json.load(f), dtype=torch.long)
    batch, t = tokens.shape
    inv = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    scaling = cfg.get("rope_scaling")
    if scaling:
        # Llama 3's: wavelengths past old/low divided by factor, below old/high kept, blended
        # linearly in old/wavelength between.
        old, factor = scaling["original_max_position_embeddings"], scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen < old / high, inv, torch.where(wavelen > old / low, inv / factor, blended))
    angles = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = angles.cos().float(), angles.sin().float()

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    mask = torch.full((t, t), -math.inf).triu(1)
    with torch.no_grad():
        h = w["model.embed_tokens.weight"][tokens]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = rms(h, w[p + "input_layernorm.weight"], eps)
            split = lambda name, n: (x @ w[p + name].T).view(batch, t, n, hd).transpose(1, 2)
            q = rope(split("self_attn.q_proj.weight", heads))
            k = rope(split("self_attn.k_proj.weight", kv)).repeat_interleave(heads // kv, 1)
            v = split("self_attn.v_proj.weight", kv).repeat_interleave(heads // kv, 1)
            att = (q @ k.transpose(-1, -2) / math.sqrt(hd) + mask).softmax(-1) @ v
            h = h + att.transpose(1, 2).reshape(batch, t, d) @ w[p + "self_attn.o_proj.weight"].T
            x = rms(h, w[p + "post_attention_layernorm.weight"], eps)
            gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
            h = h + gate @ w[p + "mlp.down_proj.weight"].T
            if b and i in ends:
                q_ = f"iota.boundary.{ends[i]}."
                y = h[..., :b] + rms(h, w[q_ + "down_norm.weight"], eps) @ w[q_ + "down.weight"].T
                h = torch.nn.functional.pad(y, (0, d - b)) + rms(y, w[q_ + "up_norm.weight"], eps) @ w[q_ + "up.weight"].T
        # A tied model's LM head is its embedding (tie_word_embeddings: no lm_head.weight).
        head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
        logits = rms(h, w["model.norm.weight"], eps) @ head.T
    with open(out_path, "w") as f:
        json.dump(logits.tolist(), f)


if __name__ == "__main__":
    main()
