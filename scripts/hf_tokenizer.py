"""An exported model and its tokenizer as Hugging Face `transformers` loads and runs them.

Usage: hf_tokenizer.py <model dir> <text.json> <out.json>

Loads `<model dir>` (written by `iota-p2p export`) with `AutoTokenizer.from_pretrained` and
`AutoModelForCausalLM.from_pretrained`, encodes the text of `text.json` (a JSON string), runs
the model on its ids in float32 on the CPU, and continues them greedily with `generate` for
up to 8 new tokens (fewer if it draws the end-of-document token). Writes to `out.json`: the tokenizer's class, whether it is a fast one, its
`eos_token` and `eos_token_id`, the ids, the logits nested as [position][vocab], the
generated ids and their decoding. The export test compares them with the Rust tokenizer and
model.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    model_dir, text_path, out_path = sys.argv[1:4]
    torch.manual_seed(0)
    with open(text_path) as f:
        text = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        batch = torch.tensor([ids], dtype=torch.long)
        logits = model(input_ids=batch).logits[0]
        out = model.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id or 0,
        )
    generated = out[0, len(ids) :].tolist()
    result = {
        "class": type(tokenizer).__name__,
        "is_fast": tokenizer.is_fast,
        "eos_token": tokenizer.eos_token,
        "eos_token_id": tokenizer.eos_token_id,
        "ids": ids,
        "logits": logits.tolist(),
        "generated": generated,
        "decoded": tokenizer.decode(generated),
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
