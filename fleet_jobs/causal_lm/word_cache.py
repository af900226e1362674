"""Byte-level BPE through a word cache: a ``tokenizer.json``'s exact ids, most words looked up.

A GPT-2 style byte-level BPE with no normalizer cuts text with one regex (``GPT2_PATTERN``, the
``ByteLevel`` pre-tokenizer's) and gives each piece to the model alone, so a piece's ids are the
same wherever it occurs. Corpora are Zipfian: most pieces were seen before, and a dict lookup
plus a numpy gather costs far less than the library's per-document pipeline (bench_lm_tokenizers:
the regex is most of what is left).

Exact, or not used:

- ``word_cache(tokenizer)`` gives a cache only for the configuration proven equal: no normalizer,
  a ``ByteLevel`` pre-tokenizer with its regex and no prefix space, a BPE model without dropout,
  no truncation or padding, a post-processor that adds nothing without special tokens (none or
  ``ByteLevel``). Anything else: None, and the library encodes every document.
- The split. Here the ``regex`` module runs the pattern, there Oniguruma; their Unicode tables
  differ (17,480 code points between regex 2026.11 and tokenizers 0.23, all newer letters). The
  pattern sees a character only through its class (letter, number, whitespace, other; the
  literals are ASCII), so each distinct character of the text is checked once per process: a
  probe string in which each class splits differently (``_probe``), split by both engines. A
  document with a character classed differently, or one the library cannot take (a lone
  surrogate), is encoded by the library, as is one that holds an added token's text (the
  library matches those before splitting).
- A new piece's ids come from the model itself (``Tokenizer.model.tokenize``) on its bytes as
  the ``ByteLevel`` alphabet spells them: the pipeline's own last step.

tests/test_lm_speedups.py checks ids against ``Tokenizer.encode`` on random Unicode text.
"""

from __future__ import annotations

import json
from itertools import chain, repeat
from typing import Sequence

import numpy as np

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MAX_WORDS = 1 << 19  # distinct pieces kept (past it the cache starts over): bounds the memory of web-scale text


