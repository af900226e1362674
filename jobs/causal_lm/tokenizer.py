"""Documents -> token ids, with a BERT ``vocab.txt`` or a ``tokenizers`` ``tokenizer.json``.

A document's text is its lines joined by ``\\n``, so a byte-level BPE sees the line
breaks it was trained with; BERT's WordPiece treats them as spaces anyway. Special
tokens are not added: the block cutter adds the end-of-document id itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from fleet.job import ConfigError
from jobs.text.groups import line_groups

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")  # eod_token="" takes the first in the vocab
PAD_CANDIDATES = ("[PAD]", "<pad>", "<|padding|>")  # else padding uses the end-of-document id
# A BERT vocab tokenizes a document this many characters of lines at a time, into int32 arrays: as
# Python lists of ints a part of 4 Mi Chinese characters took about 150 MB.
LINE_GROUP_CHARS = 1 << 18


@dataclass(frozen=True)
class DocumentTokenizer:
    encode: Callable[[Sequence[list[str]]], list[Sequence[int]]]  # documents (lists of lines) -> ids each
    eod_id: int
    pad_id: int
    vocab_size: int


def _special(vocab: dict[str, int], name: str, option: str, wanted: str, candidates: Sequence[str],
             source: str) -> int | None:
    if wanted:
        if wanted not in vocab:
            raise ConfigError(f"option {option}: {wanted!r} is not in {source}")
        return vocab[wanted]
    for token in candidates:
        if token in vocab:
            return vocab[token]
    return None


def from_bert(tokenizer, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """BERT's WordPiece (``jobs.text.tokenization.BertTokenizer``): [SEP] ends a document by default."""
    vocab = tokenizer.vocab
    eod = _special(vocab, "eod", "eod_token", eod_token, ("[SEP]",), source)
    pad = _special(vocab, "pad", "pad_token", pad_token, PAD_CANDIDATES, source)
    tokenize_flat = tokenizer.tokenize_flat

    def ids(lines: list[str]) -> np.ndarray:
        if sum(map(len, lines)) <= LINE_GROUP_CHARS:
            return tokenize_flat(lines)[0]
        return np.concatenate([tokenize_flat(group)[0] for group in line_groups(lines, LINE_GROUP_CHARS)])

    def encode(documents: Sequence[list[str]]) -> list[Sequence[int]]:
        return [ids(lines) for lines in documents]

    # (the vocab's lines, not its distinct tokens: a repeated token leaves its first id unused)
    return DocumentTokenizer(encode, eod, eod if pad is None else pad, max(vocab.values()) + 1)


def from_json(tokenizer, source: str, eod_token: str, pad_token: str) -> DocumentTokenizer:
    """A ``tokenizers.Tokenizer``; ``encode_batch`` tokenizes the documents on all cores, in order."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    eod = _special(vocab, "eod", "eod_token", eod_token, EOD_CANDIDATES, source)
    if eod is None:
        raise ConfigError(f"{source}: no end-of-document token ({', '.join(EOD_CANDIDATES)}); "
                          "name one with eod_token=...")
    pad = _special(vocab, "pad", "pad_token", pad_token, PAD_CANDIDATES, source)

    # The same ids without offsets (tokenizers >= 0.20): an Encoding of a 4 Mi-character part
    # took 860 MB at its peak with them, 718 without.
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def encode(documents: Sequence[list[str]]) -> list[list[int]]:
        encodings = encode_batch(["\n".join(lines) for lines in documents], add_special_tokens=False)
        return [e.ids for e in encodings]

    return DocumentTokenizer(encode, eod, eod if pad is None else pad, tokenizer.get_vocab_size(with_added_tokens=True))
