"""Small tokenizers trained on a test's documents (lists of lines), saved where a job option can name them."""

from __future__ import annotations

import os

from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab


def bpe_json(documents, folder: str, vocab_size: int) -> str:
    """A byte-level BPE (GPT-2's kind) with <|endoftext|>, as a tokenizer.json."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        ("\n".join(d) for d in documents), vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False
    )
    path = os.path.join(folder, "tokenizer.json")
    tokenizer.save(path)
    return path


def wordpiece_vocab(documents, folder: str, size: int) -> str:
    """A BERT vocab.txt."""
    path = os.path.join(folder, "vocab.txt")
    write_vocab(train_vocab((line for d in documents for line in d), size), path)
    return path
