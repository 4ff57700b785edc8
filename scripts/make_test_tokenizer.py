#!/usr/bin/env python3
"""Writes data/tokenizers/shakespeare-bpe-4096.json: a small byte-level BPE tokenizer for tests.

A GPT-2-style tokenizer (ByteLevel pre-tokenizer with GPT-2's regex and no prefix space, BPE,
ByteLevel decoder) with a vocabulary of 4096 tokens: the end-of-document token `<|endoftext|>`
(id 0), the 256 byte symbols, and the 3839 merges the Hugging Face `tokenizers` BPE trainer
learns from the training split of the bundled corpus (`data/shakespeare.txt.zst`, its first
95 %, as `training::data::Corpus` splits it: the held-out plays stay unseen). Each speech (the
blocks between blank lines) is one training document.

The trainer is deterministic, so every run writes the same bytes (the script prints their
sha256, to check a rerun against data/PROVENANCE.md).

Usage: .venv/bin/python scripts/make_test_tokenizer.py   (from the repository root)
"""
import hashlib
import os
import subprocess

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "shakespeare.txt.zst")
OUT = os.path.join(ROOT, "data", "tokenizers", "shakespeare-bpe-4096.json")
VOCAB = 4096
END_OF_DOCUMENT = "<|endoftext|>"


def training_text() -> str:
    """The first 95 % of the corpus's bytes (`len - len / 20`, the loader's split)."""
    raw = subprocess.run(["zstd", "-dc", CORPUS], check=True, capture_output=True).stdout
    split = len(raw) - len(raw) // 20
    # The split may fall inside a multi-byte character: drop its partial bytes.
    return raw[:split].decode("utf-8", errors="ignore")


def main() -> None:
    documents = [d for d in training_text().split("\n\n") if d.strip()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[END_OF_DOCUMENT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == VOCAB
    assert tokenizer.token_to_id(END_OF_DOCUMENT) == 0
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    text = tokenizer.to_str(pretty=True) + "\n"
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    data = text.encode("utf-8")
    print(
        f"wrote {os.path.relpath(OUT, ROOT)}: {len(data)} bytes, vocabulary {VOCAB}, "
        f"{len(documents)} documents, tokenizers {tokenizers.__version__}, "
        f"sha256 {hashlib.sha256(data).hexdigest()}"
    )


if __name__ == "__main__":
    main()
