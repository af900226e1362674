"""Tokenizers loaded once per worker process, keyed by the digest of their file.

A worker builds a converter per run it serves; keying by contents (not by URL) keeps
a tokenizer's warm word cache across them and never confuses two files of one name.
Errors are ``ConfigError``s naming the file, raised at plan time by the job's check.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fleet.job import ConfigError, Opener

from .tokenization import BertTokenizer, VocabError

_CACHE: dict[tuple, Any] = {}


def read_option_file(option: str, url: str, opener: Opener) -> bytes:
    """A file an option names (``vocab_file=...``), or a ConfigError naming option and file."""
    try:
        return opener(url)
    except Exception as e:  # the opener's errors differ by store; all mean "cannot read it"
        raise ConfigError(f"cannot read {option} {url}: {e}") from None


def bert_tokenizer(vocab_file: str, do_lower_case: bool, opener: Opener) -> BertTokenizer:
    """BERT's WordPiece over a ``vocab.txt``."""
    data = read_option_file("vocab_file", vocab_file, opener)
    key = ("bert", hashlib.sha256(data).hexdigest(), do_lower_case)
    if key not in _CACHE:
        try:
            _CACHE[key] = BertTokenizer.from_bytes(data, vocab_file, do_lower_case=do_lower_case)
        except VocabError as e:
            raise ConfigError(str(e)) from None
    return _CACHE[key]


def json_tokenizer(tokenizer_file: str, opener: Opener):
    """A Hugging Face ``tokenizers`` ``tokenizer.json`` (BPE, byte-level BPE, WordPiece, Unigram)."""
    from tokenizers import Tokenizer

    data = read_option_file("tokenizer_file", tokenizer_file, opener)
    key = ("json", hashlib.sha256(data).hexdigest())
    if key not in _CACHE:
        try:
            _CACHE[key] = Tokenizer.from_str(data.decode("utf-8").removeprefix("\ufeff"))  # (a BOM: as vocab.txt)
        except Exception as e:  # tokenizers raises plain Exceptions; bad UTF-8 a UnicodeDecodeError
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{tokenizer_file}: not a tokenizers tokenizer.json ({first})") from None
    return _CACHE[key]