def byte_alphabet() -> list[str]:
    """GPT-2's ``bytes_to_unicode``: the character a byte-level BPE spells each byte with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


def word_cache(tokenizer) -> "WordCache | None":
    """A cache for a ``tokenizers.Tokenizer`` whose configuration it reproduces exactly, else None."""
    try:
        import regex
    except ImportError:  # (tiktoken's dependency; without it, the library alone)
        return None
    del regex
    spec = json.loads(tokenizer.to_str())
    pre, model, post = spec.get("pre_tokenizer") or {}, spec.get("model") or {}, spec.get("post_processor")
    if (
        spec.get("normalizer") is not None
        or spec.get("truncation") is not None
        or spec.get("padding") is not None
        or pre.get("type") != "ByteLevel"
        or pre.get("add_prefix_space")
        or not pre.get("use_regex", True)
        or model.get("type") != "BPE"
        or model.get("dropout") not in (None, 0, 0.0)
        or (post is not None and post.get("type") != "ByteLevel")
    ):
        return None
    added = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    if not all(added):
        return None
    return WordCache(tokenizer, added)


class WordCache:
    """ids of texts, piece by piece: ``encode`` gives them end to end, with each text's count."""

    def __init__(self, tokenizer, added_tokens: Sequence[str]):
        import regex

        self.tokenizer = tokenizer
        self.pattern = regex.compile(GPT2_PATTERN)
        self.added = list(added_tokens)
        self.spelling = dict(enumerate(byte_alphabet()))  # str.translate of a piece's bytes read as Latin-1
        self.checked: set[str] = set()  # characters both engines class alike
        self.differ: set[str] = set()  # characters they do not (or the library refuses): their texts go to it
        self._start_over()

    def _start_over(self) -> None:
        self.index: dict[str, int] = {}  # piece -> its row
        self.starts = np.zeros(1, np.int64)  # row k's ids are table[starts[k]:starts[k + 1]]
        self.table = np.zeros(0, np.int32)

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every text's ids end to end as int32, each text's number of ids): as the library's
        ``encode_batch(texts, add_special_tokens=False)``."""
        joined = "".join(texts)
        bad = self._check(set(joined))
        if bad or any(token in joined for token in self.added):
            library = [any(c in text for c in bad) or any(t in text for t in self.added) for text in texts]
            return self._mixed(texts, library)
        return self._cached(texts)

    def _cached(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        findall = self.pattern.findall
        pieces = list(map(findall, texts))
        per_text = np.fromiter(map(len, pieces), np.int64, len(pieces))
        flat = list(chain.from_iterable(pieces))
        if len(self.index) > MAX_WORDS:
            self._start_over()
        rows = np.fromiter(map(self.index.get, flat, repeat(-1)), np.int64, len(flat))
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            self._learn(dict.fromkeys(flat[i] for i in missing.tolist()))
            index = self.index
            rows[missing] = [index[flat[i]] for i in missing.tolist()]
        first, lengths = self.starts[rows], np.diff(self.starts)[rows]
        total = int(lengths.sum())
        ends = np.cumsum(lengths)
        at = np.arange(total) + np.repeat(first - (ends - lengths), lengths)
        ids = self.table[at]
        piece_ends = np.cumsum(per_text)
        ids_ends = np.concatenate([[0], ends])[piece_ends]
        return ids, np.diff(ids_ends, prepend=0)

    def _learn(self, pieces: dict[str, None]) -> None:
        """Rows for new pieces: the model's ids of each, from its bytes in the byte alphabet."""
        tokenize, spell = self.tokenizer.model.tokenize, self.spelling
        ids = [[t.id for t in tokenize(piece.encode().decode("latin-1").translate(spell))] for piece in pieces]
        for k, piece in enumerate(pieces, len(self.index)):
            self.index[piece] = k
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        self.starts = np.concatenate([self.starts, self.starts[-1] + np.cumsum(lengths)])
        self.table = np.concatenate([self.table, np.fromiter(chain.from_iterable(ids), np.int32, int(lengths.sum()))])

    def _mixed(self, texts: Sequence[str], library: list[bool]) -> tuple[np.ndarray, np.ndarray]:
        """Texts the cache may not take go to the library; the rest through the cache, in order."""
        mine = [t for t, lib in zip(texts, library) if not lib]
        ids, counts = self._cached(mine) if mine else (np.zeros(0, np.int32), np.zeros(0, np.int64))
        encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        theirs = iter(encode_batch([t for t, lib in zip(texts, library) if lib], add_special_tokens=False))
        cached = iter(np.split(ids, np.cumsum(counts)[:-1]) if len(counts) else [])
        parts = [np.asarray(next(theirs).ids, np.int32) if lib else next(cached) for lib in library]
        out_counts = np.fromiter(map(len, parts), np.int64, len(parts))
        return (np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)), out_counts

    def _check(self, chars: set[str]) -> set[str]:
        """Of these characters, those the two engines class differently (each checked once)."""
        new = sorted(chars - self.checked - self.differ)
        if new:
            self._verify(new)
        return chars & self.differ

    def _verify(self, chars: list[str]) -> None:
        if self._agree("".join(map(_probe, chars))):
            self.checked.update(chars)
        elif len(chars) == 1:
            self.differ.update(chars)
        else:
            half = len(chars) // 2
            self._verify(chars[:half])
            self._verify(chars[half:])

    def _agree(self, text: str) -> bool:
        try:
            theirs = [span for _, span in self.tokenizer.pre_tokenizer.pre_tokenize_str(text)]
        except Exception:  # a lone surrogate: the library takes no such text (and will say so itself)
            return False
        return theirs == [m.span() for m in self.pattern.finditer(text)]


def _probe(c: str) -> str:
    """A text in which ``c`` splits differently by class: after a letter it joins a letter run,
    after a digit a number run, after ``!`` a punctuation run, and as whitespace none of them."""
    return f"a{c}1{c}!{c} {c}\n{c}  "
