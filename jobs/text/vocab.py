"""Train a BERT WordPiece vocab with Hugging Face ``tokenizers``.

``limit_alphabet`` defaults to 10000: the trainer's own default (1000) keeps
too few characters for Chinese, leaving about 9% of it as ``[UNK]``.
"""

from __future__ import annotations

from typing import Iterable

from .tokenization import SPECIAL_TOKENS


def train_vocab(
    texts: Iterable[str],
    size: int = 21128,
    *,
    lowercase: bool = True,
    limit_alphabet: int = 10000,
    min_frequency: int = 2,
) -> list[str]:
    """Tokens in id order: the special tokens first ([PAD] [UNK] [CLS] [SEP] [MASK] = 0..4)."""
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
    return tokens


def write_vocab(tokens: Iterable[str], path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(token + "\n" for token in tokens)
