"""Logits of an exported model as Hugging Face `transformers` computes them.

Usage: hf_logits.py <model dir> <tokens.json> <out.json>

Loads `<model dir>` (written by `iota-p2p export`) with `LlamaForCausalLM.from_pretrained`,
runs the token batch of `tokens.json` (a list of equal-length lists of bytes 0..255) in
float32 on the CPU and writes the logits, nested as [batch][position][256], to `out.json`.
The export test compares them with the Rust model's.
"""

import json
import sys

import torch
from transformers import LlamaForCausalLM


def main() -> None:
    model_dir, tokens_path, out_path = sys.argv[1:4]
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    with open(tokens_path) as f:
        tokens = torch.tensor(json.load(f), dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    with open(out_path, "w") as f:
        json.dump(logits.tolist(), f)


if __name__ == "__main__":
    main()
