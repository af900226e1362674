"""Tokenizers loaded once per worker process, keyed by the digest of their file.

``tokenizer_file`` may be any of three kinds (``file_tokenizer``): a Hugging Face
``tokenizer.json``, a SentencePiece ``.model`` or a tiktoken ``*.tiktoken`` ranks file. The kind
comes from the file's name, and its first bytes where the name does not tell (Llama 3's
tiktoken file is called ``tokenizer.model``), or from the job's option.

A worker builds a converter per run it serves; keying by contents (not by URL) keeps
a tokenizer's warm word cache across them and never confuses two files of one name.
Errors are ``ConfigError``s naming the file, raised at plan time by the job's check.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fleet.job import ConfigError, Opener

from .tiktoken_file import encoding, looks_like_ranks
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


TOKENIZER_KINDS = ("auto", "json", "sentencepiece", "tiktoken")


def tokenizer_kind(name: str, data: bytes, kind: str = "auto") -> str:
    """json | sentencepiece | tiktoken: ``kind`` unless auto, else by the name's ending, else by
    the first bytes (``{``: JSON; ``base64 rank`` lines: tiktoken; else a SentencePiece protobuf)."""
    if kind != "auto":
        return kind
    base = name.rsplit("/", 1)[-1].lower()
    if base.endswith(".json"):
        return "json"
    if base.endswith(".tiktoken") or looks_like_ranks(data):
        return "tiktoken"
    if base.endswith(".model") or not data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "sentencepiece"
    return "json"


def file_tokenizer(
    tokenizer_file: str,
    opener: Opener,
    kind: str = "auto",
    tiktoken_pattern: str = "",
    tiktoken_special_tokens: str = "",
) -> tuple[str, Any]:
    """``(kind, tokenizer)`` for ``tokenizer_file``: a ``tokenizers.Tokenizer``, a
    ``sentencepiece.SentencePieceProcessor`` or a ``tiktoken.Encoding`` (the tiktoken options
    apply to that kind only)."""
    data = read_option_file("tokenizer_file", tokenizer_file, opener)
    kind = tokenizer_kind(tokenizer_file, data, kind)
    digest = hashlib.sha256(data).hexdigest()
    if kind == "json":
        return kind, _json(data, digest, tokenizer_file)
    if kind == "sentencepiece":
        return kind, _sentencepiece(data, digest, tokenizer_file)
    key = ("tiktoken", digest, tiktoken_pattern, tiktoken_special_tokens)
    if key not in _CACHE:
        _CACHE[key] = encoding(data, digest, tokenizer_file, tiktoken_pattern, tiktoken_special_tokens)
    return kind, _CACHE[key]


def _sentencepiece(data: bytes, digest: str, source: str):
    import sentencepiece

    key = ("sentencepiece", digest)
    if key not in _CACHE:
        sp = sentencepiece.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(data)
        except Exception as e:  # RuntimeError or OSError from the C++ parser, by version
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{source}: not a SentencePiece model ({first})") from None
        if sp.get_piece_size() == 0:
            raise ConfigError(f"{source}: not a SentencePiece model (no pieces)")
        _CACHE[key] = sp
    return _CACHE[key]


def _json(data: bytes, digest: str, tokenizer_file: str):
    from tokenizers import Tokenizer

    key = ("json", digest)
    if key not in _CACHE:
        try:
            _CACHE[key] = Tokenizer.from_str(data.decode("utf-8").removeprefix("\ufeff"))  # (a BOM: as vocab.txt)
        except Exception as e:  # tokenizers raises plain Exceptions; bad UTF-8 a UnicodeDecodeError
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{tokenizer_file}: not a tokenizers tokenizer.json ({first})") from None
    return _CACHE[key]
