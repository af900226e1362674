"""A ``tiktoken`` encoding built from the bytes of a ``*.tiktoken`` ranks file, with no network.

``tiktoken.get_encoding`` downloads its files; a worker must tokenize with exactly the file the
run pinned (``tokenizer_file``'s sha256 in run.json), so the encoding is built here from that
file's bytes: one line per token, ``base64(token bytes) SPACE rank``. The file holds neither
the split pattern nor the special tokens, so they come from options, or from the table below
when the file is one of OpenAI's published encodings (known by its sha256, as tiktoken itself
checks them); for any other file the pattern defaults to cl100k_base's and the special tokens
must be named (``tiktoken_special_tokens``), since the end-of-document token must exist.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from fleet.job import ConfigError

R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
DEFAULT_PATTERN = CL100K_PATTERN


@dataclass(frozen=True)
class KnownEncoding:
    name: str
    pattern: str
    special_tokens: dict[str, int]


_CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
KNOWN = {  # sha256 of the file -> what tiktoken_ext.openai_public gives it
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930": KnownEncoding(
        "r50k_base", R50K_PATTERN, {"<|endoftext|>": 50256}
    ),
    "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069": KnownEncoding(
        "p50k_base", R50K_PATTERN, {"<|endoftext|>": 50256}
    ),
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7": KnownEncoding(
        "cl100k_base", CL100K_PATTERN, _CL100K_SPECIAL
    ),
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d": KnownEncoding(
        "o200k_base", O200K_PATTERN, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
    ),
}


def looks_like_ranks(data: bytes) -> bool:
    """Whether the file's first line is ``base64 SPACE number`` (a ranks file by any name: Llama 3
    ships its tiktoken file as ``tokenizer.model``)."""
    first = data[: data.find(b"\n")] if b"\n" in data[:4096] else data[:4096]
    token, _, rank = first.strip().partition(b" ")
    return bool(token) and rank.isdigit() and _b64(token) is not None


def _b64(token: bytes) -> bytes | None:
    try:
        return base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return None


def parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """The ranks file's {token bytes: rank}; a ConfigError naming the file and the first bad line."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        token, _, rank = line.strip().partition(b" ")
        decoded = _b64(token)
        if decoded is None or not rank.isdigit():
            raise ConfigError(
                f"{source}: line {number} is not 'base64-token rank' as a .tiktoken file's lines are: {line[:60]!r}"
            )
        if decoded in ranks:
            raise ConfigError(f"{source}: line {number}: token {token.decode()} appears twice")
        ranks[decoded] = int(rank)
    if not ranks:
        raise ConfigError(f"{source}: an empty .tiktoken ranks file")
    if len(set(ranks.values())) != len(ranks):
        raise ConfigError(f"{source}: two tokens have the same rank")
    return ranks


def parse_special_tokens(value: str) -> dict[str, int]:
    """``tiktoken_special_tokens``: ``<|endoftext|>=100257,<|fim_prefix|>=100258`` -> a dict."""
    tokens: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        token, sep, number = part.rpartition("=")
        if not sep or not token or not number.strip().isdigit():
            raise ConfigError(f"option tiktoken_special_tokens: {part!r} is not TOKEN=ID (e.g. <|endoftext|>=100257)")
        tokens[token] = int(number)
    return tokens


def encoding(data: bytes, digest: str, source: str, pattern: str, special_tokens: str):
    """The ``tiktoken.Encoding`` of a ranks file: the options' pattern and special tokens, else the
    known encoding's, else cl100k_base's pattern and no special tokens."""
    import tiktoken

    known = KNOWN.get(digest)
    ranks = parse_ranks(data, source)
    specials = parse_special_tokens(special_tokens) if special_tokens else dict(known.special_tokens if known else {})
    used = set(ranks.values())
    clash = sorted(t for t, i in specials.items() if i in used)
    if clash:
        raise ConfigError(f"option tiktoken_special_tokens: {clash[0]!r} has the id of a token of {source}")
    try:
        return tiktoken.Encoding(
            known.name if known else source.rsplit("/", 1)[-1],
            pat_str=pattern or (known.pattern if known else DEFAULT_PATTERN),
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
    except Exception as e:  # a bad regex (the Rust core's error), or ids tiktoken refuses
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        option = "tiktoken_pattern" if pattern else "tokenizer_file"
        raise ConfigError(f"option {option}: tiktoken refuses {source} with it ({first})") from None
