"""Train a BERT WordPiece vocab with Hugging Face ``tokenizers``.

``limit_alphabet`` defaults to 10000: the trainer's own default (1000) keeps
too few characters for Chinese, leaving about 9% of it as ``[UNK]``.

``size`` is a bound: the trainer always keeps the special tokens and every character
it keeps (alone and as a ``##`` piece), whatever ``vocab_size`` says, so a size below
that is refused (``VocabTooSmall``, with the size that fits) rather than exceeded, or
met by cutting characters, which would turn their text into ``[UNK]`` unseen.

``size`` is a bound from above only: the trainer (BPE's loop, kept by WordPiece) stops merging
when the most frequent pair of pieces left is seen fewer than ``min_frequency`` times, or when
no pair is left because every word of the corpus is a token. A small corpus meets one of the
two first (the sample corpus in ``corpus/`` gives about 10,100 of 21,128 tokens: the pairs left
are each seen once); ``words_in_pieces`` tells which it was.
"""

from __future__ import annotations

from itertools import islice
from typing import Iterable, Iterator

from .tokenization import SPECIAL_TOKENS

MIN_SIZE = len(SPECIAL_TOKENS) + 1  # the special tokens and one character
MAX_SIZE = 1 << 21  # far above any WordPiece vocab; much larger sizes crash the trainer (it allocates for them)


class VocabTooSmall(ValueError):
    """The corpus needs more tokens than the size allows (the special tokens and the alphabet)."""

    def __init__(self, size: int, needed: int):
        super().__init__(f"size {size}: this corpus needs at least {needed} tokens")
        self.size, self.needed = size, needed


def check_options(size: int, limit_alphabet: int, min_frequency: int) -> str | None:
    """What is wrong with the trainer's options (the Rust trainer panics or overflows on them), or None."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        return f"size {size}: give {MIN_SIZE} (the {len(SPECIAL_TOKENS)} special tokens and a character) to {MAX_SIZE}"
    if not 1 <= limit_alphabet <= 0x110000:
        return f"limit_alphabet {limit_alphabet}: give 1 to {0x110000} (characters kept)"
    if not 0 <= min_frequency < 1 << 63:
        return f"min_frequency {min_frequency}: give 0 or more"
    return None


def train_vocab(
    texts: Iterable[str],
    size: int = 21128,
    *,
    lowercase: bool = True,
    limit_alphabet: int = 10000,
    min_frequency: int = 2,
) -> list[str]:
    """Tokens in id order: the special tokens first ([PAD] [UNK] [CLS] [SEP] [MASK] = 0..4).
    Raises ValueError on options ``check_options`` refuses, VocabTooSmall when the corpus needs more than ``size``."""
    problem = check_options(size, limit_alphabet, min_frequency)
    if problem:
        raise ValueError(problem)
    from tokenizers import BertWordPieceTokenizer  # heavy-ish; only the vocab command needs it

    tokenizer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    tokenizer.train_from_iterator(
        texts,
        vocab_size=size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [token for token, _ in by_id]
    assert tokens[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS), tokens[:5]
    if len(tokens) > size:
        raise VocabTooSmall(size, len(tokens))
    return tokens


def write_vocab(tokens: Iterable[str], path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(token + "\n" for token in tokens)


def words_in_pieces(tokens: list[str], texts: Iterable[str], lowercase: bool = True) -> int:
    """How many distinct words of the texts the vocab ``tokens`` holds only in pieces, split as
    the trainer splits them. None: every word is a token, so the trainer had no pair left to
    merge; some: it stopped at ``min_frequency``, each pair still in them seen fewer times. (A
    word of characters the alphabet left out is one ``[UNK]``, not pieces.)"""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(
        {t: i for i, t in enumerate(tokens)}, clean_text=True, handle_chinese_chars=True, lowercase=lowercase
    )
    split: set[str] = set()
    lines: Iterator[str] = iter(texts)
    while batch := list(islice(lines, 10_000)):
        for line, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
            pieces: dict[int, int] = {}
            for word in encoding.word_ids:
                if word is not None:
                    pieces[word] = pieces.get(word, 0) + 1
            for word, count in pieces.items():
                if count > 1:
                    start, end = encoding.word_to_chars(word)
                    split.add(line[start:end])
    return len(split)
